"""Fuzzing the core dispatcher with ``SqsTransport`` (moto server): whatever a core store holds reaches SQS.

A stored message may carry any bytes and any str headers, since the core model allows them. SQS bodies are
text and carry at most 10 attributes, so some messages cannot go to their destination. Each of those must
still reach the error queue with a reason and its body recoverable; it must never stay in the store to be
retried forever. A good message stored beside each fuzzed one is always delivered.
"""

from __future__ import annotations

import base64
import os
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from delayed_delivery import DelayedDeliverySettings, DelayedMessage, Dispatcher, ManualClock, SqliteDelayedMessageStore
from delayed_delivery.aws.queues import ensure_endpoint
from delayed_delivery.aws.transport import SqsTransport
from delayed_delivery.headers import BODY_ENCODING, FAILURE_REASON, ORIGINAL_DESTINATION
from tests.reliability.test_requeue_fuzz import _drain

if TYPE_CHECKING:
    from mypy_boto3_sqs import SQSClient

pytestmark = pytest.mark.moto

EXAMPLES = int(os.environ.get("RELIABILITY_FUZZ_EXAMPLES", "60")) // 2
NOW = datetime(2030, 1, 1, tzinfo=UTC)

header_names = st.one_of(
    st.sampled_from(["kind", "x.y", "a-b_c", "", " ", "..", ".lead", "AWS.thing", "DelayedDelivery.Mine", "h" * 300]),
    st.text(min_size=1, max_size=12),
)
headers = st.dictionaries(header_names.filter(bool), st.text(max_size=20), max_size=14)
bodies = st.one_of(
    st.binary(max_size=64),
    st.text(max_size=64).map(lambda t: t.encode("utf-8", "surrogatepass")),
    st.sampled_from([b"", b"\x00", b"\xff\xfe", b"\xed\xa0\x80", "\ufffe".encode(), b"ok \t\r\n"]),
)


def _dispatch(sqs: SQSClient, tmp: Path, messages: list[DelayedMessage]) -> tuple[str, Any, SqliteDelayedMessageStore]:
    name = f"fz{uuid.uuid4().hex[:10]}"
    cfg = DelayedDeliverySettings(error_queue=f"{name}-errors", number_of_retries=0)
    ep = ensure_endpoint(sqs, name, cfg)
    store = SqliteDelayedMessageStore(tmp / f"{name}.db")
    store.setup_infrastructure()
    store.store_many([m.redirected(name) for m in messages])
    clock = ManualClock(NOW)
    dispatcher = Dispatcher(store, SqsTransport(sqs, clock=clock), cfg, clock=clock)
    dispatcher.dispatch_due()
    return name, ep, store


def _original_body(message: dict[str, Any]) -> bytes:
    attrs = message.get("MessageAttributes", {})
    if attrs.get(BODY_ENCODING, {}).get("StringValue") == "base64":
        return base64.b64decode(message["Body"])
    return str(message["Body"]).encode("utf-8")


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=bodies, extra=headers)
def test_any_stored_message_reaches_its_destination_or_the_error_queue(
    sqs: SQSClient, tmp_path_factory: pytest.TempPathFactory, body: bytes, extra: dict[str, str]
) -> None:
    bad = DelayedMessage("fuzzed", "x", body, NOW - timedelta(seconds=1), extra)
    good = DelayedMessage("good", "x", b"good", NOW - timedelta(seconds=1))
    name, ep, store = _dispatch(sqs, tmp_path_factory.mktemp("fz"), [bad, good])
    assert len(store) == 0, "a message stayed in the store (it would be retried forever)"
    delivered = _drain(sqs, ep.input_url)
    errors = _drain(sqs, ep.error_url)
    assert len(delivered) + len(errors) == 2
    assert any(m["Body"] == "good" for m in delivered)
    for m in errors:
        assert m["MessageAttributes"][FAILURE_REASON]["StringValue"]
        assert m["MessageAttributes"][ORIGINAL_DESTINATION]["StringValue"] == name
        assert _original_body(m) == body  # recoverable byte for byte
    for m in delivered:
        if m["Body"] != "good":
            assert m["Body"].encode("utf-8") == body
    store.close()


def test_non_utf8_body_goes_to_the_error_queue_as_base64(sqs: SQSClient, tmp_path: Path) -> None:
    body = b"\xff\xfe\x00binary"
    bad = DelayedMessage("bin-1", "x", body, NOW - timedelta(seconds=1), {f"h{i}": "v" for i in range(9)})
    _, ep, store = _dispatch(sqs, tmp_path, [bad])
    assert len(store) == 0
    [error] = _drain(sqs, ep.error_url)
    attrs = error["MessageAttributes"]
    assert attrs[BODY_ENCODING]["StringValue"] == "base64"
    assert base64.b64decode(error["Body"]) == body
    reason = attrs[FAILURE_REASON]["StringValue"]
    assert "UTF-8" in reason and "base64" in reason and "dropped" in reason  # 9 headers + 5 of ours > 10
    assert len(attrs) == 10
    store.close()
