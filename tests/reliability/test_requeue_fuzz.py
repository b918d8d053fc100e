"""Property-based fuzzing of malformed records into the SQS requeue handler (moto server).

Each example is a batch of one fuzzed record followed by one well-formed record, handed to the real
Lambda handler. Whatever the fuzzed record holds, the handler must answer (no exception), report no
failure for it (a malformed record is not transient: it must not be retried forever), put it on the
error queue with a reason or move it on like a good record, and never drop the good record behind it.
"""

from __future__ import annotations

import base64
import os
import time
import uuid
from typing import TYPE_CHECKING, Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from delayed_delivery.aws.queues import ensure_endpoint
from delayed_delivery.aws.requeue.handler import build_handler
from delayed_delivery.headers import DELAY_SECONDS_ATTRIBUTE, FAILURE_REASON
from delayed_delivery.testing.aws import LocalLambdaContext
from delayed_delivery.testing.aws.sqs import drain
from tests.fixtures.moto import settled_depth
from tests.reliability.sqslab import LAB_SQS, handler_env, lab_settings

if TYPE_CHECKING:
    from mypy_boto3_sqs import SQSClient

pytestmark = pytest.mark.moto

#: Examples per run; the soak sets RELIABILITY_FUZZ_EXAMPLES higher.
EXAMPLES = int(os.environ.get("RELIABILITY_FUZZ_EXAMPLES", "60"))


def _record(
    arn: str, body: str, control: dict[str, Any] | None, extra: dict[str, Any], broker: dict[str, str]
) -> dict[str, Any]:
    group = f"g{uuid.uuid4().hex[:12]}"
    now_ms = str(int(time.time() * 1000))
    attributes = {
        "ApproximateReceiveCount": "1",
        "SentTimestamp": now_ms,
        "ApproximateFirstReceiveTimestamp": now_ms,
        "SenderId": "AIDAFUZZ",
        "MessageGroupId": group,
        "MessageDeduplicationId": f"{group}:0",
        "SequenceNumber": "1",
    }
    attributes.update(broker)
    message_attributes = dict(extra)
    if control is not None:
        message_attributes[DELAY_SECONDS_ATTRIBUTE] = control
    return {
        "messageId": str(uuid.uuid4()),
        "receiptHandle": f"rh-{group}",
        "body": body,
        "attributes": attributes,
        "messageAttributes": message_attributes,
        "md5OfBody": "",
        "eventSource": "aws:sqs",
        "eventSourceARN": arn,
        "awsRegion": "us-east-1",
    }


def _string_attr(value: str, data_type: str = "Number") -> dict[str, Any]:
    return {"stringValue": value, "dataType": data_type, "stringListValues": [], "binaryListValues": []}


garbage_text = st.text(max_size=40)
#: Valid base64 here; undecodable base64 has its own test below.
b64 = st.binary(max_size=30).map(lambda b: base64.b64encode(b).decode())
controls = st.one_of(
    st.none(),
    st.builds(_string_attr, garbage_text),
    st.builds(
        _string_attr, st.from_regex(r"\A-?\d{1,30}(\.\d{0,6})?\Z"), st.sampled_from(["Number", "String", "Binary", ""])
    ),
    st.builds(_string_attr, st.sampled_from(["NaN", "inf", "-1", "1e9", "", " 5", "5 ", "0x10", "９"])),
    st.fixed_dictionaries({"dataType": st.sampled_from(["Binary", "Number"]), "binaryValue": b64}),
    st.fixed_dictionaries({}, optional={"dataType": garbage_text, "stringValue": st.integers()}),
)
#: User attributes on a real record were accepted by SQS once, so they are valid SQS attributes
#: (attributes SQS refuses have their own test below).
sqs_text = st.text(st.characters(min_codepoint=0x20, max_codepoint=0xD7FF), min_size=1, max_size=40)
extras = st.dictionaries(
    st.sampled_from(["kind", "tenant", "x.y", "DelayedDelivery.Other", "a-b_c"]),
    st.one_of(
        st.builds(_string_attr, sqs_text, st.just("String")),
        st.builds(_string_attr, st.integers().map(str), st.just("Number")),
        st.fixed_dictionaries({"dataType": st.just("Binary"), "binaryValue": b64.filter(bool)}),
        st.just("not an object"),
    ),
    max_size=2,
)
brokers = st.dictionaries(
    st.sampled_from(["SentTimestamp", "ApproximateFirstReceiveTimestamp", "ApproximateReceiveCount"]),
    st.one_of(garbage_text, st.integers(-(10**15), 10**15).map(str)),
    max_size=2,
)
bodies = st.one_of(garbage_text, st.binary(max_size=30).map(lambda b: base64.b64encode(b).decode()), st.just(""))


def _drain(sqs: SQSClient, url: str) -> list[dict[str, Any]]:
    return drain(sqs, url, timeout=0)


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=bodies, control=controls, extra=extras, broker=brokers)
def test_malformed_records_end_on_the_error_queue_and_never_take_the_batch_down(
    sqs: SQSClient,
    body: str,
    control: dict[str, Any] | None,
    extra: dict[str, Any],
    broker: dict[str, str],
) -> None:
    ep = ensure_endpoint(
        sqs, f"fz{uuid.uuid4().hex[:12]}", lab_settings("fuzz"), sqs_settings=LAB_SQS, visibility_timeout=1
    )
    handler = build_handler(handler_env(lab_settings("fuzz")), sqs_client=sqs)
    bad = _record(ep.delay_arn, body, control, extra, broker)
    good = _record(ep.delay_arn, "good", _string_attr("1"), {}, {})
    response = handler({"Records": [bad, good]}, LocalLambdaContext())
    assert response.get("batchItemFailures") == [], response
    errors = _drain(sqs, ep.error_url)
    moved = settled_depth(sqs, (ep.input_url, ep.delay_url), 2 - len(errors))
    for m in errors:
        assert m["MessageAttributes"][FAILURE_REASON]["StringValue"], m
    assert len(errors) + moved == 2, (len(errors), moved)  # every record went somewhere, exactly once
    assert all(m["Body"] != "good" for m in errors)  # the good record was moved on, not failed


def _run_one(sqs: SQSClient, bad: dict[str, Any] | None = None) -> tuple[dict[str, Any], list[dict[str, Any]], int]:
    ep = ensure_endpoint(
        sqs, f"fz{uuid.uuid4().hex[:12]}", lab_settings("fuzz"), sqs_settings=LAB_SQS, visibility_timeout=1
    )
    _drain(sqs, ep.error_url)
    handler = build_handler(handler_env(lab_settings("fuzz")), sqs_client=sqs)
    records = [_record(ep.delay_arn, "good", _string_attr("1"), {}, {})]
    if bad is not None:
        records.insert(0, {**bad, "eventSourceARN": ep.delay_arn})
    response = dict(handler({"Records": records}, LocalLambdaContext()))
    errors = _drain(sqs, ep.error_url)
    return response, errors, settled_depth(sqs, (ep.input_url, ep.delay_url), len(records) - len(errors))


def test_undecodable_binary_attribute_goes_to_the_error_queue_alone(sqs: SQSClient) -> None:
    bad = _record("", "body", _string_attr("1"), {"blob": {"dataType": "Binary", "binaryValue": "%%%"}}, {})
    response, errors, moved = _run_one(sqs, bad)
    assert response["batchItemFailures"] == []
    assert len(errors) == 1 and moved == 1


def test_poison_record_whose_attributes_sqs_refuses_still_reaches_the_error_queue(sqs: SQSClient) -> None:
    bad = _record("", "body", None, {"": _string_attr("v", "String")}, {})
    response, errors, moved = _run_one(sqs, bad)
    assert response["batchItemFailures"] == []
    assert len(errors) == 1 and moved == 1


class _RefusingClient:
    """The real moto client, except that SQS refuses error-queue entries carrying the attribute ``refuse-me``."""

    def __init__(self, client: SQSClient) -> None:
        self._client = client
        self.refused = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    def send_message_batch(self, **kwargs: Any) -> Any:
        entries = kwargs["Entries"]
        refused = [e for e in entries if "refuse-me" in e.get("MessageAttributes", {})]
        accepted = [e for e in entries if e not in refused]
        reply: dict[str, Any] = {"Successful": [], "Failed": []}
        if accepted:
            reply = dict(self._client.send_message_batch(**{**kwargs, "Entries": accepted}))
            reply.setdefault("Failed", [])
        for e in refused:
            self.refused += 1
            reply["Failed"].append(
                {"Id": e["Id"], "SenderFault": True, "Code": "InvalidParameterValue", "Message": "refused attribute"}
            )
        return reply


def test_error_queue_send_retries_without_attributes_sqs_refuses(sqs: SQSClient) -> None:
    ep = ensure_endpoint(
        sqs, f"fz{uuid.uuid4().hex[:12]}", lab_settings("fuzz"), sqs_settings=LAB_SQS, visibility_timeout=1
    )
    refusing = _RefusingClient(sqs)
    handler = build_handler(handler_env(lab_settings("fuzz")), sqs_client=refusing)  # type: ignore[arg-type]
    bad = _record(ep.delay_arn, "poison", None, {"refuse-me": _string_attr("v", "String")}, {})
    good = _record(ep.delay_arn, "good", _string_attr("1"), {}, {})
    response = handler({"Records": [bad, good]}, LocalLambdaContext())
    assert response.get("batchItemFailures") == [], response
    assert refusing.refused == 1, "the first error-queue send carried the refused attribute"
    [error] = _drain(sqs, ep.error_url)
    assert error["Body"] == "poison"
    assert "refuse-me" not in error.get("MessageAttributes", {})
    assert "dropped" in error["MessageAttributes"][FAILURE_REASON]["StringValue"]
