"""The dispatcher's heartbeat: a small status blob in the lease container, written at the end of every timer run.

``azure verify`` reads it to tell whether the timer runs: a heartbeat older than a few minutes means the function
app is stopped, not published, or failing before it finishes a run. Format (version 1, a JSON object):
``{"v": 1, "finished_at": ISO-8601 UTC, "enabled": bool, "shards": int, "dispatched": int, "error_queue": int}``.
Writing never fails a run: a lost heartbeat only makes verify say the timer looks stopped.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from azure.core.exceptions import AzureError, ResourceNotFoundError

from .. import logfields as lf
from ..clock import utc
from ..errors import DelayedDeliveryError
from .sdk_errors import translate

__all__ = ["HEARTBEAT_BLOB", "Heartbeat", "read_heartbeat", "write_heartbeat"]

#: The heartbeat's blob name inside the lease container.
HEARTBEAT_BLOB = "dispatcher-heartbeat.json"
_VERSION = 1
_log = logging.getLogger("delayed_delivery.azure.heartbeat")


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """What the last finished timer run said."""

    finished_at: datetime
    enabled: bool
    shards: int
    dispatched: int
    error_queue: int

    def to_json(self) -> str:
        """The blob's content."""
        return json.dumps(
            {
                "v": _VERSION,
                "finished_at": utc(self.finished_at).isoformat(),
                "enabled": self.enabled,
                "shards": self.shards,
                "dispatched": self.dispatched,
                "error_queue": self.error_queue,
            },
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, text: str) -> Heartbeat:
        """Read a heartbeat; ``ValueError`` for anything that is not one."""
        data: Any = json.loads(text)
        if not isinstance(data, dict) or data.get("v") != _VERSION:
            raise ValueError("not a version-1 heartbeat")
        finished = datetime.fromisoformat(str(data["finished_at"]))
        if finished.tzinfo is None:
            raise ValueError("finished_at has no time zone")
        return cls(
            finished_at=utc(finished),
            enabled=bool(data["enabled"]),
            shards=int(data["shards"]),
            dispatched=int(data["dispatched"]),
            error_queue=int(data["error_queue"]),
        )


def write_heartbeat(container: Any, heartbeat: Heartbeat) -> None:
    """Overwrite the heartbeat blob (one try, 5 s at most: never holds up a run); a failure is logged, never raised."""
    try:
        data = heartbeat.to_json().encode("utf-8")
        container.upload_blob(HEARTBEAT_BLOB, data, overwrite=True, retry_total=0, timeout=5)
    except AzureError as exc:
        _log.warning(
            "heartbeat not written",
            extra={lf.EVENT: "heartbeat_failed", lf.REASON: " ".join(str(exc).split())[:300]},
        )


def read_heartbeat(container: Any) -> Heartbeat | None:
    """The last heartbeat, or None when there is none; ``DelayedDeliveryError`` when it cannot be read."""
    try:
        text = container.download_blob(HEARTBEAT_BLOB).readall().decode("utf-8")
    except ResourceNotFoundError:
        return None
    except AzureError as exc:
        raise translate(exc, f"reading {HEARTBEAT_BLOB}") from exc
    try:
        return Heartbeat.from_json(text)
    except (ValueError, KeyError, TypeError) as exc:
        raise DelayedDeliveryError(f"{HEARTBEAT_BLOB} is not a heartbeat this version reads: {exc}") from None
