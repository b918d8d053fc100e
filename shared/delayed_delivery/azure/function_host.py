"""The Azure function app, defined once (``create_app``), and what its triggers call: the cached dispatcher host.

``function_app.py`` is ``app = create_app()``, both in ``functions/azure`` (for ``func start`` there) and in
``app_files`` (copied to the root of the published folder). Importing this module imports only
``azure.functions``; settings are read and clients built on the first run.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from functools import cache
from typing import TYPE_CHECKING

import azure.functions as func

if TYPE_CHECKING:
    from .runner import AzureDispatcherHost

__all__ = [
    "CENSUS_SCHEDULE",
    "ENV_EXAMPLE_CONSUMER_QUEUE",
    "ENV_PENDING_CENSUS",
    "ENV_SCHEDULES",
    "EXAMPLE_CONSUMER_CONNECTION",
    "SCHEDULE",
    "SCHEDULES_SCHEDULE",
    "census_pending_messages",
    "consume_example_message",
    "create_app",
    "dispatch_delayed_messages",
    "host",
    "host_from_settings",
    "materialize_schedules",
    "register_optional",
    "use_host",
]

#: Every minute, at second 0 (NCRONTAB: second minute hour day month day-of-week).
SCHEDULE = "0 * * * * *"
#: App setting naming the queue the example consumer reads; unset (the default), no consumer is registered.
ENV_EXAMPLE_CONSUMER_QUEUE = "DELAYED_DELIVERY_EXAMPLE_CONSUMER_QUEUE"
#: The queue trigger's connection: ``DelayedDeliveryQueues__queueServiceUri`` (identity) or a connection string.
EXAMPLE_CONSUMER_CONNECTION = "DelayedDeliveryQueues"
#: App setting that, ``true``, adds the census timer: pending rows by due hour logged for the workbook.
ENV_PENDING_CENSUS = "DELAYED_DELIVERY_PENDING_CENSUS"
#: Every 15 minutes, at second 30 (away from the dispatcher's second 0).
CENSUS_SCHEDULE = "30 */15 * * * *"
#: App setting that, ``true``, adds the schedule timer (``azure/schedules``): recurring schedules materialized.
ENV_SCHEDULES = "DELAYED_DELIVERY_SCHEDULES"
#: Every minute, at second 20 (away from the dispatcher's second 0 and the census's 30).
SCHEDULES_SCHEDULE = "20 * * * * *"

_prepared: AzureDispatcherHost | None = None


def use_host(prepared: AzureDispatcherHost | None) -> None:
    """Run the timer with a prepared host (local harnesses, the demo); ``None`` goes back to app settings."""
    global _prepared
    _prepared = prepared


def host() -> AzureDispatcherHost:
    """The dispatcher host: a prepared one if given, else the one built from app settings."""
    return _prepared or host_from_settings()


@cache
def host_from_settings() -> AzureDispatcherHost:
    """The dispatcher host for this worker, built from app settings on first use."""
    from .config import AzureDelayedDeliveryConfig
    from .runner import AzureDispatcherHost
    from .telemetry import configure_telemetry

    configure_telemetry(os.environ)
    return AzureDispatcherHost(AzureDelayedDeliveryConfig.from_env(os.environ))


def create_app(env: Mapping[str, str] | None = None) -> func.FunctionApp:
    """The function app: the dispatcher's timer every minute, plus the triggers the app settings ask for."""
    app = func.FunctionApp()
    register_optional(app, env)
    app.timer_trigger(schedule=SCHEDULE, arg_name="timer", run_on_startup=False, use_monitor=True)(
        dispatch_delayed_messages
    )
    return app


def dispatch_delayed_messages(timer: func.TimerRequest) -> None:
    """Dispatch due delayed messages until this run's time budget ends."""
    host().run()


def consume_example_message(msg: func.QueueMessage) -> None:
    """The example consumer: read the delivered message and log its lateness (functions/azure/consumer_app.py)."""
    from .receive import delivered_from_queue_message, observe_lateness
    from .telemetry import configure_telemetry

    configure_telemetry(os.environ)  # once per worker: Application Insights gets the log line and the histogram
    observe_lateness(delivered_from_queue_message(msg))


def materialize_schedules(timer: func.TimerRequest) -> None:
    """Write the recurring schedules' occurrences due within the lead as rows of the delays table."""
    from .schedules.timer import ScheduleMetrics, timer_for_host

    timer_for_host(host(), os.environ, metrics_sink=ScheduleMetrics()).run()


def census_pending_messages(timer: func.TimerRequest) -> None:
    """Log the delays table's pending rows by due hour and its oldest overdue row (delayed_delivery.azure.census)."""
    from .census import census_from_settings

    census_from_settings(os.environ)


def register_optional(app: func.FunctionApp, env: Mapping[str, str] | None = None) -> None:
    """Add the triggers the app settings ask for: the example consumer, the pending census, the schedule timer."""
    settings = os.environ if env is None else env
    if settings.get(ENV_EXAMPLE_CONSUMER_QUEUE, "").strip():
        app.queue_trigger(
            arg_name="msg", queue_name=f"%{ENV_EXAMPLE_CONSUMER_QUEUE}%", connection=EXAMPLE_CONSUMER_CONNECTION
        )(consume_example_message)
    if settings.get(ENV_PENDING_CENSUS, "").strip().lower() == "true":
        app.timer_trigger(schedule=CENSUS_SCHEDULE, arg_name="timer", run_on_startup=False)(census_pending_messages)
    if settings.get(ENV_SCHEDULES, "").strip().lower() == "true":
        app.timer_trigger(schedule=SCHEDULES_SCHEDULE, arg_name="timer", run_on_startup=False)(materialize_schedules)
