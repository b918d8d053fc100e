"""Crash lab for recurring schedules on AWS: the real schedule timer on moto server, killed at every step of a pass.

``soak``: schedules of several kinds (every minute, every 5 minutes with jitter, hourly, daily, in three zones) run
for ``minutes`` compressed minutes, one timer run a minute on a manual clock. In a run, with ``probability``, the
timer dies (a ``BaseException`` nothing catches, its shard lease left held, as a vanished process leaves it) at one
of seven points: before its sends, mid-send (half of a ``SendMessageBatch`` run sent), after its sends (before the
advanced entries are written), before the batch is journaled written, before a consumed page is deleted, before a
row is settled, before the pass is marked done. Every ``SendMessageBatch`` entry is recorded (occurrence id, send
time, ``DelaySeconds``) before it leaves. At the end clean runs settle, and the lab checks:

* every occurrence due by then was sent (0 lost), none became visible before its fire time (0 early);
* an occurrence sent twice was sent in a run that died after sending it and before its batch was journaled
  written (the one window where SQS, which keeps no id for a delayed message, takes a second copy): duplicates are
  counted and each must be explained by a death; the receive helpers' effectively-once handling keyed on the id
  drops them at the consumer (docs/schedules.md, "On AWS").

``race``: ``timers`` timers run at once, every minute, with no deaths: 0 duplicates (the shard leases).
``outage``: the timer down ``days`` days, then one run: per catch-up policy, every missed occurrence either fired
late (once) or recorded as missed, exactly as the core's ``plan_catch_up`` says.

Run (starts its own moto server; prints JSON; exit 1 on a loss, an early or an unexplained duplicate)::

    .venv/bin/python -m tests.reliability.schedulelab --minutes 600 --schedules 60 --probability 0.3
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from delayed_delivery.aws.schedules.sends import OccurrenceSender
from delayed_delivery.aws.schedules.store import DynamoDbScheduleStore
from delayed_delivery.aws.schedules.timer import ScheduleTimer
from delayed_delivery.clock import ManualClock
from delayed_delivery.delivery import DELIVERY_HEADER, decode_delivery
from delayed_delivery.schedules.catchup import CatchUp, CatchUpPolicy, plan_catch_up
from delayed_delivery.schedules.model import MessageTemplate, Schedule, ScheduleDefinition
from delayed_delivery.schedules.occurrences import expand, utc_text

__all__ = ["POINTS", "LabResult", "outage", "race", "soak"]

START = datetime(2031, 3, 3, 6, 0, tzinfo=UTC)
TABLE = "schedulelab"
#: The lease outlives one run but not two (runs are a minute apart).
LEASE_SECONDS = 50.0
LEAD = 120
POINTS = (
    "before_send",
    "mid_send",
    "after_send",
    "before_written",
    "before_delete",
    "before_settle",
    "before_finish",
)
KINDS = (
    ("rate(1 minutes)", "UTC", 0),
    ("*/5 * * * *", "Europe/Berlin", 90),
    ("0 * * * *", "America/New_York", 0),
    ("*/2 * * * *", "Asia/Kolkata", 30),
    ("30 6 * * *", "Europe/Berlin", 0),
)


class Killed(BaseException):
    """The timer process dies here (nothing catches it)."""


@dataclass
class LabResult:
    """What one lab run saw."""

    kind: str
    runs: int = 0
    schedules: int = 0
    crashes: dict[str, int] = field(default_factory=dict)
    expected: int = 0
    sent: int = 0
    distinct: int = 0
    lost: int = 0
    early: int = 0
    duplicates: int = 0
    unexplained_duplicates: int = 0
    #: Sent, but not an occurrence due by the end (a missed one fired, or one beyond the lead).
    unexpected: int = 0
    missed_recorded: int = 0
    missed_expected: int = 0
    fired_late_expected: int = 0
    seconds: float = 0.0
    lost_ids: list[str] = field(default_factory=list)

    @property
    def sound(self) -> bool:
        """Nothing lost, nothing early, every duplicate explained by a death."""
        return self.lost == 0 and self.early == 0 and self.unexplained_duplicates == 0 and self.unexpected == 0


class Sends:
    """Every SendMessageBatch entry the timer's client sends: (id, sent at, DelaySeconds, run)."""

    def __init__(self, sqs: Any, clock: ManualClock) -> None:
        self.clock = clock
        self.entries: list[tuple[str, float, int, int]] = []
        self.run = 0
        self.lock = threading.Lock()
        sqs.meta.events.register("before-parameter-build.sqs.SendMessageBatch", self._keep)

    def _keep(self, params: dict[str, Any], **_: Any) -> None:
        if str(params["QueueUrl"]).endswith("/errors"):
            return
        at = self.clock.now().timestamp()
        with self.lock:
            for e in params["Entries"]:
                header = e["MessageAttributes"][DELIVERY_HEADER]["StringValue"]
                oid = decode_delivery(header).message_id or ""
                self.entries.append((oid, at, int(e.get("DelaySeconds", 0)), self.run))


class Faults:
    """Seeded deaths at the timer's steps: at most one a run, in a run picked with ``probability``."""

    def __init__(self, seed: int, probability: float) -> None:
        self.random = random.Random(seed)
        self.probability = probability
        self.armed: str | None = None
        self.crashes: Counter[str] = Counter()
        self.lock = threading.Lock()

    def arm(self) -> None:
        """Pick this run's death point (or none)."""
        self.armed = self.random.choice(POINTS) if self.random.random() < self.probability else None

    def hit(self, point: str) -> bool:
        """Whether to die at ``point`` now (then disarmed)."""
        with self.lock:
            if self.armed == point:
                self.armed = None
                self.crashes[point] += 1
                return True
            return False

    def wrap(self, obj: Any, name: str, point: str) -> None:
        real: Callable[..., Any] = getattr(obj, name)

        def step(*args: Any, **kwargs: Any) -> Any:
            if self.hit(point):
                raise Killed(point)
            return real(*args, **kwargs)

        setattr(obj, name, step)

    def wrap_mid_send(self, sender: OccurrenceSender) -> None:
        real = sender._send

        def send(url: str, entries: list[Any], what: str) -> Any:
            if len(entries) > 1 and self.hit("mid_send"):
                real(url, entries[: len(entries) // 2], what)
                raise Killed("mid_send")
            return real(url, entries, what)

        sender._send = send  # type: ignore[method-assign]


def _clients(endpoint: str) -> tuple[Any, Any]:
    import boto3
    from botocore.config import Config

    config = Config(connect_timeout=5, read_timeout=60, retries={"mode": "standard", "max_attempts": 3})
    kw: dict[str, Any] = {"endpoint_url": endpoint, "region_name": "us-east-1", "aws_access_key_id": "x",
                          "aws_secret_access_key": "x", "config": config}  # fmt: skip
    return boto3.client("dynamodb", **kw), boto3.client("sqs", **kw)


def _setup(endpoint: str, clock: ManualClock) -> tuple[DynamoDbScheduleStore, Any]:
    dynamodb, sqs = _clients(endpoint)
    for name in ("reports", "errors"):
        sqs.create_queue(QueueName=name)
    store = DynamoDbScheduleStore(dynamodb, TABLE, clock=clock, lease_seconds=LEASE_SECONDS, wait_seconds=5)
    store.setup_infrastructure()
    return store, sqs


def _schedules(
    store: DynamoDbScheduleStore, count: int, start: datetime, catch_up: CatchUp | None = None
) -> list[Schedule]:
    made = []
    for n in range(count):
        expression, zone, jitter = KINDS[n % len(KINDS)]
        definition = ScheduleDefinition(expression, start=start, zone=zone, jitter_seconds=jitter,
                                        catch_up=catch_up or CatchUp())  # fmt: skip
        schedule = Schedule.new(f"lab-{n:04d}", definition, MessageTemplate("reports", f"occurrence of {n}".encode()))
        store.create(schedule)
        made.append(schedule)
    return made


def _timer(store: DynamoDbScheduleStore, sqs: Any, clock: ManualClock, owner: str) -> ScheduleTimer:
    sender = OccurrenceSender(sqs, "errors", clock, send_threads=2)
    return ScheduleTimer(store, sender, clock, lead_seconds=LEAD, shard_threads=4, owner=owner, margin_seconds=5)


def _horizon(now: datetime) -> datetime:
    """What a pass at ``now`` sends: occurrences firing before the end of the minute holding ``now + LEAD``."""
    return (now + timedelta(seconds=LEAD)).replace(second=0, microsecond=0) + timedelta(minutes=1)


def _expected(schedules: list[Schedule], until: datetime, after: datetime | None = None) -> dict[str, float]:
    """Occurrence id -> fire time (epoch s) of every occurrence firing before ``until`` (nominal after ``after``)."""
    out: dict[str, float] = {}
    for s in schedules:
        d = s.definition
        begin = d.start if after is None else max(d.start, after + timedelta(microseconds=1))
        for o in expand(d.recurrence(), begin, None, schedule_id=s.schedule_id, max_jitter=d.jitter_seconds):
            if o.fire_at >= until:
                break
            assert o.id is not None
            out[o.id] = o.fire_at.timestamp()
    return out


def _judge(result: LabResult, sends: Sends, expected: dict[str, float], crashed_runs: set[int]) -> LabResult:
    ids = Counter(oid for oid, *_ in sends.entries)
    result.expected, result.sent, result.distinct = len(expected), len(sends.entries), len(ids)
    result.lost_ids = sorted(set(expected) - set(ids))[:20]
    result.lost = len(set(expected) - set(ids))
    result.early = sum(1 for oid, at, delay, _ in sends.entries if oid in expected and at + delay < expected[oid])
    result.duplicates = sum(n - 1 for n in ids.values())
    result.unexpected = len(set(ids) - set(expected))
    by_id: dict[str, list[int]] = {}
    for oid, _, _, run in sends.entries:
        by_id.setdefault(oid, []).append(run)
    result.unexplained_duplicates = sum(
        len(runs) - 1 - min(len(runs) - 1, sum(1 for r in runs if r in crashed_runs)) for runs in by_id.values()
    )
    return result


def soak(
    endpoint: str, *, schedules: int = 24, minutes: int = 40, probability: float = 0.3, seed: int = 1
) -> LabResult:
    """Deaths at every step of the timer's passes (module docstring)."""
    began = time.monotonic()
    clock = ManualClock(START)
    store, sqs = _setup(endpoint, clock)
    made = _schedules(store, schedules, START + timedelta(minutes=1))
    sends = Sends(sqs, clock)
    faults = Faults(seed, probability)
    crashed: set[int] = set()
    result = LabResult("soak", schedules=schedules)
    for minute in range(minutes + 4):  # the last runs are clean: they settle what deaths left
        clock.set(START + timedelta(minutes=minute, seconds=7))
        sends.run = minute
        timer = _timer(store, sqs, clock, owner=f"timer-{minute}")  # a fresh process each run
        steps: list[tuple[Any, str, str]] = [
            (timer.sender, "send", "before_send"),
            (store, "put_pages", "after_send"),
            (store.leases, "written", "before_written"),
            (store, "delete_page", "before_delete"),
            (store, "write_row", "before_settle"),
            (store.leases, "finish", "before_finish"),
        ]
        for obj, name, point in steps:
            faults.wrap(obj, name, point)
        faults.wrap_mid_send(timer.sender)
        if minute < minutes:
            faults.arm()
        else:
            faults.armed = None
        try:
            timer.run()
        except Killed:
            crashed.add(minute)
        finally:
            for obj, name in ((store, "put_pages"), (store, "delete_page"), (store, "write_row"),
                              (store.leases, "written"), (store.leases, "finish")):  # fmt: skip
                vars(obj).pop(name, None)  # the next process starts clean
        result.runs += 1
    result.crashes = dict(faults.crashes)
    _judge(result, sends, _expected(made, _horizon(clock.now())), crashed)
    result.seconds = round(time.monotonic() - began, 1)
    return result


def race(endpoint: str, *, schedules: int = 16, minutes: int = 15, timers: int = 2) -> LabResult:
    """``timers`` timers run at the same moments; the leases keep each shard to one: no duplicate."""
    began = time.monotonic()
    clock = ManualClock(START)
    store, sqs = _setup(endpoint, clock)
    made = _schedules(store, schedules, START + timedelta(minutes=1))
    sends = Sends(sqs, clock)
    result = LabResult("race", schedules=schedules)
    for minute in range(minutes):
        clock.set(START + timedelta(minutes=minute, seconds=7))
        gate = threading.Barrier(timers)

        def one(n: int, m: int = minute, gate: threading.Barrier = gate) -> None:
            gate.wait()
            _timer(store, sqs, clock, owner=f"racer-{n}-{m}").run()

        threads = [threading.Thread(target=one, args=(n,)) for n in range(timers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        result.runs += timers
    _judge(result, sends, _expected(made, _horizon(clock.now())), set())
    result.seconds = round(time.monotonic() - began, 1)
    return result


def outage(endpoint: str, policy: CatchUpPolicy, *, days: int = 3, schedules: int = 4) -> LabResult:
    """Down ``days`` days, then one run: what fired late and what was recorded missed, against ``plan_catch_up``."""
    began = time.monotonic()
    clock = ManualClock(START)
    store, sqs = _setup(endpoint, clock)
    rule = CatchUp(policy, 86_400, 1000)
    made = []
    for n in range(schedules):
        expression = ("0 * * * *", "*/30 * * * *")[n % 2]
        definition = ScheduleDefinition(expression, start=START, zone="Europe/Berlin", catch_up=rule)
        schedule = Schedule.new(f"out-{policy}-{n}", definition, MessageTemplate("reports", b"x"))
        store.create(schedule)
        made.append(schedule)
    sends = Sends(sqs, clock)
    recovered = START + timedelta(days=days, minutes=17)
    clock.set(recovered)
    _timer(store, sqs, clock, owner="after-outage").run()
    result = LabResult(f"outage-{policy}", runs=1, schedules=schedules)
    expected: dict[str, float] = {}
    for s in made:
        plan = plan_catch_up(s.definition.recurrence(), START - timedelta(microseconds=1), recovered,
                             s.definition.catch_up)  # fmt: skip
        expected.update((f"{s.schedule_id}@{utc_text(f.nominal)}", f.nominal.timestamp()) for f in plan.fire_late)
        result.missed_expected += len(plan.missed)
        stored = store.get(s.schedule_id)
        result.missed_recorded += stored.missed if stored else 0
    result.fired_late_expected = len(expected)
    expected.update(_expected(made, _horizon(recovered), after=recovered))  # ahead, inside the lead
    _judge(result, sends, expected, set())
    result.seconds = round(time.monotonic() - began, 1)
    return result


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--minutes", type=int, default=600)
    p.add_argument("--schedules", type=int, default=60)
    p.add_argument("--probability", type=float, default=0.3)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--days", type=int, default=3)
    a = p.parse_args()
    from tests.fixtures.moto import _moto_executable
    from tests.fixtures.services import ServiceProcess, free_port

    port = free_port()
    service = ServiceProcess("moto", [_moto_executable(), "-H", "127.0.0.1", "-p", str(port)], [port])
    service.start()
    endpoint = f"http://127.0.0.1:{port}"
    results = []
    try:
        results.append(soak(endpoint, schedules=a.schedules, minutes=a.minutes, probability=a.probability,
                            seed=a.seed))  # fmt: skip
        print(json.dumps(asdict(results[-1])), file=sys.stderr, flush=True)
        _reset(endpoint)
        results.append(race(endpoint))
        for policy in CatchUpPolicy:
            _reset(endpoint)
            results.append(outage(endpoint, policy, days=a.days))
    finally:
        service.stop()
    print(json.dumps([{**asdict(r), "sound": r.sound} for r in results], indent=2))
    return 0 if all(r.sound for r in results) else 1


def _reset(endpoint: str) -> None:
    import urllib.request

    request = urllib.request.Request(f"{endpoint}/moto-api/reset", method="POST", data=b"")
    with urllib.request.urlopen(request, timeout=10) as reply:
        assert reply.status == 200


if __name__ == "__main__":
    raise SystemExit(main())
