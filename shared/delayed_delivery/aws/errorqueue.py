"""The error queue's last resort: a reduced form (id, reason, body in base64 cut to fit) for what it refuses."""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..headers import FAILED_AT, FAILURE_REASON, ORIGINAL_DESTINATION
from .sqs import message_size, sqs_text_problem

if TYPE_CHECKING:
    from mypy_boto3_sqs.type_defs import MessageAttributeValueTypeDef, SendMessageBatchRequestEntryTypeDef

__all__ = [
    "DROPPED",
    "REDUCED_FORMAT",
    "REDUCED_MAX_BYTES",
    "Poison",
    "full_form_problem",
    "reduced_body",
    "reduced_entry",
    "sqs_safe",
]

#: The largest reduced form sent (bytes, body and attributes), whatever the error queue takes.
REDUCED_MAX_BYTES = 200 * 1024
#: The ``format`` field of a reduced form's JSON body.
REDUCED_FORMAT = "delayed-delivery-reduced/1"
#: How the reason of a message dropped because the error queue refused even its reduced form begins.
DROPPED = "dropped: the error queue refused it, even in reduced form"


@dataclass(frozen=True, slots=True)
class Poison:
    """A message on its way to the error queue: its id, body, why, and the destination it was meant for."""

    message_id: str
    body: str
    reason: str | None
    destination: str


def sqs_safe(text: str) -> str:
    """``text`` as it is when SQS takes it, else with every non-ASCII character escaped (``\\uXXXX``)."""
    if sqs_text_problem(text) is None:
        return text
    return json.dumps(text, ensure_ascii=True)[1:-1]


def full_form_problem(body: str, attributes: Mapping[str, MessageAttributeValueTypeDef], max_size: int) -> str | None:
    """Why the error queue would refuse a full form (text SQS refuses, too large), checked before sending."""
    problem = sqs_text_problem(body)
    if problem is not None:
        return f"the body {problem}"
    for name, value in attributes.items():
        text = value.get("StringValue")
        if isinstance(text, str) and sqs_text_problem(text) is not None:
            return f"attribute {name!r} {sqs_text_problem(text)}"
    size = message_size(body or "(empty body)", attributes)
    if size > max_size:
        return f"{size:,} bytes, the error queue accepts at most {max_size:,}"
    return None


def reduced_entry(
    entry_id: str, w: Poison, failed_at: str, max_size: int, why: str
) -> SendMessageBatchRequestEntryTypeDef:
    """The reduced form of ``w``: JSON (ASCII) with id, reason and the body's UTF-8 bytes in base64, cut to fit."""
    reason = sqs_safe(f"{w.reason or 'unknown'} (reduced form: {why})")[:1024]
    attributes: dict[str, MessageAttributeValueTypeDef] = {
        FAILURE_REASON: {"DataType": "String", "StringValue": reason},
        ORIGINAL_DESTINATION: {"DataType": "String", "StringValue": sqs_safe(w.destination)},
        FAILED_AT: {"DataType": "String", "StringValue": failed_at},
    }
    room = min(REDUCED_MAX_BYTES, max_size) - message_size("", attributes)
    body = reduced_body(w.message_id, reason, w.body.encode("utf-8", "surrogatepass"), room)
    return {"Id": entry_id, "MessageBody": body, "MessageAttributes": attributes}


def reduced_body(message_id: str, reason: str, raw: bytes, room: int) -> str:
    """The reduced form's body: JSON (ASCII) with the id, the reason and as much of ``raw`` in base64 as fits
    ``room`` bytes (``size`` is the whole body's, ``truncated`` says whether some was cut)."""
    document = {
        "format": REDUCED_FORMAT,
        "id": message_id,
        "reason": reason,
        "size": len(raw),
        "truncated": False,
        "body": "",
    }
    empty = json.dumps(document, ensure_ascii=True, separators=(",", ":"))
    keep = max(0, room - len(empty)) // 4 * 3
    document["truncated"] = len(raw) > keep
    document["body"] = base64.b64encode(raw[:keep]).decode("ascii")
    return json.dumps(document, ensure_ascii=True, separators=(",", ":"))
