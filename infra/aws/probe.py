"""``VerifyProbe``: the endpoint ``delayed-delivery aws verify`` sends its probes through (docs/verify.md).

A regular endpoint named ``delayed-delivery-probe`` (input queue, ``-delay.fifo``, error queue, requeue function),
made to cost nothing while idle: no alarms (an alarm is billed every month), and the function's SQS event source is
off at rest (its long polls are billed requests); verify switches it on for a run and off again. The stack also
makes its input queue a destination of the time-bucket tier, so a probe can travel that route too. Senders allowed
on its ``-delay.fifo``: the stack's ``delaySenders`` and the ``verifyRoles`` (whoever runs verify).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from constructs import Construct

from delayed_delivery.aws.verify.target import PROBE_QUEUE
from infra.aws.endpoint import DelayedDeliveryEndpoint
from infra.aws.props import SharedProps

__all__ = ["PROBE_QUEUE", "VerifyProbe"]


class VerifyProbe(Construct):
    """The probe endpoint: zero idle cost, switched on by ``aws verify`` for the length of a run."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        shared: SharedProps,
        sender_arns: Sequence[str] = (),
        queue_name: str = PROBE_QUEUE,
    ) -> None:
        super().__init__(scope, construct_id)
        self.endpoint = DelayedDeliveryEndpoint(
            self,
            "Endpoint",
            queue_name=queue_name,
            shared=replace(shared, alarm_actions=()),  # no alarms: they cost money every month
            sender_arns=sender_arns,
            alarms=False,
            event_source_enabled=False,
        )
        self.queue_name = queue_name
