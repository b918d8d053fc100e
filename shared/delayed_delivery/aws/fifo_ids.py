"""FIFO ids of the ``-delay.fifo`` route: each hop's deduplication id, and the hop and first send time it carries.

``<id>:<fp>[.<first send ms, base 36>]:<hop>``, where ``fp`` is the content fingerprint (``packing.py``): the sender
writes hop 0 without the send time, each hop of the requeue function the next hop with it (docs/identity.md).
"""

from __future__ import annotations

import hashlib
import re

from .packing import FINGERPRINT_CHARS

__all__ = ["deduplication_id", "hop_of", "sent_of"]

#: SQS's longest MessageDeduplicationId.
_MAX_DEDUP = 128
_TAG = re.compile(rf"^[0-9a-f]{{{FINGERPRINT_CHARS}}}(?:\.([0-9a-z]{{1,12}}))?$")
_DIGITS36 = "0123456789abcdefghijklmnopqrstuvwxyz"


def deduplication_id(message_id: str, hop: int, fingerprint: str | None = None, sent_ms: int | None = None) -> str:
    """The per-hop deduplication id ``<id>:<fp>[.<sent ms, base 36>]:<hop>`` (``<id>:<hop>`` without ``fp``).

    A SHA-256 prefix replaces ids too long for 128 characters. ``hop_of`` reads the hop of every form.
    """
    tag = "" if fingerprint is None else fingerprint + ("" if sent_ms is None else "." + _base36(sent_ms))
    suffix = f":{tag}:{hop}" if tag else f":{hop}"
    prefix = message_id
    if len(prefix) + len(suffix) > _MAX_DEDUP:
        prefix = _hashed(message_id)
    return prefix + suffix


def sent_of(dedup_id: str | None, message_id: str) -> int | None:
    """The first send time (epoch ms) a hop's deduplication id of ``message_id`` carries, else ``None``."""
    if not dedup_id:
        return None
    rest, sep, tail = dedup_id.rpartition(":")
    if not sep or not tail.isdigit():
        return None
    for prefix in (message_id, _hashed(message_id)):
        if rest.startswith(prefix + ":"):
            found = _TAG.match(rest[len(prefix) + 1 :])
            if found is not None and found.group(1) is not None:
                return int(found.group(1), 36)
    return None


def _hashed(message_id: str) -> str:
    return hashlib.sha256(message_id.encode("utf-8")).hexdigest()


def _base36(value: int) -> str:
    digits = ""
    while True:
        value, digit = divmod(value, 36)
        digits = _DIGITS36[digit] + digits
        if not value:
            return digits


def hop_of(dedup_id: str | None) -> int:
    """The hop number inside a deduplication id made by ``deduplication_id`` (0 when it has none)."""
    if not dedup_id:
        return 0
    _, sep, tail = dedup_id.rpartition(":")
    return int(tail) if sep and tail.isdigit() else 0
