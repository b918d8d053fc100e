"""The error queue's reduced form (aws/errorqueue.py), one writer for the requeue function and the tier's timer."""

from __future__ import annotations

import base64
import json

from hypothesis import given
from hypothesis import strategies as st

from delayed_delivery.aws.errorqueue import REDUCED_FORMAT, Poison, reduced_body, reduced_entry
from delayed_delivery.aws.sqs import message_size


@given(raw=st.binary(max_size=3_000), room=st.integers(0, 4_000), reason=st.text(max_size=80))
def test_a_reduced_body_fits_its_room_and_keeps_a_prefix_of_the_body(raw: bytes, room: int, reason: str) -> None:
    body = reduced_body("id-1", json.dumps(reason)[1:-1], raw, room)
    document = json.loads(body)
    kept = base64.b64decode(document["body"])
    assert document["format"] == REDUCED_FORMAT and document["id"] == "id-1" and document["size"] == len(raw)
    assert raw.startswith(kept) and document["truncated"] is (len(kept) < len(raw))
    if kept:  # something of the body was kept only because it fits
        assert len(body.encode("utf-8")) <= room
    assert body.isascii()


def test_a_reduced_entry_fits_the_error_queue_with_its_headers() -> None:
    poison = Poison("m-1", "é" * 300_000, "too large", "orders")
    entry = reduced_entry("0", poison, "2031-01-01T00:00:00+00:00", 262_144, "1 MB")
    size = message_size(entry["MessageBody"], entry["MessageAttributes"])
    assert 200 * 1024 - 8 < size <= 200 * 1024  # cut to the room, within one base64 quantum of it
    document = json.loads(entry["MessageBody"])
    assert document["truncated"] is True and document["size"] == 600_000
