"""Fixed structured-log keys, shared by every adapter so one query finds everything."""

from __future__ import annotations

MESSAGE_ID = "message_id"
DESTINATION = "destination"
DUE_AT = "due_at"
LATENESS_S = "lateness_s"
ATTEMPT = "attempt"
FAILURE_COUNT = "failure_count"
REASON = "reason"
BREAKER = "breaker"
BREAKER_STATE = "breaker_state"
EVENT = "event"
CLOUD = "cloud"
HOP = "hop"
REMAINING_DELAY_S = "remaining_delay_s"
BATCH_SIZE = "batch_size"
SHARD = "shard"

#: Values of the ``event`` key.
EVENT_DISPATCHED = "dispatched"
EVENT_DUPLICATE = "already_removed"
EVENT_RETRY = "dispatch_failed"
EVENT_ERROR_QUEUE = "moved_to_error_queue"
EVENT_STORED = "stored"
EVENT_BREAKER = "breaker"
EVENT_REQUEUED = "requeued"
EVENT_FORWARDED = "forwarded"
