"""Fixed structured-log keys, shared by every adapter so one query finds everything."""

from __future__ import annotations

MESSAGE_ID = "message_id"
DESTINATION = "destination"
DUE_AT = "due_at"
LATENESS_S = "lateness_s"
#: Seconds release control added to a message (its slot after its due time), apart from ``lateness_s``.
RELEASE_LAG_S = "release_lag_s"
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
PARK_S = "park_s"
SHARD = "shard"
#: Recurring schedules: the schedule, occurrence ids (a list, at most 100 a line), how many, the cursor.
SCHEDULE_ID = "schedule_id"
OCCURRENCE_IDS = "occurrence_ids"
COUNT = "count"
CURSOR = "cursor"

#: Values of the ``event`` key.
EVENT_DISPATCHED = "dispatched"
EVENT_DUPLICATE = "already_removed"
EVENT_SUPERSEDED = "superseded"
#: A fetched message not sent because its claim had (nearly) run out: another dispatcher may have it now.
EVENT_CLAIM_RAN_OUT = "claim_ran_out"
EVENT_RETRY = "dispatch_failed"
EVENT_ERROR_QUEUE = "moved_to_error_queue"
EVENT_STORED = "stored"
EVENT_BREAKER = "breaker"
EVENT_REQUEUED = "requeued"
EVENT_FORWARDED = "forwarded"
EVENT_CANCELLED = "cancelled"
EVENT_RESCHEDULED = "rescheduled"
EVENT_CANCELLATION_UNAVAILABLE = "cancellation_records_unavailable"
EVENT_PARKED = "parked"
EVENT_CONSUMED = "consumed"
#: Effectively-once helpers: a result recorded without its value, a retried record, a hold that ended mid-effect.
EVENT_RESULT_NOT_STORED = "result_not_stored"
EVENT_RECORD_RETRY = "record_retry"
EVENT_HOLD_ENDED = "hold_ended"
#: Recurring schedules: occurrences written as messages, recorded as missed, a timer that lost the cursor race.
EVENT_SCHEDULE_MATERIALIZED = "schedule_materialized"
EVENT_SCHEDULE_MISSED = "schedule_missed"
#: Azure burst path (#34): a timer run's end (with ``OVERRUN_S``: seconds past its budget), a removal given up (its
#: messages are sent again), a placed copy that could not be withdrawn (it may arrive twice).
EVENT_TIMER_RUN = "timer_run"
EVENT_REMOVAL_FAILED = "removal_failed"
EVENT_PLACE_NOT_WITHDRAWN = "place_not_withdrawn"
OVERRUN_S = "overrun_s"
#: A placer's run that ended with rows of its lead still unplaced (``BEHIND_S``: how far inside the lead the earliest
#: of them is due; 0 when it caught up).
EVENT_PLACEMENT_LAG = "placement_lag"
BEHIND_S = "behind_s"
EVENT_SCHEDULE_RACE_LOST = "schedule_race_lost"
EVENT_SCHEDULE_FAILED = "schedule_failed"
#: ``long_delay_route = auto`` chose the time-bucket tier, which is not deployed: the message took the FIFO route.
EVENT_ROUTE_FALLBACK = "route_fallback"

#: Keys of the ``consumed`` line (a consumer's receive helper).
SENT_AT = "sent_at"
ROUTE = "route"
DELAY_S = "delay_s"
CONSUMER_LATENESS_S = "consumer_lateness_s"
#: A recurring occurrence's nominal instant (``YYYY-MM-DDThh:mm:ssZ``) on its ``consumed`` line, beside
#: ``SCHEDULE_ID``; null for any other message (lines logged before #35 have neither key).
OCCURRENCE = "occurrence"
