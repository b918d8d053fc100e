"""JSON read from outside (queues, table rows, exports) with bounds: size, nesting depth and shape."""

from __future__ import annotations

import json
import re
from typing import Any

from .errors import InvalidMessageError

__all__ = ["MAX_HEADERS_JSON_CHARS", "headers_from_json", "json_depth", "loads_bounded", "parse_headers_json"]

#: Longest headers JSON accepted: 1 MiB of text (an Azure table property holds 32 Ki characters, a queue message
#: 64 KiB, an SQS message 1 MiB).
MAX_HEADERS_JSON_CHARS = 1_048_576

#: A JSON string (unrolled: a run of plain characters, then escapes each followed by another run), fast on long text.
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")


def json_depth(text: str, limit: int | None = None) -> int:
    """How deeply arrays and objects nest in ``text`` (0 for a scalar); stops counting once past ``limit``."""
    brackets = _NOT_BRACKET.sub("", _STRING.sub("", text))
    depth = deepest = 0
    for char in brackets:
        if char in "[{":
            depth += 1
            if depth > deepest:
                deepest = depth
                if limit is not None and deepest > limit:
                    return deepest
        else:
            depth -= 1
    return deepest


def loads_bounded(text: str | bytes, *, what: str, max_chars: int, max_depth: int) -> Any:
    """``json.loads`` that refuses text over ``max_chars`` or nested over ``max_depth`` with ``InvalidMessageError``."""
    if isinstance(text, bytes | bytearray):
        try:
            text = bytes(text).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InvalidMessageError(f"{what}: not UTF-8 text ({exc})") from None
    if not isinstance(text, str):
        raise InvalidMessageError(f"{what}: expected JSON text, not {type(text).__name__}")
    if len(text) > max_chars:
        raise InvalidMessageError(f"{what}: {len(text):,} characters of JSON, more than the {max_chars:,} accepted")
    depth = json_depth(text, max_depth)
    if depth > max_depth:
        raise InvalidMessageError(f"{what}: JSON nested more than {max_depth} deep")
    try:
        return json.loads(text)
    except RecursionError:  # not expected after the depth check; kept so no input can raise it
        raise InvalidMessageError(f"{what}: JSON nested too deep") from None
    except ValueError as exc:
        raise InvalidMessageError(f"{what}: not JSON ({type(exc).__name__}: {exc})") from None


def parse_headers_json(text: str | bytes, *, max_chars: int = MAX_HEADERS_JSON_CHARS) -> dict[str, str]:
    """Read a headers JSON object of string values; anything else raises ``InvalidMessageError`` with a reason."""
    value = loads_bounded(text, what="headers", max_chars=max_chars, max_depth=1)
    return headers_from_json(value)


def headers_from_json(value: Any) -> dict[str, str]:
    """Check an already parsed headers value: an object whose values are all strings."""
    if not isinstance(value, dict):
        raise InvalidMessageError(f"headers: a JSON {type(value).__name__}, not an object")
    for key, item in value.items():
        if not isinstance(item, str):
            raise InvalidMessageError(f"headers: {key[:100]!r} has a JSON {type(item).__name__}, not a string")
    return value
