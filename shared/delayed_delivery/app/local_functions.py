"""The deployment's functions run here, for ``aws verify --local``: the probe endpoint's requeue function and the
time-bucket tier's ingest and timer functions, behind the local event source, as ``aws requeue --local`` and
``aws tier --local`` run them. Their Powertools output (logs, EMF metrics) is discarded so stdout stays the report's.
"""

from __future__ import annotations

import contextlib
import io
import os
import time
from dataclasses import replace
from typing import Any

from delayed_delivery.aws.config import AwsConfig
from delayed_delivery.aws.verify.target import AwsTarget
from delayed_delivery.testing.aws import LocalEventSourcePoller, LocalLambdaContext

__all__ = ["LocalAwsFunctions"]

#: Seconds between local timer runs (in the cloud: every minute; a run dispatches what is due within its lead).
TIMER_EVERY = 1.0
#: A queue whose last receive came back empty is asked again after this long (Lambda's event source long-polls).
IDLE_POLL_EVERY = 1.0


class _Discard(io.StringIO):
    def write(self, text: str) -> int:
        return len(text)


class LocalAwsFunctions:
    """The ``FunctionHost`` of an emulator: polls the probe's ``-delay.fifo`` and the ingest queue, runs the timer."""

    local = True

    def __init__(self, target: AwsTarget, *, sqs: Any, s3: Any = None, dynamodb: Any = None) -> None:
        self._failures: list[str] = []
        self._pollers: list[LocalEventSourcePoller] = []
        self._timer: Any = None
        self._next_timer = 0.0
        self._next_poll: dict[int, float] = {}
        self.invocations = 0
        self.busy_seconds = 0.0
        self.memory_gb = 0.25
        self._sink = _Discard()
        with contextlib.redirect_stdout(self._sink):  # Powertools prints on set-up too
            self._build(target, sqs, s3, dynamodb)

    def _build(self, target: AwsTarget, sqs: Any, s3: Any, dynamodb: Any) -> None:
        from delayed_delivery.aws.requeue.handler import build_handler

        probe = target.probe
        if probe is not None:
            env = AwsConfig.from_env(os.environ)
            config = replace(
                env,
                settings=replace(target.settings, error_queue=probe.error_queue),
                cancellation_table=target.cancellation_table,
            )
            handler = build_handler(
                config, sqs_client=sqs, dynamodb_client=dynamodb if config.cancellation_table else None
            )
            self._add_poller(sqs, probe.delay_queue, self._counted("requeue", handler))
        if target.tier is not None:
            from delayed_delivery.aws.tier.ingest_handler import build_ingest_handler
            from delayed_delivery.aws.tier.timer_handler import build_timer_handler

            tier = target.tier.config
            ingest = build_ingest_handler(tier, s3=s3, sqs=sqs, on_result=self._ingest_result)
            self._add_poller(sqs, tier.sqs_settings.bucket_ingest_queue, self._counted("ingest", ingest))
            table = dynamodb if tier.cancellation_table else None
            self._timer = build_timer_handler(tier, s3=s3, sqs=sqs, dynamodb=table)

    def _ingest_result(self, result: Any) -> None:
        """Records the ingest keeps for a retry are failures too (its invocation succeeds)."""
        self._failures += [f"ingest: {' '.join(str(reason).split())}" for reason in result.failures.values()]

    def _counted(self, name: str, handler: Any) -> Any:
        def invoke(event: dict[str, Any], context: Any) -> Any:
            started = time.monotonic()
            try:
                return handler(event, context)
            except Exception as exc:  # the poller keeps the records for a retry, as Lambda would
                self._failures.append(f"{name}: {type(exc).__name__}: {' '.join(str(exc).split())}")
                raise
            finally:
                if name == "requeue":
                    self.invocations += 1
                    self.busy_seconds += time.monotonic() - started

        return invoke

    def _add_poller(self, sqs: Any, queue: str, handler: Any) -> None:
        url = sqs.get_queue_url(QueueName=queue)["QueueUrl"]
        arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
        self._pollers.append(LocalEventSourcePoller(sqs, url, arn, handler, wait_seconds=0))

    def run_for(self, seconds: float) -> None:
        """Poll every queue and run the timer when due, until ``seconds`` have passed."""
        deadline = time.monotonic() + seconds
        with contextlib.redirect_stdout(self._sink):
            while True:
                worked = sum(self._poll(i, p) for i, p in enumerate(self._pollers))
                if self._timer is not None and time.monotonic() >= self._next_timer:
                    self._run_timer()
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                if not worked:
                    time.sleep(min(0.2, left))

    def _poll(self, index: int, poller: LocalEventSourcePoller) -> int:
        """One receive, unless the last one on this queue came back empty less than a second ago."""
        now = time.monotonic()
        if now < self._next_poll.get(index, 0.0):
            return 0
        received = poller.poll_once(0)
        self._next_poll[index] = now if received else now + IDLE_POLL_EVERY
        return received

    def _run_timer(self) -> None:
        self._next_timer = time.monotonic() + TIMER_EVERY
        context = LocalLambdaContext(function_name="delayed-delivery-bucket-timer", timeout_s=60.0)
        try:
            reply = self._timer({"detail-type": "Scheduled Event", "source": "aws.events"}, context)
        except Exception as exc:  # a failed run is retried by the next, as the schedule does
            reply = {"ok": False, "reason": f"{type(exc).__name__}: {exc}"}
        if not reply.get("ok"):
            self._failures.append(f"timer: {' '.join(str(reply.get('reason')).split())}")

    def failures(self) -> list[str]:
        """Failed invocations so far."""
        return list(self._failures)

    def lambda_usage(self) -> tuple[float, float]:
        """The probe's requeue invocations and their GB-seconds (256 MB, as deployed)."""
        return float(self.invocations), self.busy_seconds * self.memory_gb
