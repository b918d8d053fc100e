"""Property-based fuzzing of crafted envelopes into the SQS requeue handler (moto server).

Each example is a batch of two to six envelope records whose entries are healthy or crafted (huge ints,
lone surrogates, NUL, deep nesting, reserved attribute names, bodies too large to forward, more entries than an
envelope may hold). Whatever they hold, the handler returns and reports no failure, every healthy entry is
delivered exactly once, and every poison entry (or a whole unreadable envelope) lands on the error queue with a
reason. ``RELIABILITY_FUZZ_EXAMPLES`` sets the number of examples (60 by default, halved here: each example pays for
its own three queues and the wait for its delayed forwards, so it carries two to six envelopes, twice what one
used to, the same breadth of crafted input over half the fixed cost).
"""

from __future__ import annotations

import json
import os
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from delayed_delivery.aws.packing import ENVELOPE_ATTRIBUTE, MAX_ENVELOPE_ENTRIES
from delayed_delivery.aws.queues import ensure_endpoint
from delayed_delivery.aws.requeue.handler import build_handler
from delayed_delivery.headers import FAILURE_REASON
from delayed_delivery.testing.aws import LocalLambdaContext
from delayed_delivery.testing.aws.sqs import drain, fifo_record, sqs_event
from tests.reliability.sqslab import LAB_SQS, handler_env, lab_settings

if TYPE_CHECKING:
    from mypy_boto3_sqs import SQSClient

pytestmark = pytest.mark.moto

EXAMPLES = int(os.environ.get("RELIABILITY_FUZZ_EXAMPLES", "60")) // 2
#: The destination's and the error queue's maximum message size in these tests (bytes).
SMALL_QUEUE = 65_536


@dataclass(frozen=True)
class Entry:
    """One envelope entry as raw JSON text, and the body it delivers when healthy (``None``: poison)."""

    text: str
    delivers: str | None


def _healthy(n: int, body: str, delay_ms: int, hop: int, attribute: bool) -> Entry:
    text = body + f"#{n}"
    item: dict[str, Any] = {"i": f"ok-{n}", "h": hop, "d": delay_ms, "b": text}
    if attribute:
        item["a"] = {"tenant": ["String", "s", "acme"]}
    return Entry(json.dumps(item), text)


def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


#: Crafted entries (raw JSON), each poison on its own.
POISON = st.one_of(
    st.integers(19, 500).map(lambda k: Entry('{"i":"bad-d","h":1,"d":1' + "0" * k + ',"b":"x"}', None)),
    st.integers(1, 400).map(lambda k: Entry('{"i":"bad-n","h":1,"d":-1' + "0" * k + ',"b":"x"}', None)),
    st.integers(11, 400).map(lambda k: Entry('{"i":"bad-h","h":1' + "0" * k + ',"d":0,"b":"x"}', None)),
    st.sampled_from(["\\ud800", "\\udfff", "\\u0000", "\\u0001", "\\ufffe", "\\uffff", "a\\ud83d"]).map(
        lambda c: Entry('{"i":"bad-text","h":1,"d":0,"b":"a' + c + 'b"}', None)
    ),
    st.sampled_from([ENVELOPE_ATTRIBUTE, "DelayedDelivery.DelaySeconds", "DelayedDelivery.Anything"]).map(
        lambda name: Entry('{"i":"bad-a","h":1,"d":0,"b":"x","a":{"' + name + '":["String","s","1"]}}', None)
    ),
    st.integers(1, 12).map(lambda d: Entry('{"i":"bad-deep","h":1,"d":0,"b":"x","a":' + _nested(d) + "}", None)),
    st.sampled_from(['"just text"', "17", "null", "[]", '{"i":"bad-b","h":1,"d":0}', '{"h":1,"d":0,"b":"x"}']).map(
        lambda t: Entry(t, None)
    ),
    st.sampled_from(['{"i":"bad id","h":1,"d":0,"b":"x"}', '{"i":"","h":1,"d":0,"b":"x"}']).map(
        lambda t: Entry(t, None)
    ),
    # Too large for the destination and the error queue (64 KiB here): the error queue gets it reduced.
    st.just(Entry(json.dumps({"i": "bad-big", "h": 1, "d": 0, "b": "y" * (SMALL_QUEUE + 1)}), None)),
)
HEALTHY_BODIES = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), min_size=1, max_size=30)


@st.composite
def envelopes(draw: st.DrawFn, first: int) -> tuple[str, list[Entry], bool]:
    """An envelope body, its entries and whether it is unreadable as a whole (too many entries)."""
    entries: list[Entry] = []
    for n in range(draw(st.integers(1, 8))):
        if draw(st.booleans()):
            entries.append(draw(POISON))
        else:
            body, delay, hop = draw(HEALTHY_BODIES), draw(st.integers(0, 1000)), draw(st.integers(0, 50))
            entries.append(_healthy(first + n, body, delay, hop, draw(st.booleans())))
    too_many = draw(st.integers(0, 20)) == 0
    if too_many:
        entries += [_healthy(first + 100 + n, "bulk", 0, 1, False) for n in range(MAX_ENVELOPE_ENTRIES + 1)]
    return '{"v":1,"m":[' + ",".join(e.text for e in entries) + "]}", entries, too_many


def _record(arn: str, body: str) -> dict[str, Any]:
    return fifo_record(
        body, arn=arn, group=f"g{uuid.uuid4().hex[:12]}", attributes={ENVELOPE_ATTRIBUTE: ("String", "1")}
    )


def _drain(sqs: SQSClient, url: str, expect: int = 0) -> list[dict[str, Any]]:
    """Everything on ``url``; waits up to 3 s for ``expect`` messages (a forward may carry DelaySeconds 1)."""
    return drain(sqs, url, expect=expect, timeout=3)


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batch=st.integers(2, 6).flatmap(lambda n: st.tuples(*(envelopes(1000 * (i + 1)) for i in range(n)))))
def test_crafted_envelopes_never_take_the_handler_or_their_neighbours_down(
    sqs: SQSClient, batch: tuple[tuple[str, list[Entry], bool], ...]
) -> None:
    ep = ensure_endpoint(
        sqs, f"hf{uuid.uuid4().hex[:12]}", lab_settings("hfuzz"), sqs_settings=LAB_SQS, visibility_timeout=1
    )
    for url in (ep.input_url, ep.error_url):
        sqs.set_queue_attributes(QueueUrl=url, Attributes={"MaximumMessageSize": str(SMALL_QUEUE)})
    handler = build_handler(handler_env(lab_settings("hfuzz")), sqs_client=sqs)
    response = handler(sqs_event([_record(ep.delay_arn, body) for body, _, _ in batch]), LocalLambdaContext())
    assert response == {"batchItemFailures": []}
    expected_delivered = sorted(e.delivers for _, es, whole in batch if not whole for e in es if e.delivers)
    expected_errors = sum(1 if whole else sum(e.delivers is None for e in es) for _, es, whole in batch)
    delivered = sorted(m["Body"] for m in _drain(sqs, ep.input_url, len(expected_delivered)))
    assert delivered == expected_delivered  # every healthy entry exactly once
    assert _drain(sqs, ep.delay_url) == []  # nothing left to hop (every delay was under the cap)
    errors = _drain(sqs, ep.error_url)
    assert len(errors) == expected_errors
    assert all(m["MessageAttributes"][FAILURE_REASON]["StringValue"] for m in errors)
