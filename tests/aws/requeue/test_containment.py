"""No record's content raises out of an invocation: crafted envelopes, refused error-queue sends, receive counts."""

from __future__ import annotations

import base64
import json
import uuid
from typing import TYPE_CHECKING, Any

import pytest

from delayed_delivery.aws.packing import ENVELOPE_ATTRIBUTE
from delayed_delivery.aws.queues import EndpointQueues
from delayed_delivery.aws.requeue import FifoRequeuer, HopOutcome, RecordResult, receive_limit
from delayed_delivery.aws.requeue.handler import LambdaHandler, build_handler
from delayed_delivery.aws.settings import SqsSettings
from delayed_delivery.headers import DELAY_SECONDS_ATTRIBUTE, FAILURE_REASON
from delayed_delivery.settings import DelayedDeliverySettings
from delayed_delivery.testing.aws import LocalLambdaContext
from delayed_delivery.testing.aws.sqs import drain, fifo_record, sqs_event
from tests.aws.conftest import ERRORS, handler_env
from tests.fixtures.partial_batch import PartialBatch

if TYPE_CHECKING:
    from mypy_boto3_sqs import SQSClient

pytestmark = pytest.mark.moto


def record(endpoint: EndpointQueues, rid: str, body: str, *, envelope: bool, count: int = 1) -> dict[str, Any]:
    """A Lambda SQS record as the event source would hand it over (delay 1 s, so entries forward)."""
    name, kind = (ENVELOPE_ATTRIBUTE, "String") if envelope else (DELAY_SECONDS_ATTRIBUTE, "Number")
    return fifo_record(
        body, arn=endpoint.delay_arn, message_id=rid, receive_count=count, attributes={name: (kind, "1")}
    )


def envelope(entries: list[str]) -> str:
    """An envelope body from raw JSON entry texts (so it can hold what ``json.dumps`` would not write)."""
    return '{"v":1,"m":[' + ",".join(entries) + "]}"


def entry(mid: str, body: str, remaining: str = "0") -> str:
    return f'{{"i":"{mid}","h":1,"d":{remaining},"b":{json.dumps(body)}}}'


def reason_of(message: dict[str, Any]) -> str:
    return str(message["MessageAttributes"][FAILURE_REASON]["StringValue"])


def env_of(settings: DelayedDeliverySettings, sqs_settings: SqsSettings, **extra: str) -> dict[str, str]:
    """The handler's environment; a fresh service name, as Powertools binds its logger to the stdout of the moment."""
    return {
        **handler_env(settings, sqs_settings),
        "POWERTOOLS_SERVICE_NAME": f"requeue-{uuid.uuid4().hex[:8]}",
        **extra,
    }


@pytest.fixture
def handler(
    sqs: SQSClient, settings: DelayedDeliverySettings, sqs_settings: SqsSettings
) -> tuple[LambdaHandler, list[RecordResult]]:
    results: list[RecordResult] = []
    return build_handler(env_of(settings, sqs_settings), sqs_client=sqs, on_results=results.extend), results


def _error_url(sqs: SQSClient) -> str:
    return sqs.get_queue_url(QueueName=ERRORS)["QueueUrl"]


@pytest.mark.parametrize(
    ("label", "poison"),
    [
        ("huge delay", '{"i":"bad","h":1,"d":' + "1" + "0" * 400 + ',"b":"x"}'),
        ("lone surrogate", '{"i":"bad","h":1,"d":0,"b":"a\\ud800b"}'),
        ("NUL", '{"i":"bad","h":1,"d":0,"b":"a\\u0000b"}'),
    ],
)
def test_a_poison_entry_goes_to_the_error_queue_and_its_neighbours_are_forwarded_once(
    sqs: SQSClient,
    endpoint: EndpointQueues,
    handler: tuple[LambdaHandler, list[RecordResult]],
    label: str,
    poison: str,
) -> None:
    handle, _ = handler
    body = envelope([entry("good-1", "one"), poison, entry("good-2", "two")])
    response = handle(sqs_event([record(endpoint, "env-1", body, envelope=True)]), LocalLambdaContext())
    assert response == {"batchItemFailures": []}, label
    delivered = sorted(m["Body"] for m in drain(sqs, endpoint.input_url, expect=2, linger=0.5))
    assert delivered == ["one", "two"]
    errors = drain(sqs, _error_url(sqs), expect=1, linger=0.5)
    assert len(errors) == 1
    assert "malformed envelope entry 1" in reason_of(errors[0])


def refusing_error_queue(client: SQSClient, refuse: Any) -> PartialBatch:
    """The error queue refuses (``Failed``, not retryable) the entries matching ``refuse``."""
    return PartialBatch(client, refuse, queue=f"/{ERRORS}", code="InvalidParameterValue", sender_fault=True)


def test_a_refused_error_queue_send_leaves_a_reduced_form_and_no_failed_record(
    sqs: SQSClient, endpoint: EndpointQueues, settings: DelayedDeliverySettings, sqs_settings: SqsSettings
) -> None:
    # The error queue refuses the poison entry's own text (as SQS would refuse a body too large or with NUL).
    wrapped = refusing_error_queue(sqs, lambda e: '"b":"a\\u0000b"' in e["MessageBody"])
    results: list[RecordResult] = []
    handle = build_handler(env_of(settings, sqs_settings), sqs_client=wrapped, on_results=results.extend)  # type: ignore[arg-type]
    body = envelope([entry("good-1", "one"), '{"i":"bad","h":1,"d":0,"b":"a\\u0000b"}', entry("good-2", "two")])
    response = handle(sqs_event([record(endpoint, "env-1", body, envelope=True)]), LocalLambdaContext())
    assert response == {"batchItemFailures": []}
    assert wrapped.failed, "the wrapper must have refused the full form"
    assert sorted(m["Body"] for m in drain(sqs, endpoint.input_url, expect=2, linger=0.5)) == ["one", "two"]
    errors = drain(sqs, _error_url(sqs), expect=1, linger=0.5)
    assert len(errors) == 1
    reduced = json.loads(errors[0]["Body"])
    assert reduced["id"] == "bad"
    assert "malformed envelope entry 1" in reduced["reason"]
    assert base64.b64decode(reduced["body"]).decode("utf-8") == wrapped.failed[0]
    assert results[0].outcome is not HopOutcome.FAILED


def test_when_even_the_reduced_form_is_refused_the_entry_is_dropped_not_looped(
    sqs: SQSClient,
    endpoint: EndpointQueues,
    settings: DelayedDeliverySettings,
    sqs_settings: SqsSettings,
    caplog: pytest.LogCaptureFixture,
) -> None:
    wrapped = refusing_error_queue(sqs, lambda e: True)
    handle = build_handler(env_of(settings, sqs_settings), sqs_client=wrapped)  # type: ignore[arg-type]
    body = envelope([entry("good-1", "one"), '{"i":"bad","h":1,"d":0,"b":"a\\u0000b"}', entry("good-2", "two")])
    response = handle(sqs_event([record(endpoint, "env-1", body, envelope=True)]), LocalLambdaContext())
    assert response == {"batchItemFailures": []}
    assert sorted(m["Body"] for m in drain(sqs, endpoint.input_url, expect=2, linger=0.5)) == ["one", "two"]
    assert len(wrapped.failed) == 2  # the full form, then the reduced form
    assert "dropped" in caplog.text


def test_a_plain_record_bigger_than_the_error_queue_takes_goes_there_reduced(
    sqs: SQSClient, endpoint: EndpointQueues, handler: tuple[LambdaHandler, list[RecordResult]]
) -> None:
    handle, results = handler
    sqs.set_queue_attributes(QueueUrl=_error_url(sqs), Attributes={"MaximumMessageSize": "1024"})
    poison = record(endpoint, "big", "x" * 5000, envelope=False)
    poison["messageAttributes"] = {}  # no control attribute: poison
    response = handle(sqs_event([poison]), LocalLambdaContext())
    assert response == {"batchItemFailures": []}
    errors = drain(sqs, _error_url(sqs), expect=1, linger=0.5)
    assert len(errors) == 1
    reduced = json.loads(errors[0]["Body"])
    assert reduced["id"] == "big"
    assert "missing control attribute" in reduced["reason"]
    assert len(errors[0]["Body"]) <= 1024
    assert results[0].outcome is HopOutcome.ERROR_QUEUE


def test_a_record_received_too_often_goes_to_the_error_queue_with_the_count(
    sqs: SQSClient, endpoint: EndpointQueues, settings: DelayedDeliverySettings, sqs_settings: SqsSettings
) -> None:
    env = env_of(settings, sqs_settings, DELAYED_DELIVERY_MAX_RECEIVE_COUNT="5")
    results: list[RecordResult] = []
    handle = build_handler(env, sqs_client=sqs, on_results=results.extend)
    limit = receive_limit(5, sqs_settings.max_park_seconds)  # park returns are receives too: allowed on top
    again = record(endpoint, "again", "payload", envelope=False, count=limit + 1)
    fine = record(endpoint, "fine", "ok", envelope=False, count=limit)
    response = handle(sqs_event([again, fine]), LocalLambdaContext())
    assert response == {"batchItemFailures": []}
    errors = drain(sqs, _error_url(sqs), expect=1, linger=0.5)
    assert [m["Body"] for m in errors] == ["payload"]
    assert f"received {limit + 1} times without success" in reason_of(errors[0])
    assert [m["Body"] for m in drain(sqs, endpoint.input_url, expect=1, linger=0.5)] == ["ok"]


def test_an_exception_in_one_records_processing_fails_only_that_record(
    sqs: SQSClient,
    endpoint: EndpointQueues,
    handler: tuple[LambdaHandler, list[RecordResult]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import delayed_delivery.aws.requeue as requeue_pkg

    real = requeue_pkg.parse_record

    def explode(raw: Any, now_ms: int) -> Any:
        if raw["messageId"] == "boom":
            raise RuntimeError("injected")
        return real(raw, now_ms)

    monkeypatch.setattr(requeue_pkg, "parse_record", explode)
    handle, _ = handler
    records = [record(endpoint, rid, rid, envelope=False) for rid in ("a", "boom", "b")]
    response = handle(sqs_event(records), LocalLambdaContext())
    assert response == {"batchItemFailures": [{"itemIdentifier": "boom"}]}
    assert sorted(m["Body"] for m in drain(sqs, endpoint.input_url, expect=2, linger=0.5)) == ["a", "b"]


def test_the_handler_survives_process_raising_and_fails_the_whole_batch(
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
    endpoint: EndpointQueues,
    handler: tuple[LambdaHandler, list[RecordResult]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def broken(self: FifoRequeuer, records: Any) -> Any:
        raise RuntimeError("injected")

    monkeypatch.setattr(FifoRequeuer, "process", broken)
    handle, _ = handler
    records = [record(endpoint, rid, rid, envelope=False) for rid in ("a", "b")]
    response = handle(sqs_event(records), LocalLambdaContext())
    assert response == {"batchItemFailures": [{"itemIdentifier": "a"}, {"itemIdentifier": "b"}]}
    assert "the batch could not be handled; every record will be retried" in caplog.text
    assert '"InvocationFailures":[1.0]' in capsys.readouterr().out


def test_the_receive_limit_allows_every_park_return_on_top() -> None:
    assert receive_limit(50, 42_600) == 50 + 29  # 14 days of retention / 42,600 s parks
    assert receive_limit(50, 0) == 50  # parking off
    assert receive_limit(0, 42_600) == 0  # no limit


def test_an_envelope_received_too_often_sends_every_entry_to_the_error_queue(
    sqs: SQSClient, endpoint: EndpointQueues, settings: DelayedDeliverySettings, sqs_settings: SqsSettings
) -> None:
    handle = build_handler(env_of(settings, sqs_settings, DELAYED_DELIVERY_MAX_RECEIVE_COUNT="5"), sqs_client=sqs)
    body = envelope([entry("one", "1"), entry("two", "2")])
    count = receive_limit(5, sqs_settings.max_park_seconds) + 1
    response = handle(sqs_event([record(endpoint, "env", body, envelope=True, count=count)]), LocalLambdaContext())
    assert response == {"batchItemFailures": []}
    errors = drain(sqs, _error_url(sqs), expect=2, linger=0.5)
    assert sorted(m["Body"] for m in errors) == ["1", "2"]
    assert all("without success" in reason_of(m) for m in errors)
    assert drain(sqs, endpoint.input_url, linger=3) == []  # a forward is due 1 s after the send


def test_the_record_by_record_pass_stops_when_the_invocations_time_is_almost_up(
    sqs: SQSClient,
    endpoint: EndpointQueues,
    handler: tuple[LambdaHandler, list[RecordResult]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import delayed_delivery.aws.requeue as requeue_pkg

    real = requeue_pkg.parse_record

    def explode(raw: Any, now_ms: int) -> Any:
        if raw["messageId"] == "boom":
            raise RuntimeError("injected")
        return real(raw, now_ms)

    calls: list[int] = []

    class Hurried(LocalLambdaContext):
        """Time for the first record of the record-by-record pass only."""

        def get_remaining_time_in_millis(self) -> int:
            calls.append(1)
            return 60_000 if len(calls) == 1 else 1_000

    monkeypatch.setattr(requeue_pkg, "parse_record", explode)
    handle, _ = handler
    records = [record(endpoint, rid, rid, envelope=False) for rid in ("boom", "a", "b")]
    response = handle(sqs_event(records), Hurried())
    assert response == {"batchItemFailures": [{"itemIdentifier": r} for r in ("boom", "a", "b")]}
    assert drain(sqs, endpoint.input_url, linger=3) == []  # a forward is due 1 s after the send


def test_entries_failed_inside_a_successful_batch_are_refused_or_retried_alone(
    sqs: SQSClient, endpoint: EndpointQueues, settings: DelayedDeliverySettings, sqs_settings: SqsSettings
) -> None:
    # AWS fails one entry of a SendMessageBatch (a body it refuses) and sends the rest; moto would refuse them all,
    # so the stand-in answers as LocalStack does: InvalidMessageContents with SenderFault false. Before #36 that
    # entry was retried forever (SenderFault false read as retryable); an entry in neither list raised KeyError.
    wrapped = PartialBatch(
        sqs, lambda e: e["MessageBody"] == "bad", queue="/orders", missing=lambda e: e["MessageBody"] == "lost"
    )
    results: list[RecordResult] = []
    handle = build_handler(env_of(settings, sqs_settings), sqs_client=wrapped, on_results=results.extend)  # type: ignore[arg-type]
    records = [record(endpoint, rid, rid, envelope=False) for rid in ("a", "bad", "lost", "b")]
    response = handle(sqs_event(records), LocalLambdaContext())
    assert response == {"batchItemFailures": [{"itemIdentifier": "lost"}]}  # unknown: the record comes back
    assert sorted(m["Body"] for m in drain(sqs, endpoint.input_url, expect=2, linger=0.5)) == ["a", "b"]
    errors = drain(sqs, _error_url(sqs), expect=1, linger=0.5)
    assert [m["Body"] for m in errors] == ["bad"]
    assert "InvalidMessageContents" in reason_of(errors[0]) and "'orders' refused" in reason_of(errors[0])
    assert {r.message_id: r.outcome for r in results}["lost"] is HopOutcome.FAILED
