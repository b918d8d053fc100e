"""The timer Lambda's handler: Powertools around ``BucketTimer.run`` over the tier runtime, run every minute.

``functions/aws/bucket_timer.py`` (the deployed entry point) builds it once from the environment; tests, the demo
and benchmarks build it with their own clients and clock.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import partial
from typing import TYPE_CHECKING, Any

from aws_lambda_powertools.metrics import MetricUnit

from ... import logfields as lf
from ...clock import Clock
from ..lambda_entry import invocation_deadline
from .config import BucketTierConfig
from .metrics import TIMER_METRICS as METRICS
from .metrics import Failed, guarded, report
from .runtime import TierRuntime, invocation_owner
from .store import S3Client
from .timer import TimerResult

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient
    from mypy_boto3_sqs import SQSClient

__all__ = ["METRICS", "TimerHandler", "build_timer_handler"]

#: ``handler(event, context) -> summary``
TimerHandler = Callable[[Any, Any], dict[str, Any]]
_EVENT_TIMER = "bucket_timer_run"


def _event_problem(event: Any) -> str | None:
    """Why ``event`` is not an EventBridge scheduled event (the run goes ahead anyway: it needs nothing from it)."""
    if not isinstance(event, Mapping):
        return f"the event is a {type(event).__name__}, not an object"
    if event.get("detail-type") not in (None, "Scheduled Event"):
        return f"unexpected detail-type {str(event.get('detail-type'))[:60]!r}"
    return None


def build_timer_handler(
    config: BucketTierConfig | Mapping[str, str] | None = None,
    *,
    s3: S3Client | None = None,
    sqs: SQSClient | None = None,
    dynamodb: DynamoDBClient | None = None,
    clock: Clock | None = None,
    on_result: Callable[[TimerResult], None] | None = None,
) -> TimerHandler:
    """The timer over the tier runtime (``config``: one, or an environment mapping to read; missing clients made)."""
    runtime = TierRuntime.build(config, s3=s3, sqs=sqs, dynamodb=dynamodb, clock=clock)
    tools = runtime.tools

    def counted() -> None:
        tools.metrics.add_metric(name="BucketTimerFailures", unit=MetricUnit.Count, value=1)

    @tools.around
    def entrypoint(event: Any, context: Any) -> dict[str, Any]:
        if (problem := _event_problem(event)) is not None:
            extra = {lf.EVENT: _EVENT_TIMER, lf.REASON: problem}
            tools.logger.warning("not a scheduled event; running anyway", extra=extra)
        run = partial(runtime.timer(invocation_owner(context)).run, invocation_deadline(context))
        result = guarded(run, tools, counted, "timer run failed; the next run starts over", _EVENT_TIMER)
        if isinstance(result, Failed):  # the next run starts over
            return {"ok": False, "reason": result.reason}
        summary = report(result, METRICS, tools, "timer run", {lf.EVENT: _EVENT_TIMER})
        if on_result is not None:
            on_result(result)
        return {"ok": True, **summary}

    return entrypoint
