"""Azure Functions (Python v2 model): a timer that runs the delayed-message dispatcher every minute.

The app settings may add the example consumer and the pending census (``register_optional``). Nothing is read and
no SDK client is built until a trigger runs (``delayed_delivery.azure.function_host``). This file is the one
source: ``packaging`` copies it to the root of the folder it builds, and ``functions/azure/function_app.py`` (for
``func start`` there) makes ``import function_app`` this module.
"""

from __future__ import annotations

import azure.functions as func

from delayed_delivery.azure.function_host import (  # re-exported for harnesses and the demo
    CENSUS_SCHEDULE,
    ENV_EXAMPLE_CONSUMER_QUEUE,
    ENV_PENDING_CENSUS,
    EXAMPLE_CONSUMER_CONNECTION,
    SCHEDULE,
    consume_example_message,
    host,
    register_optional,
    use_host,
)

__all__ = [
    "CENSUS_SCHEDULE",
    "ENV_EXAMPLE_CONSUMER_QUEUE",
    "ENV_PENDING_CENSUS",
    "EXAMPLE_CONSUMER_CONNECTION",
    "app",
    "consume_example_message",
    "dispatch_delayed_messages",
    "host",
    "use_host",
]

app = func.FunctionApp()
register_optional(app)  # functions are found by importing this module: the optional ones follow two app settings


@app.timer_trigger(schedule=SCHEDULE, arg_name="timer", run_on_startup=False, use_monitor=True)
def dispatch_delayed_messages(timer: func.TimerRequest) -> None:
    """Dispatch due delayed messages until this run's time budget ends."""
    host().run()
