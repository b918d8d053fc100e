"""Pure pieces of the AWS adapter: ids, ARNs, attributes, error translation, millisecond hop arithmetic."""

from __future__ import annotations

import pytest
from botocore.exceptions import ClientError, EndpointConnectionError, NoCredentialsError
from hypothesis import given
from hypothesis import strategies as st

from delayed_delivery.aws.fifo_ids import deduplication_id, hop_of
from delayed_delivery.aws.requeue.records import parse_source_arn, seconds_text, to_ms
from delayed_delivery.aws.sqs import (
    attributes_from_record,
    message_size,
    normalize_attributes,
    translate_error,
    valid_attribute_name,
)
from delayed_delivery.errors import (
    ConfigurationError,
    DestinationNotFoundError,
    DestinationRefusedError,
    InvalidMessageError,
    PermanentError,
    TransientError,
)
from delayed_delivery.planning import remaining_delay, remaining_delay_ms
from delayed_delivery.testing.aws import lambda_sqs_record


def _client_error(code: str, status: int = 400) -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": "m"}, "ResponseMetadata": {"HTTPStatusCode": status}}, "Op")


@pytest.mark.parametrize(
    ("exc", "kind"),
    [
        (_client_error("AWS.SimpleQueueService.NonExistentQueue"), DestinationNotFoundError),
        (_client_error("QueueDoesNotExist"), DestinationNotFoundError),
        (_client_error("ThrottlingException"), TransientError),
        (_client_error("Whatever", 503), TransientError),
        (_client_error("AccessDenied", 403), DestinationRefusedError),  # a PermanentError the tier retries a while
        (_client_error("KmsDisabled"), DestinationRefusedError),
        (_client_error("InvalidParameterValue"), PermanentError),
        (EndpointConnectionError(endpoint_url="http://x"), TransientError),
        (NoCredentialsError(), ConfigurationError),
    ],
)
def test_translate_error(exc: Exception, kind: type) -> None:
    error = translate_error(exc, "op")
    assert type(error) is kind
    assert error.retryable is (kind is TransientError)


def test_source_arn_names_the_owning_queue() -> None:
    source = parse_source_arn("arn:aws:sqs:eu-west-1:111122223333:orders-delay.fifo")
    assert (source.region, source.account, source.delay_queue, source.destination) == (
        "eu-west-1",
        "111122223333",
        "orders-delay.fifo",
        "orders",
    )
    for bad in ("arn:aws:sqs:eu-west-1:1:orders", "arn:aws:sqs:eu-west-1:1:orders.fifo", "nonsense", ""):
        with pytest.raises(ConfigurationError):
            parse_source_arn(bad)


@given(
    st.text(alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1, max_size=128),
    st.integers(0, 10**7),
)
def test_dedup_id_fits_and_carries_the_hop(message_id: str, hop: int) -> None:
    dedup = deduplication_id(message_id, hop)
    assert len(dedup) <= 128
    assert hop_of(dedup) == hop


def test_hop_of_foreign_ids_is_zero() -> None:
    assert hop_of(None) == 0 and hop_of("abc") == 0 and hop_of("a:b") == 0


def test_attribute_round_trip_through_a_lambda_record() -> None:
    attrs = normalize_attributes(
        {"s": "text", "n": 5, "b": b"\x00\x01", "c": {"DataType": "Number.int", "StringValue": "7"}}
    )
    message = {"MessageId": "1", "ReceiptHandle": "r", "Body": "x", "MD5OfBody": "", "MessageAttributes": attrs}
    record = lambda_sqs_record(message, "arn:aws:sqs:us-east-1:1:q-delay.fifo", "us-east-1")  # type: ignore[arg-type]
    assert record["messageAttributes"]["b"]["binaryValue"] == "AAE="
    assert attributes_from_record(record["messageAttributes"]) == attrs


def test_message_size_counts_names_types_and_values() -> None:
    attrs = normalize_attributes({"ab": "xyz", "bin": b"1234"})
    assert message_size("héllo", attrs) == 6 + (2 + 6 + 3) + (3 + 6 + 4)


@pytest.mark.parametrize("bad", [{"": "x"}, {"a b": "x"}, {"x": None}, {"x": float("inf")}, {"x": {"DataType": "Foo"}}])
def test_bad_attributes(bad: dict[str, object]) -> None:
    with pytest.raises(InvalidMessageError):
        normalize_attributes(bad)


@pytest.mark.parametrize("name", ["trailing.", ".leading", "two..dots", "a" * 257, "AWS.x", "amazon.y", "é"])
def test_attribute_names_sqs_refuses_are_refused_before_sending(name: str) -> None:
    assert not valid_attribute_name(name)
    with pytest.raises(InvalidMessageError, match="attribute name"):
        normalize_attributes({name: "v"})


@pytest.mark.parametrize("name", ["a", "a.b", "A-b_c.9", "x" * 256, "awsx", "my.aws.thing"])
def test_attribute_names_sqs_takes_pass(name: str) -> None:
    assert valid_attribute_name(name) and name in normalize_attributes({name: "v"})


@given(st.integers(0, 10**12))
def test_seconds_text_round_trip(ms: int) -> None:
    assert to_ms(seconds_text(ms)) == ms


def test_millisecond_rule_matches_the_seed_rule_in_whole_seconds() -> None:
    # 1,925 s sent at t=0, first received at 900.7 s: the seed says 1,025 s left; we keep the 0.7 s.
    assert remaining_delay(1925, 0, 900_700, 1, 0) == 1025
    assert remaining_delay_ms(1_925_000, 0, 900_700, 1, 0) == 1_024_300
    # A redelivery uses the local clock when it says more time passed; a clock behind the broker never makes it
    # early, and never takes back the second the broker has already proven (first receive − sent).
    assert remaining_delay_ms(10_000, 5_000, 6_000, 2, 9_000) == 6_000
    assert remaining_delay_ms(10_000, 5_000, 6_000, 2, 1_000) == 9_000


def test_rounding_does_not_accumulate_over_many_hops() -> None:
    total, hop_ms, lag_ms = 35_040 * 900_000, 900_000, 400  # a year of 900 s hops, each received 0.4 s late
    whole, exact, elapsed = total // 1000, total, 0
    while exact > 900_000:
        exact = remaining_delay_ms(exact, 0, hop_ms + lag_ms, 1, 0)
        whole = remaining_delay(whole, 0, hop_ms + lag_ms, 1, 0)
        elapsed += hop_ms + lag_ms
    assert elapsed + exact == total  # exactly on time
    assert whole * 1000 - exact > 3_000_000  # whole seconds would have been more than 50 minutes late
