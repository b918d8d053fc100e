"""Recurring schedules (core, standard library only): cron, rate and at in any time zone, with named DST rules.

Modules, one concern each: ``cron`` (the 5-field grammar), ``expressions`` (cron, rate, at), ``days`` (which days of
a month match; the day rule), ``zones`` (IANA zones from the tzdata wheel), ``dst`` (gap/fold policies, presets,
notes), ``recurrence`` (the evaluator: occurrences as a set of instants in ``[start, end)``), ``occurrences`` (ids
and deterministic jitter), ``catchup`` (after downtime), ``model`` and ``ports`` (a stored schedule and the store
port), ``memory`` and ``sqlite_store`` (two stores), ``materializer`` (occurrences as delayed messages, exactly once
each), ``operations`` (pause, resume, backfill), ``loop`` (inside a dispatcher's loop). See docs/schedules.md.
"""
