"""Azure Functions (Python v2 model): a timer that runs the delayed-message dispatcher every minute, and, when
the app setting ``DELAYED_DELIVERY_EXAMPLE_CONSUMER_QUEUE`` names a queue, the example consumer reading it.

Nothing is read from the environment and no SDK client is built at import time: ``host()`` does that on
the first run and caches the result for the life of the worker. The storage SDKs are imported then too, so
the worker's start-up (which imports this module to find its functions) pays only for ``azure.functions``.
This file is the one source: ``packaging`` copies it to the root of the folder it builds, and
``functions/azure/function_app.py`` (for ``func start`` there) makes ``import function_app`` this module.
"""

from __future__ import annotations

import os
from functools import cache
from typing import TYPE_CHECKING

import azure.functions as func

if TYPE_CHECKING:
    from delayed_delivery.azure.runner import AzureDispatcherHost

app = func.FunctionApp()

#: Every minute, at second 0 (NCRONTAB: second minute hour day month day-of-week).
SCHEDULE = "0 * * * * *"


_prepared: AzureDispatcherHost | None = None


def use_host(prepared: AzureDispatcherHost | None) -> None:
    """Run the timer with a prepared host (local harnesses, the demo); ``None`` goes back to app settings."""
    global _prepared
    _prepared = prepared


def host() -> AzureDispatcherHost:
    """The dispatcher host: a prepared one if given, else the one built from app settings."""
    return _prepared or _host_from_settings()


@cache
def _host_from_settings() -> AzureDispatcherHost:
    """The dispatcher host for this worker, built from app settings on first use."""
    from delayed_delivery.azure.config import AzureDelayedDeliveryConfig
    from delayed_delivery.azure.runner import AzureDispatcherHost
    from delayed_delivery.azure.telemetry import configure_telemetry

    configure_telemetry(os.environ)
    return AzureDispatcherHost(AzureDelayedDeliveryConfig.from_env(os.environ))


#: App setting naming the queue the example consumer reads; unset (the default), no consumer is registered.
ENV_EXAMPLE_CONSUMER_QUEUE = "DELAYED_DELIVERY_EXAMPLE_CONSUMER_QUEUE"
#: The queue trigger's connection: ``DelayedDeliveryQueues__queueServiceUri`` (identity) or a connection string.
EXAMPLE_CONSUMER_CONNECTION = "DelayedDeliveryQueues"


def consume_example_message(msg: func.QueueMessage) -> None:
    """The example consumer: read the delivered message and log its lateness (functions/azure/consumer_app.py)."""
    from delayed_delivery.azure.receive import delivered_from_queue_message, observe_lateness
    from delayed_delivery.azure.telemetry import configure_telemetry

    configure_telemetry(os.environ)  # once per worker: Application Insights gets the log line and the histogram
    observe_lateness(delivered_from_queue_message(msg))


# Functions are found by importing this module, so the one optional trigger is decided here, by one app setting.
if os.environ.get(ENV_EXAMPLE_CONSUMER_QUEUE, "").strip():
    app.queue_trigger(
        arg_name="msg", queue_name=f"%{ENV_EXAMPLE_CONSUMER_QUEUE}%", connection=EXAMPLE_CONSUMER_CONNECTION
    )(consume_example_message)


#: App setting that, ``true``, adds the census timer: pending rows by due hour logged for the workbook.
ENV_PENDING_CENSUS = "DELAYED_DELIVERY_PENDING_CENSUS"
#: Every 15 minutes, at second 30 (away from the dispatcher's second 0).
CENSUS_SCHEDULE = "30 */15 * * * *"


def census_pending_messages(timer: func.TimerRequest) -> None:
    """Log the delays table's pending rows by due hour and its oldest overdue row (delayed_delivery.azure.census)."""
    from delayed_delivery.azure.census import census_from_settings

    census_from_settings(os.environ)


if os.environ.get(ENV_PENDING_CENSUS, "").strip().lower() == "true":
    app.timer_trigger(schedule=CENSUS_SCHEDULE, arg_name="timer", run_on_startup=False)(census_pending_messages)


@app.timer_trigger(schedule=SCHEDULE, arg_name="timer", run_on_startup=False, use_monitor=True)
def dispatch_delayed_messages(timer: func.TimerRequest) -> None:
    """Dispatch due delayed messages until this run's time budget ends."""
    host().run()
