"""Lambda entry point for the schedule timer (handler ``functions.aws.schedule_timer.handler``).

Wire it to an EventBridge schedule (every minute). Nothing is read or created at import time: the first call reads
the environment (``ScheduleTimerConfig.from_env``, see ``delayed_delivery/aws/schedules/config.py``), makes the
DynamoDB and SQS clients and builds the in-package handler (``delayed_delivery.aws.schedules.handler``).
"""

from __future__ import annotations

from delayed_delivery.aws.lambda_entry import BuiltOnFirstCall
from delayed_delivery.aws.schedules.handler import build_schedule_timer_handler

__all__ = ["handler", "reset"]

#: The Lambda handler; builds (and caches) the in-package handler from the environment on the first call.
handler = BuiltOnFirstCall(build_schedule_timer_handler)
#: Forget the cached handler (tests change the environment between runs).
reset = handler.reset
