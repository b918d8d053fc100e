"""Probes of the SQS and S3 answers the design leans on, run on both AWS emulators (docs/testing.md).

``make test`` runs them on moto server, ``make test-localstack`` on LocalStack. Each probe asserts what AWS
documents. Where an emulator is known to answer otherwise, the probe says so (a ``KnownDifference`` warning in the
summary) and, for LocalStack, checks moto server instead; for moto, it checks moto's known answer, so a change of
either emulator shows up here. The two lists below are the whole set of such exceptions.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import boto3
import pytest
from botocore.exceptions import ClientError

from delayed_delivery.aws.sqs import BATCH_PAYLOAD_LIMIT, MAX_BATCH_ENTRIES, send_batches, sqs_text_problem
from delayed_delivery.errors import PermanentError
from tests.fixtures.localstack import LOCALSTACK, aws_emulator

if TYPE_CHECKING:
    from mypy_boto3_sqs import SQSClient

pytestmark = pytest.mark.moto

#: Where LocalStack answers unlike AWS: the probe checks moto server instead.
LOCALSTACK_DIFFERS = {
    "conditional-delete": "LocalStack answers DeleteObject with IfMatch 501 NotImplemented; AWS supports it on "
    "general purpose buckets and the tier's lease release leans on it (without it a lease ends by expiry, 120 s)",
    "twelve-hour-rule": "LocalStack has no 12-hour limit on a message's visibility; AWS refuses a "
    "ChangeMessageVisibility past 12 hours from the receive, which parking in the requeue function plans around",
}
#: Where moto answers unlike AWS: on moto the probe checks moto's known answer; LocalStack checks AWS's.
MOTO_DIFFERS = {
    "bucket-defaults": "moto makes a new bucket without public-access blocks or default encryption; AWS has both "
    "by default since 2023",
    "refused-characters": "moto accepts every character in a body or attribute; AWS refuses those outside "
    "#x9 | #xA | #xD | #x20-#xD7FF | #xE000-#xFFFD | #x10000-#x10FFFF (InvalidMessageContents)",
    "partial-batch": "moto rejects a whole SendMessageBatch (400) for one bad entry; AWS fails that entry only",
}


class KnownDifference(UserWarning):
    """An emulator answers a probe unlike AWS, as listed in this module."""


@pytest.fixture
def emulator(request: pytest.FixtureRequest) -> str:
    """The emulator under test: ``moto`` or ``localstack``."""
    return aws_emulator(request.config)


def _clients(url: str) -> tuple[Any, Any]:
    kwargs: dict[str, Any] = {
        "endpoint_url": url,
        "region_name": "us-east-1",
        "aws_access_key_id": "testing",
        "aws_secret_access_key": "testing",
    }
    return boto3.client("sqs", **kwargs), boto3.client("s3", **kwargs)


@pytest.fixture
def on(moto_endpoint: str, moto_server: str, emulator: str) -> Callable[[str], tuple[Any, Any]]:
    """``on(probe)``: SQS and S3 clients for ``probe`` on the emulator under test, or on moto server when LocalStack
    is known to answer it unlike AWS."""

    def clients(probe: str) -> tuple[Any, Any]:
        if emulator == LOCALSTACK and probe in LOCALSTACK_DIFFERS:
            warnings.warn(
                KnownDifference(f"{probe}: {LOCALSTACK_DIFFERS[probe]}; checked on moto server"), stacklevel=2
            )
            return _clients(moto_server)
        return _clients(moto_endpoint)

    return clients


def _lax(emulator: str, probe: str) -> bool:
    """Whether the emulator under test is moto and moto is known to answer ``probe`` unlike AWS (says so)."""
    if emulator == LOCALSTACK or probe not in MOTO_DIFFERS:
        return False
    warnings.warn(KnownDifference(f"{probe}: {MOTO_DIFFERS[probe]}; moto's answer checked"), stacklevel=2)
    return True


def _code(call: Callable[[], Any]) -> str:
    """The error code ``call`` fails with, or ``ok``."""
    try:
        call()
    except ClientError as exc:
        return str(exc.response.get("Error", {}).get("Code"))
    return "ok"


def _until(what: Callable[[], Any], timeout: float = 20.0) -> Any:
    """Poll ``what`` until it returns something truthy or ``timeout`` passes (then its last answer)."""
    deadline = time.monotonic() + timeout
    while True:
        got = what()
        if got or time.monotonic() > deadline:
            return got
        time.sleep(0.1)


def _fifo(sqs: SQSClient, name: str, **attributes: str) -> str:
    queue = sqs.create_queue(QueueName=name, Attributes={"FifoQueue": "true", **attributes})
    return queue["QueueUrl"]


# S3


def test_conditional_writes_create_once_and_replace_only_the_version_read(on: Callable[[str], Any]) -> None:
    # the plan store and the lease: PutObject IfNoneMatch='*' creates once, IfMatch replaces only what was read
    _, s3 = on("conditional-write")
    s3.create_bucket(Bucket="probe-bucket")
    first = s3.put_object(Bucket="probe-bucket", Key="k", Body=b"1", IfNoneMatch="*")["ETag"]
    assert _code(lambda: s3.put_object(Bucket="probe-bucket", Key="k", Body=b"2", IfNoneMatch="*")) == (
        "PreconditionFailed"
    )
    second = s3.put_object(Bucket="probe-bucket", Key="k", Body=b"3", IfMatch=first)["ETag"]
    assert _code(lambda: s3.put_object(Bucket="probe-bucket", Key="k", Body=b"4", IfMatch=first)) == (
        "PreconditionFailed"
    )
    assert _code(lambda: s3.put_object(Bucket="probe-bucket", Key="gone", Body=b"5", IfMatch=second)) == "NoSuchKey"
    assert s3.get_object(Bucket="probe-bucket", Key="k")["Body"].read() == b"3"


def test_conditional_delete_removes_only_the_version_read(on: Callable[[str], Any]) -> None:
    # the tier's lease release: DeleteObject IfMatch deletes the lease this holder wrote, never a successor's
    _, s3 = on("conditional-delete")
    s3.create_bucket(Bucket="probe-bucket")
    old = s3.put_object(Bucket="probe-bucket", Key="lease", Body=b"a")["ETag"]
    new = s3.put_object(Bucket="probe-bucket", Key="lease", Body=b"b")["ETag"]
    assert _code(lambda: s3.delete_object(Bucket="probe-bucket", Key="lease", IfMatch=old)) == "PreconditionFailed"
    assert s3.get_object(Bucket="probe-bucket", Key="lease")["Body"].read() == b"b"
    assert _code(lambda: s3.delete_object(Bucket="probe-bucket", Key="lease", IfMatch=new)) == "ok"
    assert _code(lambda: s3.head_object(Bucket="probe-bucket", Key="lease")) == "404"


def test_a_new_bucket_blocks_public_access_and_encrypts_by_default(on: Callable[[str], Any], emulator: str) -> None:
    _, s3 = on("bucket-defaults")
    s3.create_bucket(Bucket="probe-bucket")
    if _lax(emulator, "bucket-defaults"):
        assert _code(lambda: s3.get_public_access_block(Bucket="probe-bucket")) == (
            "NoSuchPublicAccessBlockConfiguration"
        )
        return
    blocks = s3.get_public_access_block(Bucket="probe-bucket")["PublicAccessBlockConfiguration"]
    assert all(blocks.values()) and len(blocks) == 4
    rules = s3.get_bucket_encryption(Bucket="probe-bucket")["ServerSideEncryptionConfiguration"]["Rules"]
    assert rules[0]["ApplyServerSideEncryptionByDefault"]["SSEAlgorithm"] in ("AES256", "aws:kms")


def test_listing_resumes_after_a_key_in_key_order(on: Callable[[str], Any]) -> None:
    # the timer walks bucket keys in order and resumes after the last one it handled
    _, s3 = on("listing")
    s3.create_bucket(Bucket="probe-bucket")
    for key in ("b/3", "b/1", "a/9", "b/2", "b/10"):
        s3.put_object(Bucket="probe-bucket", Key=key, Body=b"")
    page = s3.list_objects_v2(Bucket="probe-bucket", Prefix="b/", StartAfter="b/1", MaxKeys=2)
    assert [o["Key"] for o in page["Contents"]] == ["b/10", "b/2"] and page["IsTruncated"]


# SQS


def test_fifo_drops_a_repeated_deduplication_id(on: Callable[[str], Any]) -> None:
    # every hop's MessageDeduplicationId: a hop repeated within 5 minutes is dropped
    sqs, _ = on("fifo-dedup")
    url = _fifo(sqs, "probe.fifo")
    for body in ("first", "again"):
        sqs.send_message(QueueUrl=url, MessageBody=body, MessageGroupId="g", MessageDeduplicationId="same")
    got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=1).get("Messages", [])
    assert [m["Body"] for m in got] == ["first"]
    assert sqs.receive_message(QueueUrl=url, WaitTimeSeconds=1).get("Messages", []) == []


def test_fifo_refuses_a_message_delay_and_honours_the_queue_delay(on: Callable[[str], Any]) -> None:
    # the -delay.fifo hop: the queue's DelaySeconds holds each message; a per-message delay is refused
    sqs, _ = on("fifo-delay")
    url = _fifo(sqs, "probe-delay.fifo", DelaySeconds="1")
    refused = _code(
        lambda: sqs.send_message(
            QueueUrl=url, MessageBody="x", MessageGroupId="g", MessageDeduplicationId="d0", DelaySeconds=1
        )
    )
    assert refused == "InvalidParameterValue"
    sent = time.monotonic()
    sqs.send_message(QueueUrl=url, MessageBody="held", MessageGroupId="g", MessageDeduplicationId="d1")
    got = _until(lambda: sqs.receive_message(QueueUrl=url, WaitTimeSeconds=1).get("Messages", []))
    assert [m["Body"] for m in got] == ["held"]
    assert time.monotonic() - sent >= 0.9  # never early (how late is the emulator's own: docs/testing.md)


def test_a_native_delay_is_never_early(on: Callable[[str], Any]) -> None:
    sqs, _ = on("native-delay")
    url = sqs.create_queue(QueueName="probe")["QueueUrl"]
    sent = time.monotonic()
    sqs.send_message(QueueUrl=url, MessageBody="later", DelaySeconds=2)
    assert sqs.receive_message(QueueUrl=url).get("Messages", []) == []
    got = _until(lambda: sqs.receive_message(QueueUrl=url, WaitTimeSeconds=1).get("Messages", []))
    assert [m["Body"] for m in got] == ["later"] and time.monotonic() - sent >= 1.9


def test_visibility_ends_twelve_hours_after_the_receive(on: Callable[[str], Any]) -> None:
    # parking: a message may stay hidden at most 12 hours from its receive, whatever the changes in between
    sqs, _ = on("twelve-hour-rule")
    url = sqs.create_queue(QueueName="probe")["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody="parked")
    [message] = sqs.receive_message(QueueUrl=url, WaitTimeSeconds=1)["Messages"]
    handle = message["ReceiptHandle"]
    assert _code(
        lambda: sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=handle, VisibilityTimeout=42_600)
    ) == ("ok")
    assert _code(
        lambda: sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=handle, VisibilityTimeout=43_201)
    ) in ("InvalidParameterValue", "MessageNotInflight")


def test_batch_limits_are_the_ones_send_batches_plans_with(on: Callable[[str], Any]) -> None:
    sqs, _ = on("batch-limits")
    url = sqs.create_queue(QueueName="probe")["QueueUrl"]
    many = [{"Id": str(i), "MessageBody": "x"} for i in range(MAX_BATCH_ENTRIES + 1)]
    assert _code(lambda: sqs.send_message_batch(QueueUrl=url, Entries=many)) == (
        "AWS.SimpleQueueService.TooManyEntriesInBatchRequest"
    )
    half = BATCH_PAYLOAD_LIMIT // 2
    big = [{"Id": "a", "MessageBody": "x" * half}, {"Id": "b", "MessageBody": "y" * (half + 1)}]
    assert _code(lambda: sqs.send_message_batch(QueueUrl=url, Entries=big)) == (
        "AWS.SimpleQueueService.BatchRequestTooLong"
    )
    assert _code(lambda: sqs.send_message(QueueUrl=url, MessageBody="z" * BATCH_PAYLOAD_LIMIT)) == "ok"


# One character from each edge of SQS's set: outside it on the left, inside it on the right.
EDGES = [0x0, 0x8, 0x9, 0xA, 0xB, 0xD, 0x1F, 0x20, 0x7F, 0xD7FF, 0xE000, 0xFFFD, 0xFFFE, 0xFFFF, 0x10000, 0x10FFFF]


def test_the_characters_sqs_refuses_are_the_ones_the_sender_refuses(on: Callable[[str], Any], emulator: str) -> None:
    sqs, _ = on("refused-characters")
    url = sqs.create_queue(QueueName="probe")["QueueUrl"]
    lax = _lax(emulator, "refused-characters")
    for point in EDGES:
        text = f"a{chr(point)}b"
        ours = sqs_text_problem(text) is None
        body = _code(lambda t=text: sqs.send_message(QueueUrl=url, MessageBody=t))  # type: ignore[misc]
        value = {"k": {"DataType": "String", "StringValue": text}}
        attribute = _code(
            lambda v=value: sqs.send_message(QueueUrl=url, MessageBody="x", MessageAttributes=v)  # type: ignore[misc]
        )
        if lax:
            assert (body, attribute) == ("ok", "ok"), hex(point)
        else:
            assert (body == "ok", attribute == "ok") == (ours, ours), (hex(point), body, attribute)


def test_one_bad_entry_fails_alone_and_send_batches_names_it(on: Callable[[str], Any], emulator: str) -> None:
    # an entry over the queue's MaximumMessageSize: AWS fails that entry inside a successful SendMessageBatch
    sqs, _ = on("partial-batch")
    url = sqs.create_queue(QueueName="probe", Attributes={"MaximumMessageSize": "1024"})["QueueUrl"]
    entries: Any = [
        {"Id": "a", "MessageBody": "fine"},
        {"Id": "b", "MessageBody": "x" * 1025},
        {"Id": "c", "MessageBody": "fine too"},
    ]
    if _lax(emulator, "partial-batch"):
        assert _code(lambda: sqs.send_message_batch(QueueUrl=url, Entries=entries)) == "InvalidParameterValue"
    else:
        reply = sqs.send_message_batch(QueueUrl=url, Entries=entries)
        assert sorted(s["Id"] for s in reply["Successful"]) == ["a", "c"]
        assert [f["Id"] for f in reply["Failed"]] == ["b"]
    # what the product sees is the same on both: two sent, one refused for good
    results = send_batches(sqs, url, entries, what="probe")
    assert [results[i].ok for i in "abc"] == [True, False, True]
    assert isinstance(results["b"].error, PermanentError)
