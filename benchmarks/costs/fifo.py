"""The parked FIFO route counted per step at moto: per park, per hop, the first send and the final send.

One run is ``benchmarks.sqs_hops.measure`` in its parked configuration (sender and handler packed, parks of at most
``PARK_MAX`` compressed seconds) with a ``StepCounter`` installed: every request the local event sources and the
real handler make is put in the step it belongs to, and divided by the number of times that step happened (the
handler's own outcomes, per message). Nothing is fitted: a park is its ``ChangeMessageVisibilityBatch`` plus the
receive that brings the envelope back; a hop is the FIFO send, the receive of the new message and its delete.
"""

from __future__ import annotations

from typing import Any

from benchmarks.costs.steps import StepCounter, poller_scope
from benchmarks.sqs_hops import measure
from delayed_delivery.aws.packing import DEFAULT_PACK_BYTES

__all__ = ["BODY_BYTES", "PARK_HOP", "PARK_MAX", "PARK_VISIBILITY", "measure_parked", "parked_steps"]

BODY_BYTES = 1024
#: Compressed hop (s), longest park (s), the FIFO queues' visibility timeout (s).
PARK_HOP, PARK_MAX, PARK_VISIBILITY = 1, 12, 1


def measure_parked(messages: int, endpoints: int, delay_hops: int, endpoint: str) -> dict[str, Any]:
    """One parked delivery run, end to end, with its requests counted per step (``counts["steps"]``)."""
    counter = StepCounter(poller_scope)
    with counter.installed():
        counts = measure(
            messages,
            endpoints,
            delay_hops,
            PARK_HOP,
            endpoint,
            deliver=True,
            pack_bytes=DEFAULT_PACK_BYTES,
            body_bytes=BODY_BYTES,
            sender_pack_bytes=DEFAULT_PACK_BYTES,
            max_park_seconds=PARK_MAX,
            visibility_timeout=PARK_VISIBILITY,
        )
    counts["steps"] = counter.snapshot()
    return counts


def parked_steps(counts: dict[str, Any]) -> dict[str, float]:
    """Billed requests per park, per hop and per message (first send, final send) of one parked run, counted."""
    billed: dict[str, float] = counts["steps"]["billed"]
    calls: dict[str, float] = counts["steps"]["calls"]
    n = float(counts["messages"])
    outcomes = counts["outcomes"]
    parks = float(outcomes.get("parked", 0))
    hops = float(outcomes.get("requeued", 0) + outcomes.get("forwarded", 0))
    visibility, back = billed.get("hop.visibility", 0.0), billed.get("hop.receive_fifo_return", 0.0)
    send, arrive, delete = (billed.get(f"hop.{s}", 0.0) for s in ("send_fifo", "receive_fifo", "delete_fifo"))
    return {
        "parks_per_message": parks / n,
        "hops_per_message": hops / n,
        "per_park": (visibility + back) / parks if parks else 0.0,
        "visibility_per_park": visibility / parks if parks else 0.0,
        "return_receive_per_park": back / parks if parks else 0.0,
        "per_hop": (send + arrive + delete) / hops if hops else 0.0,
        "fifo_send_per_hop": send / hops if hops else 0.0,
        "arrival_receive_per_hop": arrive / hops if hops else 0.0,
        "delete_per_hop": delete / hops if hops else 0.0,
        "first_send_per_message": billed.get("client.send_fifo", 0.0) / n,
        "final_send_per_message": billed.get("hop.send", 0.0) / n,
        "empty_receives_per_run": float(calls.get("hop.receive_fifo_empty", 0)),
        "lookups_per_run": float(billed.get("hop.lookup", 0.0)),
        "lost": float(counts["messages"] - (counts["delivered"] or 0)),
        "duplicates": float(counts["duplicates"] or 0),
    }
