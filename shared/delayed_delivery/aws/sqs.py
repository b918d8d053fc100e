"""SQS plumbing shared by the sender, the requeue logic, the time-bucket tier and the transport.

* Error translation: botocore errors become ``TransientError`` / ``PermanentError`` /
  ``DestinationNotFoundError`` inside this package, always ``raise … from exc``.
* ``QueueDirectory``: queue URLs, ``MaximumMessageSize``, ``MessageRetentionPeriod`` and ``VisibilityTimeout``
  per queue name, read once (one GetQueueAttributes) and cached.
* Message attributes: user values (``str``, ``bytes``, ``int``/``float`` or the boto3 dict shape)
  normalised to the boto3 shape, converted back from Lambda event records, and sized the way SQS counts them.
* ``send_batches``: ``SendMessageBatch`` in chunks of ≤10 entries and ≤ the batch payload limit, with a
  per-entry result; a batch rejected as a whole is retried entry by entry so one bad entry cannot sink nine. An
  entry ``Failed`` inside a successful batch (SQS: one bad body, size or FIFO delay) is refused for good when it is
  the entry's fault (``_ENTRY_REFUSED`` or ``SenderFault``), retryable otherwise, and retryable when the answer
  names it in neither list.
* ``classify_send``: what one entry's result means for its message (sent, queue gone, refused for good, retry),
  the same for the requeue step and the time-bucket tier.
"""

from __future__ import annotations

import base64
import math
import re
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any

from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectionError,
    HTTPClientError,
    NoCredentialsError,
    NoRegionError,
    ParamValidationError,
    PartialCredentialsError,
)

from ..errors import (
    ConfigurationError,
    DelayedDeliveryError,
    DestinationNotFoundError,
    DestinationRefusedError,
    InvalidMessageError,
    PermanentError,
    TransientError,
)
from ..headers import HEADER_PREFIX, is_reserved

if TYPE_CHECKING:
    from mypy_boto3_sqs import SQSClient
    from mypy_boto3_sqs.type_defs import MessageAttributeValueTypeDef, SendMessageBatchRequestEntryTypeDef

__all__ = [
    "BATCH_PAYLOAD_LIMIT",
    "MAX_ATTRIBUTES",
    "MAX_BATCH_ENTRIES",
    "NOT_SQS_TEXT",
    "EntryResult",
    "QueueDirectory",
    "SendVerdict",
    "attributes_from_record",
    "check_sqs_text",
    "classify_send",
    "message_size",
    "normalize_attributes",
    "send_batches",
    "sqs_text_problem",
    "translate_error",
    "valid_attribute_name",
]

#: SQS allows at most 10 message attributes per message.
MAX_ATTRIBUTES = 10
#: SendMessageBatch takes at most 10 entries.
MAX_BATCH_ENTRIES = 10
#: Sum of all entries' sizes in one SendMessageBatch (SQS: 1 MiB since 2025; older regions 256 KiB).
BATCH_PAYLOAD_LIMIT = 1_048_576

_NOT_FOUND = {"AWS.SimpleQueueService.NonExistentQueue", "QueueDoesNotExist", "NonExistentQueue"}
_TRANSIENT = {
    "Throttling",
    "ThrottlingException",
    "RequestThrottled",
    "ServiceUnavailable",
    "InternalError",
    "InternalFailure",
    "KmsThrottled",
    "KMS.ThrottlingException",
    "RequestTimeout",
    "AWS.SimpleQueueService.RequestThrottled",
}
#: The destination refuses the caller (IAM, the queue policy, its KMS key): an operator's fix, not the message's fault.
_REFUSED = {
    "AccessDenied",
    "AccessDeniedException",
    "AuthorizationError",
    "InvalidSecurity",
    "KmsAccessDenied",
    "KmsDisabled",
    "KmsInvalidKeyUsage",
    "KmsInvalidState",
    "KmsNotFound",
    "KmsOptInRequired",
    "KMS.AccessDeniedException",
    "KMS.DisabledException",
    "KMS.InvalidKeyUsageException",
    "KMS.InvalidStateException",
    "KMS.NotFoundException",
    "KMS.OptInRequired",
}
#: Codes for an entry that is itself bad (its text, size, delay or parameters): refused for good whatever
#: ``SenderFault`` says (LocalStack answers InvalidMessageContents with SenderFault false), never retried.
_ENTRY_REFUSED = {
    "InvalidMessageContents",
    "InvalidParameterValue",
    "InvalidParameterValueException",
    "InvalidAttributeName",
    "InvalidAttributeValue",
    "MessageTooLong",
    "MissingParameter",
    "UnsupportedOperation",
}
_VALID_ATTRIBUTE_NAME = re.compile(r"^(?!\.)(?!.*\.\.)(?!.*\.$)(?!(?i:aws\.|amazon\.))[A-Za-z0-9_.-]{1,256}$")
#: Characters SQS refuses in a body or attribute (it takes #x9 | #xA | #xD | #x20-#xD7FF | #xE000-#xFFFD | #x10000-).
NOT_SQS_TEXT = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def sqs_text_problem(text: str) -> str | None:
    """Why SQS would refuse ``text`` in a body or attribute (the first bad character and where), else ``None``."""
    bad = NOT_SQS_TEXT.search(text)
    if bad is None:
        return None
    return (
        f"holds {bad.group()!r} at {bad.start()}, which SQS refuses "
        "(it takes tab, newline, carriage return and U+0020 upwards, without surrogates, U+FFFE or U+FFFF)"
    )


def check_sqs_text(what: str, text: str) -> None:
    """Raise ``InvalidMessageError`` when ``text`` holds a character SQS refuses (or a lone surrogate)."""
    problem = sqs_text_problem(text)
    if problem is not None:
        raise InvalidMessageError(f"{what} {problem}")


def _plain(message: str) -> str:
    """An error message fit for one line: an HTML error page (an emulator's 500) becomes its title."""
    if "<html" not in message.lower() and "<!doctype" not in message.lower():
        return message
    title = re.search(r"<title>(.*?)</title>", message, re.I | re.S)
    text = title.group(1) if title else re.sub(r"<[^>]+>", " ", message)
    return " ".join(text.split())[:200] + " (an HTML error page)"


def translate_error(exc: BaseException, what: str) -> DelayedDeliveryError:
    """Map a botocore error to the package's hierarchy (retryability is the type)."""
    if isinstance(exc, ClientError):
        error = exc.response.get("Error", {})
        code = str(error.get("Code", ""))
        message = _plain(str(error.get("Message", "")) or str(exc))
        status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
        if code in _NOT_FOUND:
            return DestinationNotFoundError(f"{what}: the queue does not exist ({code})")
        if code in _TRANSIENT or status >= 500 or status == 429:
            return TransientError(f"{what}: {code or status}: {message}")
        if code in _REFUSED:
            return DestinationRefusedError(f"{what}: {code}: {message}")
        return PermanentError(f"{what}: {code}: {message}")
    if isinstance(exc, NoCredentialsError | PartialCredentialsError | NoRegionError):
        return ConfigurationError(f"{what}: {exc} (configure AWS credentials and a region)")
    if isinstance(exc, ParamValidationError):
        return InvalidMessageError(f"{what}: {exc}")
    if isinstance(exc, ConnectionError | HTTPClientError | BotoCoreError):
        return TransientError(f"{what}: {type(exc).__name__}: {exc}")
    return TransientError(f"{what}: unexpected {type(exc).__name__}: {exc}")


def _entry_error(failed: Mapping[str, Any], what: str) -> DelayedDeliveryError:
    """The error of one ``Failed`` entry of a SendMessageBatch that SQS otherwise accepted."""
    code = str(failed.get("Code", ""))
    message = _plain(str(failed.get("Message", "")))
    if code in _NOT_FOUND:
        return DestinationNotFoundError(f"{what}: the queue does not exist ({code})")
    if code in _REFUSED:
        return DestinationRefusedError(f"{what}: {code}: {message}")
    if code in _ENTRY_REFUSED or (failed.get("SenderFault") and code not in _TRANSIENT):
        return PermanentError(f"{what}: {code}: {message}")
    return TransientError(f"{what}: {code}: {message}")


@dataclass(frozen=True, slots=True)
class QueueInfo:
    """What the package needs to know about one queue."""

    name: str
    url: str
    max_message_size: int
    retention_seconds: int = 345_600
    visibility_timeout: int = 30


class QueueDirectory:
    """URL, size limit, retention and visibility timeout per queue name, cached (GetQueueUrl + GetQueueAttributes)."""

    def __init__(self, client: SQSClient, *, owner_account: str | None = None) -> None:
        self.client = client
        self.owner_account = owner_account
        self._cache: dict[str, QueueInfo] = {}
        self._lock = threading.Lock()

    def get(self, name: str) -> QueueInfo:
        """Look up ``name``; raises ``DestinationNotFoundError`` when it does not exist."""
        with self._lock:
            cached = self._cache.get(name)
        if cached is not None:
            return cached
        try:
            if self.owner_account:
                url = self.client.get_queue_url(QueueName=name, QueueOwnerAWSAccountId=self.owner_account)["QueueUrl"]
            else:
                url = self.client.get_queue_url(QueueName=name)["QueueUrl"]
            attrs = self.client.get_queue_attributes(
                QueueUrl=url, AttributeNames=["MaximumMessageSize", "MessageRetentionPeriod", "VisibilityTimeout"]
            )
        except (ClientError, BotoCoreError) as exc:
            raise translate_error(exc, f"queue {name!r}") from exc
        found = attrs.get("Attributes", {})
        info = QueueInfo(
            name,
            url,
            int(found.get("MaximumMessageSize", BATCH_PAYLOAD_LIMIT)),
            int(found.get("MessageRetentionPeriod", 345_600)),
            int(found.get("VisibilityTimeout", 30)),
        )
        with self._lock:
            self._cache[name] = info
        return info

    def forget(self, name: str) -> None:
        """Drop a cached entry (e.g. after the queue turned out to be gone)."""
        with self._lock:
            self._cache.pop(name, None)


def valid_attribute_name(name: str) -> bool:
    """Whether SQS accepts ``name`` as a message attribute name (256 of ``[A-Za-z0-9_.-]``, no ``.`` first or
    last or twice in a row, no ``AWS.`` or ``Amazon.`` prefix in any case)."""
    return bool(_VALID_ATTRIBUTE_NAME.match(name))


def normalize_attributes(
    attributes: Mapping[str, Any] | None, *, allow_reserved: bool = False
) -> dict[str, MessageAttributeValueTypeDef]:
    """Validate user attributes and return them in the boto3 shape; raises ``InvalidMessageError``."""
    if attributes is None:
        return {}
    if not isinstance(attributes, Mapping):
        raise InvalidMessageError(f"attributes must be a mapping, not {type(attributes).__name__}")
    out: dict[str, MessageAttributeValueTypeDef] = {}
    for name, value in attributes.items():
        if not isinstance(name, str) or not valid_attribute_name(name):
            if isinstance(name, str) and name.lower().startswith(("aws.", "amazon.")):
                raise InvalidMessageError(
                    f"message attribute name {name!r}: the AWS. and Amazon. prefixes are reserved"
                )
            raise InvalidMessageError(
                f"invalid message attribute name {name!r}: use up to 256 letters, digits, '_', '-' or '.' "
                "(not first or last, never two in a row)"
            )
        if not allow_reserved and is_reserved(name):
            raise InvalidMessageError(
                f"message attribute name {name!r}: the {HEADER_PREFIX!r} prefix is reserved for delayed delivery"
            )
        out[name] = _attribute_value(name, value)
    return out


def _attribute_value(name: str, value: Any) -> MessageAttributeValueTypeDef:
    if isinstance(value, bool):
        raise InvalidMessageError(f"attribute {name!r}: a bool is ambiguous; pass 'true'/'false' or 1/0")
    if isinstance(value, str):
        if not value:
            raise InvalidMessageError(f"attribute {name!r}: SQS rejects empty string values")
        check_sqs_text(f"attribute {name!r}", value)
        return {"DataType": "String", "StringValue": value}
    if isinstance(value, bytes | bytearray | memoryview):
        if not bytes(value):
            raise InvalidMessageError(f"attribute {name!r}: SQS rejects empty binary values")
        return {"DataType": "Binary", "BinaryValue": bytes(value)}
    if isinstance(value, int | float):
        if isinstance(value, float) and not math.isfinite(value):
            raise InvalidMessageError(f"attribute {name!r}: a Number must be finite")
        return {"DataType": "Number", "StringValue": repr(value) if isinstance(value, float) else str(value)}
    if isinstance(value, Mapping):
        data_type = value.get("DataType")
        if not isinstance(data_type, str) or data_type.split(".", 1)[0] not in ("String", "Number", "Binary"):
            raise InvalidMessageError(f"attribute {name!r}: DataType must start with String, Number or Binary")
        check_sqs_text(f"attribute {name!r}'s DataType", data_type)
        if data_type.startswith("Binary"):
            raw = value.get("BinaryValue")
            if not isinstance(raw, bytes | bytearray) or not raw:
                raise InvalidMessageError(f"attribute {name!r}: a Binary attribute needs non-empty BinaryValue bytes")
            return {"DataType": data_type, "BinaryValue": bytes(raw)}
        text = value.get("StringValue")
        if not isinstance(text, str) or not text:
            raise InvalidMessageError(f"attribute {name!r}: a {data_type} attribute needs a non-empty StringValue")
        check_sqs_text(f"attribute {name!r}", text)
        return {"DataType": data_type, "StringValue": text}
    raise InvalidMessageError(
        f"attribute {name!r}: use str, bytes, int, float or {{'DataType': ..., 'StringValue'|'BinaryValue': ...}}, "
        f"not {type(value).__name__}"
    )


def attributes_from_record(record_attributes: Mapping[str, Any]) -> dict[str, MessageAttributeValueTypeDef]:
    """Convert a Lambda SQS record's ``messageAttributes`` (camelCase, base64 binaries) to the boto3 shape."""
    out: dict[str, MessageAttributeValueTypeDef] = {}
    for name, value in record_attributes.items():
        if not isinstance(value, Mapping):
            raise InvalidMessageError(f"attribute {name!r} in the event record is not an object")
        data_type = str(value.get("dataType") or value.get("DataType") or "")
        if data_type.startswith("Binary"):
            raw = value.get("binaryValue", value.get("BinaryValue"))
            try:
                data = base64.b64decode(raw, validate=True) if isinstance(raw, str) else raw
            except ValueError:  # binascii.Error
                raise InvalidMessageError(f"attribute {name!r} in the event record is not valid base64") from None
            if not isinstance(data, bytes):
                raise InvalidMessageError(f"attribute {name!r} in the event record has no binary value")
            out[name] = {"DataType": data_type, "BinaryValue": data}
        else:
            text = value.get("stringValue", value.get("StringValue"))
            if not isinstance(text, str):
                raise InvalidMessageError(f"attribute {name!r} in the event record has no string value")
            out[name] = {"DataType": data_type, "StringValue": text}
    return out


def message_size(body: str, attributes: Mapping[str, Mapping[str, Any]]) -> int:
    """Bytes SQS counts against ``MaximumMessageSize``: body plus each attribute's name, type and value."""
    size = len(body.encode("utf-8"))
    for name, value in attributes.items():
        size += len(name.encode("utf-8")) + len(str(value["DataType"]).encode("utf-8"))
        if "BinaryValue" in value:
            size += len(bytes(value["BinaryValue"]))
        else:
            size += len(str(value.get("StringValue", "")).encode("utf-8"))
    return size


@dataclass(frozen=True, slots=True)
class EntryResult:
    """The outcome of one batch entry: the SQS message id, or the error."""

    entry_id: str
    sqs_message_id: str | None = None
    error: DelayedDeliveryError | None = None

    @property
    def ok(self) -> bool:
        """True when SQS accepted the entry."""
        return self.error is None


class SendVerdict(Enum):
    """What one send result means for its message."""

    OK = "ok"
    GONE = "destination gone"
    REFUSED = "refused"
    RETRY = "retry"


def classify_send(error: DelayedDeliveryError | None) -> SendVerdict:
    """Sent, the queue is gone, the queue refused it (poison), or anything else (retry the record)."""
    if error is None:
        return SendVerdict.OK
    if isinstance(error, DestinationNotFoundError):
        return SendVerdict.GONE
    if isinstance(error, PermanentError):
        return SendVerdict.REFUSED
    return SendVerdict.RETRY


def _chunks(
    entries: Sequence[SendMessageBatchRequestEntryTypeDef], payload_limit: int
) -> Iterator[list[SendMessageBatchRequestEntryTypeDef]]:
    chunk: list[SendMessageBatchRequestEntryTypeDef] = []
    size = 0
    for entry in entries:
        entry_size = message_size(entry["MessageBody"], entry.get("MessageAttributes", {}))
        if chunk and (len(chunk) == MAX_BATCH_ENTRIES or size + entry_size > payload_limit):
            yield chunk
            chunk, size = [], 0
        chunk.append(entry)
        size += entry_size
    if chunk:
        yield chunk


def send_batches(
    client: SQSClient,
    queue_url: str,
    entries: Sequence[SendMessageBatchRequestEntryTypeDef],
    *,
    what: str,
    payload_limit: int = BATCH_PAYLOAD_LIMIT,
) -> dict[str, EntryResult]:
    """Send ``entries`` with as few SendMessageBatch calls as the limits allow; one result per entry id."""
    results: dict[str, EntryResult] = {}
    for chunk in _chunks(entries, payload_limit):
        try:
            reply = client.send_message_batch(QueueUrl=queue_url, Entries=chunk)
        except (ClientError, BotoCoreError) as exc:
            error = translate_error(exc, what)
            if len(chunk) > 1 and type(error) is PermanentError:
                # One bad entry can reject the whole batch: isolate it by sending one by one.
                for entry in chunk:
                    results.update(send_batches(client, queue_url, [entry], what=what, payload_limit=payload_limit))
                continue
            for entry in chunk:
                results[entry["Id"]] = EntryResult(entry["Id"], error=error)
            continue
        asked = {entry["Id"] for entry in chunk}
        for ok in reply.get("Successful", []):
            if ok.get("Id") in asked:
                results[ok["Id"]] = EntryResult(ok["Id"], sqs_message_id=ok.get("MessageId"))
        for failed in reply.get("Failed", []):
            if failed.get("Id") in asked:
                results[failed["Id"]] = EntryResult(failed["Id"], error=_entry_error(failed, what))
        for entry_id in asked - results.keys():  # neither sent nor failed: unknown, so sent again (never lost)
            results[entry_id] = EntryResult(entry_id, error=TransientError(f"{what}: SQS gave no result for the entry"))
    return results


def send_batches_side_by_side(
    client: SQSClient, url: str, entries: list[SendMessageBatchRequestEntryTypeDef], *, what: str, threads: int
) -> dict[str, EntryResult]:
    """``send_batches``, cut into up to ``threads`` runs of whole batches sent side by side."""
    runs = min(max(1, threads), -(-len(entries) // MAX_BATCH_ENTRIES))
    if runs <= 1:
        return send_batches(client, url, entries, what=what)
    per = -(-len(entries) // runs // MAX_BATCH_ENTRIES) * MAX_BATCH_ENTRIES
    cuts = [entries[start : start + per] for start in range(0, len(entries), per)]
    results: dict[str, EntryResult] = {}
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=len(cuts), thread_name_prefix="dd-send") as pool:
        for part in pool.map(lambda cut: send_batches(client, url, cut, what=what), cuts):
            results.update(part)
    return results
