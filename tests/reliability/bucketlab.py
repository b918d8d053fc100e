"""Crash injection for the S3 time-bucket tier (sender -> ingest -> S3 buckets -> timer -> destination) on moto.

Time is compressed (fine buckets 1 s, coarse 5 s, dispatch lead 2 s) and simulated: one ``ManualClock`` drives the
sender, the ingest step, the timer and the dispatch workers; each tick the lab polls the ingest queue once
(``BucketIngest.process``, then ``DeleteMessageBatch`` of the records written), runs the timer (``BucketTimer.run``),
runs a dispatch worker for each task on the dispatch queue (``PartitionWorker.run``, then the task's delete), advances
the clock by a second and drains the destination queue. Most rounds send ten messages due at random moments; one
round in ``BURST_EVERY`` sends a burst of ``BURST`` messages due in the same second, more than the timer sends itself
(``bucket_inline_max_messages`` 20), so it is planned and sent by the workers in pieces of 16 KiB of lines. A
worker's deadline comes after ``WORKER_STEPS`` of its checks, so every partition of a burst is cut over several
invocations (each continuation enqueues its task again).

Every boto3 call of the ingest step, the lab's ingest poller, the timer and the workers goes through ``LabClient``,
which names the step the call belongs to (ingest write, ingest delete, cascade lease/write/delete, dispatch
lease/send/delete, lease release, plan write, task enqueue, a worker's progress record, send, seen write (what a piece
met: a delta, or the snapshot at a hand-over), write-back and continuation) and can die at it, **before** the request
or **after** it took effect. The crash is a ``BaseException`` nothing catches; once dead, every further call of that
"process" dies too (so no ``finally`` gets to release a lease), the objects are rebuilt, the ingest records and
dispatch tasks held come back (their visibility timeout passes) and the clock moves past the leases. One fault point
is armed at a time, in a seeded shuffled cycle; the armed point is reached by the work the lab sends: while a point of
the burst path (plan write, task enqueue, a worker's steps) is armed and no burst is on its way, the next round sends
one. A point not reached within ``QUIET_TICKS`` ticks stops the soak with ``LabStalled`` (a lab bug, never a silent
wait). A partition no worker holds is handed out again after ``STALL_SECONDS`` simulated seconds (the timer's
constant, compressed like the leases).

The episodes that are not crashes (``EPISODES``, #31) are armed in the same cycle; ``restart_big_piece`` kills one
worker deep in a partition of big bodies, and the lab then charges the restarted workers deadline steps for what they
read, so reading again the lines before the progress is cut over several invocations; each must get further: its
progress, or the place the next worker restores what was met to (snapshot and deltas up to the progress), must move.
The lab expires no plan while that reading again is under way (the upgrade gap, docs/buckets.md), only after.

Checked: every message reaches the destination at least once (lost = 0), never early (each successful dispatch's
simulated time plus its ``DelaySeconds`` is at or after the message's due time), nothing reaches the error queue.
Duplicates are counted at the destination. Each repeated dispatch is put down to a crash: the first one since the
message's previous dispatch (the death of the process that sent it before recording it), else the first crash after
the lab's poller first received the message's ingest record (a record ingested twice lands in two objects); a
repeat with neither is put down to ``no_crash`` (a bug). ``duplicates_by_crash`` holds how many each crash caused:
at most the messages the dying process had in hand: what it had handed to the destination since its last record
(a worker's progress record after a piece, the timer's delete of a bucket's objects), counted at the crash
(``crash_in_hand``). A piece is cut at 16 KiB of lines, so it holds 15 burst lines plus any short regular lines the
plan holds before them (16-17 seen); the fixed ``piece_messages`` (15, burst lines only) is reported beside it.
A point not reached within ``QUIET_TICKS`` is a finding (``stalls``: seed, target, tick, what had not been sent): the
soak moves on to the next target, after ``MAX_STALLS`` it stops injecting, and it still settles and counts its losses.

Soak: ``python -m tests.reliability.bucketlab --crashes 1000`` (starts its own moto server; prints a table, writes
``benchmarks/results/bucketlab.json``). The JSON is written as the soak goes, after every crash or fault (each job
its figures so far beside it, ``<json>.part-seed<N>.json``, and the merged figures at ``--json``, each atomically:
a temporary file renamed), with ``"complete": false``: a soak cut short leaves its figures. Lost and delivered are
counted only when a soak ends (``complete`` true); before that, ``awaiting`` says how many have not arrived yet.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import math
import os
import random
import statistics
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from unittest import mock

from botocore.exceptions import ClientError

from delayed_delivery.aws.cancellations import DynamoDbCancellationStore, ensure_cancellation_table
from delayed_delivery.aws.release_calendar import ReleaseCalendar, ensure_release_table
from delayed_delivery.aws.sender import DelayedSend, SqsDelayedSender
from delayed_delivery.aws.settings import SqsSettings
from delayed_delivery.aws.tier import timer as timer_module
from delayed_delivery.aws.tier.config import BucketTierConfig, TierSettings
from delayed_delivery.aws.tier.held import HeldArea
from delayed_delivery.aws.tier.ingest import BucketIngest
from delayed_delivery.aws.tier.ingest_format import decode_ingest
from delayed_delivery.aws.tier.operations import TierOperations
from delayed_delivery.aws.tier.plan_store import PlanStore, SqsTaskQueue, seen_name
from delayed_delivery.aws.tier.provision import ensure_bucket_tier
from delayed_delivery.aws.tier.store import S3BucketStore
from delayed_delivery.aws.tier.timer import BucketTimer
from delayed_delivery.aws.tier.timer_work import Tally
from delayed_delivery.aws.tier.worker import PartitionWorker, WorkerResult
from delayed_delivery.aws.tier.worker_seen import PartitionSeen
from delayed_delivery.cancellations import CancellationCache
from delayed_delivery.clock import ManualClock
from delayed_delivery.delivery import epoch_ms, from_epoch_ms
from delayed_delivery.errors import MessageInFlightError
from delayed_delivery.release import ReleaseRates
from delayed_delivery.settings import DelayedDeliverySettings
from delayed_delivery.timebuckets.format import BucketMessage, encoded_line_bytes
from delayed_delivery.timebuckets.plans import DispatchTask, decode_task
from tests.reliability.crashlab import InjectedCrash

REGION = "us-east-1"
STEPS = (
    "ingest_write",
    "ingest_delete",
    "cascade_lease",
    "cascade_write",
    "cascade_delete",
    "dispatch_lease",
    "dispatch_send",
    "dispatch_delete",
    "lease_release",
    "plan_write",
    "plan_enqueue",
    "worker_progress",
    "worker_send",
    "worker_seen",
    "worker_enqueue",
)
POINTS = tuple(f"{when}_{step}" for step in STEPS for when in ("before", "after"))
#: Faults that are not crashes (#31), armed in the same cycle as the crash points: the destination refuses the
#: sends (AccessDenied, its KMS key) or throttles them (503) for ``EPISODE_CALLS`` calls; a release cap of
#: ``CAPPED_RATE`` a second (slots ``CAPPED_HORIZON`` s ahead) under the next burst; an operator's cancel or
#: reschedule of a burst message racing its worker (made just before a worker's progress record); the lifecycle of
#: ``plans/`` removing a planned burst's plan and progress while it is half sent.
DESTINATION_FAULTS = {
    "refused_access": ("AccessDenied", 403),
    "refused_kms": ("KMS.AccessDeniedException", 400),
    "throttled_503": ("ServiceUnavailable", 503),
}
EPISODES = (
    *DESTINATION_FAULTS,
    "release_cap",
    "operator_cancel",
    "operator_reschedule",
    "plan_expiry",
    "restart_big_piece",
)
#: A destination episode fails this many sends to the destination, then the destination heals.
EPISODE_CALLS = 3
#: The release cap of the ``release_cap`` episode, and how far ahead its calendar gives slots (compressed SQS 900 s).
CAPPED_RATE = 5.0
UNCAPPED_RATE = 100_000.0
CAPPED_HORIZON = 4
#: Ticks a release cap lasts at most once its burst went out under it.
CAP_TICKS = 30
#: Simulated seconds a timer's lease holds; after a crash the clock moves past it so the bucket is taken over.
LEASE_SECONDS = 2.0
#: Points after which the timer sends a message again: sent, then died before its object was deleted.
REPEATING_POINTS = (
    "after_dispatch_send",
    "before_dispatch_delete",
    "after_dispatch_rewrite",
    "before_dispatch_rewrite",
)
START = datetime(2030, 1, 1, tzinfo=UTC)
#: One send round in this many is a burst of ``BURST`` messages due in the same second.
BURST_EVERY = 4
BURST = 60
#: The bodies of a burst: about 1 KiB, so a piece (16 KiB of lines) holds about 14 of them.
BURST_BODY = 1_000
#: A burst is due 3 s to this many seconds ahead: in a fine bucket at once, or in a coarse one cascaded first.
BURST_MAX_DELAY = 15
#: Bursts are due in the seconds that are multiples of this, regular messages never (so a piece holds burst lines).
BURST_SECONDS = 3
#: The timer sends a bucket itself up to this many messages; the lab's pieces are 16 KiB of lines.
INLINE_MAX_MESSAGES = 20
PIECE_BYTES = 16 * 1024
#: A worker invocation's deadline: after this many of its checks (objects opened, pieces), it goes on in another.
#: A partition of 30 burst messages needs at least three (one object, two full pieces), so each is continued.
WORKER_STEPS = 2
#: Bursts on their way at most while a point of the burst path is armed (so it is reached sooner).
BURSTS_ARMED = 2
#: Simulated seconds before the timer hands out again a partition nobody holds (the product's 180 s, compressed).
STALL_SECONDS = 2 * LEASE_SECONDS
#: The steps only a burst reaches (planned buckets and their workers).
BURST_STEPS = ("plan_write", "plan_enqueue", "worker_progress", "worker_send", "worker_seen", "worker_enqueue")
#: Regular messages due in one second at most (a bucket the timer sends itself).
REGULAR_PER_SECOND = 10
#: The destination is drained every this many ticks (arrivals are only counted; the final drain takes the rest).
DRAIN_EVERY = 10
#: Ticks without the armed point firing before the soak records a stall (``LabStalled``) and moves on.
QUIET_TICKS = 600
#: Stalls after which a soak stops injecting (it still settles and counts its losses).
MAX_STALLS = 3
#: How far a reschedule episode moves its message (after its old due time: a later bucket, never a burst's second).
RESCHEDULE_SECONDS = 4
#: The ``restart_big_piece`` episode (#31, "a restart that cannot finish"): its bursts' bodies are this big, so a
#: partition holds about ``BURST // 2 * BIG_BODY / PIECE_BYTES`` pieces; one invocation with no deadline sends
#: ``KILL_AFTER`` of them and dies sending the next, before recording it (no seen snapshot written); while the
#: partition is restarted, every ``PIECE_BYTES`` a worker reads of an object costs it one step of its deadline, so
#: reading again the lines before the progress takes longer than one invocation (``WORKER_STEPS``). The kill also
#: takes the partition's deltas away (a partition under way before the workers wrote deltas), or nothing is read again.
BIG_BODY = 3_000
KILL_AFTER = 3


def lab_config(run: str) -> BucketTierConfig:
    """The compressed tier of tier.md (bucket and prefix ``lab``), with per-run queue names."""
    return BucketTierConfig(
        bucket_name=run,
        prefix="lab",
        settings=DelayedDeliverySettings(error_queue=f"{run}-errors"),
        cancellation_table=f"{run}-records",
        release_table=f"{run}-release",
        sqs_settings=SqsSettings(
            max_native_delay=2, fifo_queue_delay=2, long_delay_route="buckets", bucket_ingest_queue=f"{run}-ingest"
        ),
        tier_settings=TierSettings(
            bucket_fine_seconds=1,
            bucket_coarse_seconds=5,
            bucket_dispatch_lead_seconds=2,
            bucket_inline_max_messages=INLINE_MAX_MESSAGES,
            bucket_piece_bytes=PIECE_BYTES,
            bucket_partition_messages=30,
            bucket_dispatch_concurrency=3,
            bucket_dispatch_queue=f"{run}-dispatch",
        ),
    )


def piece_messages() -> int:
    """The most messages one crash may send again: a piece (it is sent once its lines reach ``PIECE_BYTES``; the
    shortest burst line gives the most), or a whole bucket the timer sends itself (``REGULAR_PER_SECOND``)."""
    line = encoded_line_bytes(_burst_message("m0", 0))
    return max(REGULAR_PER_SECOND, PIECE_BYTES // line + 1)


def _burst_message(message_id: str, due_ms: int) -> BucketMessage:
    return BucketMessage(message_id, "orders", _body(message_id, BURST_BODY).encode(), due_ms, {}, 0, due_ms)


def _body(message_id: str, size: int) -> str:
    """A body that names its message first (arrivals are counted by it), padded to ``size``."""
    return f"{message_id} ".ljust(size, "x") if size else message_id


def client(service: str, endpoint: str) -> Any:
    """A boto3 client for the moto server at ``endpoint``."""
    import boto3

    return boto3.client(
        service, endpoint_url=endpoint, region_name=REGION, aws_access_key_id="testing", aws_secret_access_key="testing"
    )


class _CostlyBody:
    """An object's body whose reads cost the worker reading it one deadline step per ``PIECE_BYTES``."""

    def __init__(self, body: Any, lab: BucketLab) -> None:
        self._body, self._lab = body, lab

    def read(self, size: int = -1) -> bytes:
        data: bytes = self._body.read(size)
        self._lab.worker_steps += -(-len(data) // PIECE_BYTES)
        return data

    def close(self) -> None:
        self._body.close()


class LabStalled(RuntimeError):
    """The armed fault point was not reached for ``QUIET_TICKS`` ticks: the lab's work does not lead to it."""


class Faults:
    """The armed fault point of one lab "process"; once it fires, every later call of the process dies too."""

    def __init__(self, target: str | None, skip: int) -> None:
        self.target = target
        self.skip = skip
        self.fired: str | None = None
        #: The timer's phase, from the last lease it took (a fine write in a dispatch is a write-back).
        self.phase = "cascade"

    def point(self, step: str | None, when: str) -> None:
        """Die here if this is the armed point (or the process already died)."""
        if self.fired is not None:
            raise InjectedCrash(f"dead since {self.fired}")
        name = f"{when}_{step}"
        if step is None or name != self.target:
            return
        if self.skip > 0:
            self.skip -= 1
            return
        self.fired = name
        raise InjectedCrash(name)


class LabClient:
    """A boto3 client whose calls pass the fault points of their step, before and after the request."""

    def __init__(self, inner: Any, role: str, faults: Faults, lab: BucketLab) -> None:
        self._inner = inner
        self._role = role
        self._faults = faults
        self._lab = lab

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._inner, name)
        if not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            step = self._lab.step_of(self._role, name, kwargs, self._faults)
            self._faults.point(step, "before")
            self._lab.episode_before(self._role, step)
            reply = attr(*args, **kwargs)
            if step in ("dispatch_send", "worker_send", "operator_send"):
                self._lab.dispatched(kwargs, reply, self._role)
            self._lab.recorded(self._role, step)
            if self._role == "worker" and name == "get_object":
                reply = self._lab.charged(kwargs, reply)
            self._faults.point(step, "after")
            return reply

        return call


@dataclass(slots=True)
class LabResult:
    """What a crash run did; ``lost`` and ``early`` must be 0."""

    seed: int
    injected_crashes: int = 0
    crashes_by_point: dict[str, int] = field(default_factory=dict)
    messages: int = 0
    delivered: int = 0
    lost: int = 0
    early: int = 0
    duplicates: int = 0
    duplicates_by_point: dict[str, int] = field(default_factory=dict)
    #: How many duplicates each crash caused (its index in the crash log -> copies): at most one piece each.
    duplicates_by_crash: dict[int, int] = field(default_factory=dict)
    #: The duplicates of every crash, in crash order (zeros included): what the medians are taken over.
    per_crash: list[int] = field(default_factory=list)
    #: The point (or episode that killed) of every crash, in crash order beside ``per_crash``, and the tick it came
    #: at ("unknown" and -1 in a JSON written before they were recorded).
    crash_points: list[str] = field(default_factory=list)
    crash_ticks: list[int] = field(default_factory=list)
    #: Every fault that is not a crash, in order: its kind, tick and how many crashes came before it.
    fault_log: list[dict[str, Any]] = field(default_factory=list)
    #: The crashes that caused the most duplicates (at most ``WORST``), most first: seed, crash (its index in its own
    #: soak's crash log), point, tick, duplicates; what to reproduce when one is over the bound.
    worst_crashes: list[dict[str, Any]] = field(default_factory=list)
    #: Beside ``per_crash``: the messages the dying process had in hand at the crash (handed to the destination since
    #: its last record: the piece, or the bucket the timer sends itself); -1 in a JSON written before (judged by
    #: ``piece_messages`` then). Crashes that repeated more than that (must be 0), and more than ``piece_messages``.
    crash_in_hand: list[int] = field(default_factory=list)
    crashes_over_hand: int = 0
    crashes_over_fixed_bound: int = 0
    #: Findings: the armed point or episode not reached in ``QUIET_TICKS`` (seed, target, tick, what waited).
    stalls: list[dict[str, Any]] = field(default_factory=list)
    bursts: int = 0
    #: Dispatch tasks the workers ran (a task cut by a crash counts once per run).
    worker_runs: int = 0
    #: Duplicates per crash: the median and 99th percentile over every crash, the median over the crashes that
    #: caused any, and the most; and how many crashes caused any.
    duplicates_per_crash_median: float = 0.0
    duplicates_per_crash_p99: float = 0.0
    duplicates_per_crash_median_when_any: float = 0.0
    duplicates_per_crash_max: int = 0
    crashes_with_duplicates: int = 0
    #: Crashes at the points of the burst path (plan write, task enqueue, a worker's steps).
    burst_crashes: int = 0
    #: Worker invocations that stopped at their deadline and enqueued their task again.
    worker_continuations: int = 0
    #: The bound each crash must stay within: one piece (or a bucket the timer sends itself), in messages.
    piece_messages: int = 0
    #: Copies the timer found and skipped itself (the same id twice in one bucket).
    timer_duplicates_skipped: int = 0
    error_queue: int = 0
    #: Faults that are not crashes (#31): destination refusals and throttling, release caps, operators racing the
    #: workers, plans expired; by kind.
    faults: int = 0
    faults_by_kind: dict[str, int] = field(default_factory=dict)
    #: Operator episodes: cancels answered certain / not, reschedules answered moved (or left to the workers), in
    #: flight, already handed on; and certain cancels delivered anyway (must be 0).
    cancels_certain: int = 0
    cancels_uncertain: int = 0
    reschedules_moved: int = 0
    reschedules_in_flight: int = 0
    reschedules_already_sent: int = 0
    reschedules_by_record: int = 0
    certain_cancels_delivered: int = 0
    #: Messages a release cap held (written into its held area) and released from it.
    held_written: int = 0
    held_released: int = 0
    #: Restarts: lines read again before the progress, seen snapshots read, messages inherited from a lost plan.
    lines_reread: int = 0
    snapshots_read: int = 0
    inherited: int = 0
    #: Deltas (what one piece met, kept after it) read by restarted workers and later plans.
    deltas_read: int = 0
    #: In the figures of a soak still under way: messages not arrived yet (``lost`` is counted at the end).
    awaiting: int = 0
    #: The big-piece restart: invocations of the killed partition after the kill, those cut by their deadline while
    #: reading again, those that made no progress (must be 0), partitions finished after it.
    restart_runs: int = 0
    restart_cut_rereading: int = 0
    restart_stalled: int = 0
    restarts_finished: int = 0
    #: The fault point or episode armed now (progress lines).
    armed: str | None = None
    ticks: int = 0
    simulated_seconds: float = 0.0
    seconds: float = 0.0
    leftovers: list[str] = field(default_factory=list)


class BucketLab:
    """One tier on moto (bucket, ingest queue, error queue, destination ``orders``) under a shuffled fault cycle."""

    def __init__(self, endpoint: str, seed: int, *, window: int = 40, max_delay: int = 20) -> None:
        self.rng = random.Random(seed)
        self.run = f"bl{uuid.uuid4().hex[:8]}"
        self.config = lab_config(self.run)
        self.settings = self.config.settings
        self.s3, self.sqs = client("s3", endpoint), client("sqs", endpoint)
        tier = ensure_bucket_tier(self.s3, self.sqs, self.config)
        self.ingest_url, self.error_url = tier.ingest_url, tier.error_url
        self.dest_url = self.sqs.create_queue(QueueName=f"{self.run}-orders")["QueueUrl"]
        self.dispatch_name = self.config.tier_settings.bucket_dispatch_queue
        self.dispatch_url = self.sqs.create_queue(QueueName=self.dispatch_name)["QueueUrl"]
        self.held_tasks: list[str] = []
        self.rounds = 0
        self.worker_steps = 0
        self.clock = ManualClock(START)
        self.sender = SqsDelayedSender(self.sqs, self.settings, sqs_settings=self.config.sqs_settings, clock=self.clock)
        self.window, self.max_delay = window, max_delay
        self.result = LabResult(seed)
        self.due_ms: dict[str, int] = {}
        self.sent_ok: Counter[str] = Counter()
        self.arrived: Counter[str] = Counter()
        self.crash_log: list[str] = []
        #: What the timer and the worker handed to the destination since their last record (a piece, a bucket).
        self.in_hand: dict[str, set[str]] = {"timer": set(), "worker": set()}
        #: Crash-log lengths at each message's send, first dispatch and latest dispatch.
        self.send_mark: dict[str, int] = {}
        self.first_mark: dict[str, int] = {}
        self.crash_mark: dict[str, int] = {}
        self.ingest_mark: dict[str, int] = {}
        #: Seconds (epoch) regular messages are due in, with their counts, and the seconds bursts are due in.
        self.regular_seconds: Counter[int] = Counter()
        self.burst_seconds: set[int] = set()
        #: The ids of each burst not yet dispatched whole.
        self.bursts_on_their_way: list[list[str]] = []
        self.quiet_ticks = 0
        self.cycle: list[str] = []
        self.held: list[str] = []
        # Faults that are not crashes (#31): the records table, the release calendar, an operator.
        dynamodb = client("dynamodb", endpoint)
        assert self.config.cancellation_table is not None and self.config.release_table is not None
        ensure_cancellation_table(dynamodb, self.config.cancellation_table)
        ensure_release_table(dynamodb, self.config.release_table)
        self.records = DynamoDbCancellationStore(dynamodb, self.config.cancellation_table, consistent=True)
        self.calendar = ReleaseCalendar(
            dynamodb, self.config.release_table, self._rates(UNCAPPED_RATE), horizon=CAPPED_HORIZON
        )
        # the operator's SQS calls pass the lab too (never a fault point): a reschedule sends a message it moves
        # within SQS's 900 s straight to its queue (``Relocator._place``); unseen, that message stayed "unsent", its
        # burst pending for ever, and two such bursts stopped every later burst (seed 71's release_cap stall)
        self.operations = TierOperations(
            S3BucketStore.from_config(self.s3, self.config),
            LabClient(self.sqs, "operator", Faults(None, 0), self),
            self.records,
            self.settings,
            sqs_settings=self.config.sqs_settings,
            clock=self.clock,
        )
        self.episode_calls = 0
        self.episode_fired = False
        #: Operator episodes: cancelled for certain, maybe cancelled.
        self.certain_cancelled: set[str] = set()
        self.maybe_cancelled: set[str] = set()
        #: The big-piece restart: whether the running invocation is the one to kill, its progress writes so far,
        #: and the partition killed (bucket, plan, partition) while it is restarted; the plans, read past the faults.
        self.killing = False
        self.kill_writes = 0
        #: Whether the worker's last seen write was a whole snapshot (not a delta): loaded by the next worker wherever
        #: it stands (2259ec4), so a kill at the record after it leaves nothing to read again.
        self.last_seen_whole = False
        self.restart_watch: tuple[str, int, int] | None = None
        #: The killed partition's task and its progress at the kill (its workers read the lines before it again).
        self.restart_task: DispatchTask | None = None
        self.kill_place = (0, 0)
        self.plans = PlanStore(S3BucketStore.from_config(self.s3, self.config))
        self.build(None)

    # --- the "process": ingest, its poller and the timer, rebuilt after every crash ---------------------------------
    def build(self, target: str | None) -> None:
        """Fresh clients, store, ingest step and timer, with ``target`` armed."""
        self.faults = Faults(target, self.rng.randint(0, 2))
        s3_ingest = LabClient(self.s3, "ingest", self.faults, self)
        s3_timer = LabClient(self.s3, "timer", self.faults, self)
        self.poller = LabClient(self.sqs, "poller", self.faults, self)
        self.ingest = BucketIngest(
            S3BucketStore.from_config(s3_ingest, self.config), self.sqs, self.settings, self.clock
        )
        store = S3BucketStore.from_config(s3_timer, self.config)
        sqs_timer = LabClient(self.sqs, "timer", self.faults, self)
        owner = f"timer-{len(self.crash_log)}"
        tier = self.config.tier_settings
        cache = CancellationCache(self.records, 0)
        self.timer = BucketTimer(
            store,
            sqs_timer,
            self.settings,
            self.clock,
            owner=owner,
            lease_seconds=LEASE_SECONDS,
            tier=tier,
            queue=SqsTaskQueue(sqs_timer, self.dispatch_name),
            cancellations=cache,
            release=self.calendar,
        )
        s3_worker = LabClient(self.s3, "worker", self.faults, self)
        sqs_worker = LabClient(self.sqs, "worker", self.faults, self)
        self.worker = PartitionWorker(
            S3BucketStore.from_config(s3_worker, self.config),
            sqs_worker,
            self.settings,
            self.clock,
            tier=tier,
            owner=f"worker-{len(self.crash_log)}",
            queue=SqsTaskQueue(sqs_worker, self.dispatch_name),
            lease_seconds=LEASE_SECONDS,
            margin_seconds=0,
            monotonic=self._steps,
            cancellations=cache,
            release=self.calendar,
        )

    def next_target(self) -> str:
        """The next fault point (or episode) of the seeded shuffled cycle."""
        if not self.cycle:
            self.cycle = [*POINTS, *EPISODES]
            self.rng.shuffle(self.cycle)
        target = self.cycle.pop()
        self.episode_calls, self.episode_fired = (EPISODE_CALLS if target in DESTINATION_FAULTS else 0), False
        if target == "release_cap":
            self.calendar.rates = self._rates(CAPPED_RATE)
        return target

    def _rates(self, rate: float) -> ReleaseRates:
        return ReleaseRates.of({f"{self.run}-orders": rate})

    # --- faults that are not crashes (#31) -------------------------------------------------------------------------
    def episode(self) -> str | None:
        """The armed episode, if one is armed."""
        target = self.faults.target
        return target if target in EPISODES else None

    def fault(self, kind: str) -> None:
        """Count one injected fault (an episode firing)."""
        if not self.episode_fired:
            self.episode_fired = True
            self.result.faults += 1
            self.result.faults_by_kind[kind] = self.result.faults_by_kind.get(kind, 0) + 1
            fault = {"kind": kind, "tick": self.result.ticks, "after_crashes": len(self.crash_log)}
            self.result.fault_log.append(fault)
            self.quiet_ticks = 0

    def next_episode(self) -> None:
        """The armed episode is over: arm the next point in the same process (nothing died)."""
        self.calendar.rates = self._rates(UNCAPPED_RATE)
        self.faults.target = self.next_target()
        self.faults.skip = self.rng.randint(0, 2)

    def episode_before(self, role: str, step: str | None) -> None:
        """Before a call: a destination episode refuses or throttles a send to the destination; an operator episode
        acts just before a worker's progress record (its worker is between two pieces)."""
        kind = self.episode()
        if kind in DESTINATION_FAULTS and step in ("dispatch_send", "worker_send") and self.episode_calls > 0:
            self.episode_calls -= 1
            self.fault(kind)
            if self.episode_calls == 0:
                self.next_episode()
            code, status = DESTINATION_FAULTS[kind]
            error = {"Code": code, "Message": f"{kind}: the lab's destination fault"}
            raise ClientError({"Error": error, "ResponseMetadata": {"HTTPStatusCode": status}}, "SendMessageBatch")
        if kind == "restart_big_piece" and role == "worker" and step == "worker_progress" and self.killing:
            self.kill_writes += 1  # the claim, then one record per piece: die before recording piece KILL_AFTER + 1
            # not after a whole snapshot (the partition's last piece, done): the restart would load it and read
            # nothing again (seed 7's CI cycle: "1 runs, 0 cut while reading again"); the next partition is tried
            if self.kill_writes > KILL_AFTER + 1 and not self.last_seen_whole:
                self.fault(kind)
                self.faults.fired = kind  # the process is dead: every later call of it dies too
                raise InjectedCrash(kind)
        operator = kind in ("operator_cancel", "operator_reschedule") and role == "worker"
        if operator and step == "worker_progress" and self.operator(str(kind)):
            self.fault(str(kind))
            self.next_episode()

    def operator(self, kind: str) -> bool:
        """Cancel or reschedule a burst message not yet sent, while its worker sends (whether one was there)."""
        gone = self.gone()
        waiting = [m for b in self.bursts_on_their_way for m in b if not self.sent_ok[m] and m not in gone]
        if not waiting:
            return False
        target = self.rng.choice(waiting)
        due = from_epoch_ms(self.due_ms[target]) or self.clock.now()
        if kind == "operator_cancel":
            self.cancel(target)
            self.cancel_far_ahead()
            return True
        # An overdue burst message still waiting moves from now: the tier refuses a new due time in the past.
        new_due = max(due, self.clock.now()) + timedelta(seconds=RESCHEDULE_SECONDS)
        old_ms, self.due_ms[target] = self.due_ms[target], epoch_ms(new_due)  # a send while it moves: by the new time
        try:
            moved = self.operations.reschedule(f"{self.run}-orders", target, new_due, current_due=due)
        except MessageInFlightError:
            self.result.reschedules_in_flight += 1  # its old time or its new one: checked against the old
            self.due_ms[target] = old_ms
            return True
        if moved.relocation.already_sent:
            self.result.reschedules_already_sent += 1
            self.due_ms[target] = old_ms
        elif moved.relocation.found:
            self.result.reschedules_moved += 1  # never before its new time, and once
        else:
            self.result.reschedules_by_record += 1  # not met in S3 (in a plan's hands): the record moves it
            self.due_ms[target] = old_ms
        return True

    def cancel(self, target: str) -> None:
        """An operator's cancel of ``target`` with its due time; a certain one must never arrive."""
        answer = self.operations.cancel(f"{self.run}-orders", target, due=from_epoch_ms(self.due_ms[target]))
        if answer.certain:
            self.certain_cancelled.add(target)
            self.result.cancels_certain += 1
        else:
            self.maybe_cancelled.add(target)
            self.result.cancels_uncertain += 1

    def cancel_far_ahead(self) -> None:
        """Cancel a message due beyond the cancel's reach too: the answer is certain."""
        beyond = epoch_ms(self.clock.now()) + int((self.operations.reach_seconds() + 1) * 1000)
        gone = self.gone()
        far = [m for m, due in self.due_ms.items() if not self.sent_ok[m] and m not in gone and due > beyond]
        if far:
            self.cancel(self.rng.choice(sorted(far)))

    def gone(self) -> set[str]:
        """Messages cancelled (for certain or maybe): not expected at the destination."""
        return self.certain_cancelled | self.maybe_cancelled

    def expire_plans(self) -> None:
        """The ``plan_expiry`` episode: once a planned burst has a partition's progress, ``plans/`` goes as the
        7-day lifecycle would take it."""
        if self.episode() != "plan_expiry" or self.rereading():
            # not while a big-piece restart reads again the lines before its progress at the kill (its deltas taken
            # away, as for a partition under way before the workers wrote deltas): its plan lost then, it repeats the
            # pieces since its snapshot (23 in seed 52), the gap of the upgrade docs/buckets.md describes; once caught
            # up the worker keeps a whole snapshot, and a plan lost after that repeats at most the piece in hand
            return
        pages = self.s3.get_paginator("list_objects_v2").paginate(Bucket=self.run, Prefix="lab/plans/")
        keys = [str(o["Key"]) for page in pages for o in page.get("Contents", [])]
        if any(k.count("/") > 3 for k in keys):  # <prefix>/plans/fine/<ISO>/<k>.json: a partition under way or done
            self.s3.delete_objects(Bucket=self.run, Delete={"Objects": [{"Key": k} for k in keys], "Quiet": True})
            self.fault("plan_expiry")
            self.next_episode()

    def rereading(self) -> bool:
        """Whether the big-piece restart's workers still read again the lines before the progress at the kill."""
        if self.restart_watch is None or self.restart_task is None:
            return False
        position = self._position(self.restart_task)
        return position is not None and not position[0] and position[2] < self.kill_place

    def release_cap_over(self) -> None:
        """The ``release_cap`` episode ends once the burst it capped is sent and nothing is held any more, or
        ``CAP_TICKS`` ticks after it fired (the cap lifted with messages still held: later runs release them)."""
        if self.episode() != "release_cap" or not self.episode_fired:
            return
        if self.quiet_ticks > CAP_TICKS or (
            not self.bursts_pending() and not list(HeldArea(self.timer.store).objects())
        ):
            self.next_episode()

    def step_of(self, role: str, op: str, kwargs: dict[str, Any], faults: Faults) -> str | None:
        """The step a call belongs to (``None``: not a fault point)."""
        if role == "ingest":
            return "ingest_write" if op == "put_object" else None
        if role == "poller":
            return "ingest_delete" if op == "delete_message_batch" else None
        if role == "worker":
            return self._worker_step(op, kwargs)
        if role == "operator":
            return "operator_send" if op == "send_message_batch" and kwargs.get("QueueUrl") == self.dest_url else None
        if op == "put_object" and "/plans/" in str(kwargs.get("Key", "")):
            return "plan_write"
        if op == "send_message_batch" and kwargs.get("QueueUrl") == self.dispatch_url:
            return "plan_enqueue"
        if op == "put_object":
            key = str(kwargs.get("Key", ""))
            if "/leases/" in key:
                faults.phase = "cascade" if "/leases/coarse/" in key else "dispatch"
                return f"{faults.phase}_lease"
            return "cascade_write" if faults.phase == "cascade" else "dispatch_rewrite"
        if op == "delete_objects":
            keys = [str(o["Key"]) for o in kwargs["Delete"]["Objects"]]
            return "cascade_delete" if any("/coarse/" in k for k in keys) else "dispatch_delete"
        if op == "delete_object":
            return "lease_release"
        if op == "send_message_batch":
            return "dispatch_send" if kwargs.get("QueueUrl") == self.dest_url else "error_send"
        return None

    def _worker_step(self, op: str, kwargs: dict[str, Any]) -> str | None:
        if op == "put_object":
            # what a piece met (a delta, or the snapshot at a hand-over), written after its sends and before the
            # progress that names it; a write-back is no fault point: the lab's sends never fail for a passing reason
            # (test_fanout covers it)
            key = str(kwargs.get("Key", ""))
            if "/seen/" in key:
                name = seen_name(key)
                self.last_seen_whole = name is not None and name.position is None
            return "worker_progress" if "/plans/" in key else "worker_seen" if "/seen/" in key else None
        if op == "send_message_batch":
            url = kwargs.get("QueueUrl")
            return "worker_send" if url == self.dest_url else "worker_enqueue" if url == self.dispatch_url else None
        return None

    def dispatched(self, request: dict[str, Any], reply: Any, role: str | None = None) -> None:
        """Check each entry SQS took: simulated now + DelaySeconds never before the due time; count repeats; the
        sender (``role``) holds it until its next record."""
        ok = {s["Id"] for s in reply.get("Successful", [])}
        now_ms = epoch_ms(self.clock.now())
        for entry in request["Entries"]:
            if entry["Id"] not in ok:
                continue
            message_id = entry["MessageBody"].split(" ", 1)[0]
            if role in self.in_hand:
                self.in_hand[role].add(message_id)
            if message_id in self.certain_cancelled:
                self.result.certain_cancels_delivered += 1
            if now_ms + int(entry.get("DelaySeconds", 0)) * 1000 < self.due_ms[message_id]:
                self.result.early += 1
            if self.sent_ok[message_id]:
                cause, index = self.cause(message_id)
                self.result.duplicates_by_point[cause] = self.result.duplicates_by_point.get(cause, 0) + 1
                self.result.duplicates_by_crash[index] = self.result.duplicates_by_crash.get(index, 0) + 1
            else:
                self.first_mark[message_id] = len(self.crash_log)
            self.sent_ok[message_id] += 1
            self.crash_mark[message_id] = len(self.crash_log)

    def recorded(self, role: str, step: str | None) -> None:
        """After a request took effect: a worker's progress record or the timer's delete of objects settles what it
        had sent."""
        if (role, step) in (("worker", "worker_progress"), ("timer", "dispatch_delete")):
            self.in_hand[role].clear()

    def cause(self, message_id: str) -> tuple[str, int]:
        """The crash a repeated dispatch is put down to, and its index in the crash log (-1: none; see the module
        docstring)."""
        since = self.crash_mark[message_id]
        if len(self.crash_log) > since:
            return self.crash_log[since], since
        ingested = self.ingest_mark.get(message_id, len(self.crash_log))
        if len(self.crash_log) > ingested:
            return self.crash_log[ingested], ingested
        return "no_crash", -1

    def burst_point_armed(self) -> bool:
        """Whether the armed fault point is on the burst path (only a planned bucket reaches it), or the armed
        episode needs a burst."""
        target = self.faults.target
        if target in ("release_cap", "restart_big_piece"):
            return not self.episode_fired  # one burst under the cap, then it drains and the episode ends
        if target in ("operator_cancel", "operator_reschedule", "plan_expiry"):
            return True
        return target is not None and target.split("_", 1)[1] in BURST_STEPS

    def bursts_pending(self) -> int:
        """How many bursts have messages not yet dispatched."""
        gone = self.gone()
        self.bursts_on_their_way = [
            b for b in self.bursts_on_their_way if any(not self.sent_ok[m] and m not in gone for m in b)
        ]
        return len(self.bursts_on_their_way)

    # --- one tick --------------------------------------------------------------------------------------------------
    def send_round(self) -> None:
        """Ten messages due 3 s to ``max_delay`` s (simulated, to the ms) from now, in one to three batches; with
        one round in ``BURST_EVERY``, a burst beside them when no burst is on its way; while a point of the burst
        path is armed, one each round up to ``BURSTS_ARMED`` on their way."""
        self.rounds += 1
        pending = self.bursts_pending()
        if (self.rounds % BURST_EVERY == 0 and not pending) or (self.burst_point_armed() and pending < BURSTS_ARMED):
            self.send_burst()
        start = self.result.messages
        ids = [f"m{n}" for n in range(start, start + 10)]
        now_ms = epoch_ms(self.clock.now())
        sends = []
        for message_id in ids:
            delay_ms = self._regular_delay(now_ms)
            delay = timedelta(milliseconds=delay_ms)
            self.due_ms[message_id] = now_ms + delay_ms
            self.regular_seconds[(now_ms + delay_ms) // 1000] += 1
            self.send_mark[message_id] = len(self.crash_log)
            sends.append(DelayedSend(f"{self.run}-orders", message_id, delay, message_id=message_id))
        cuts = sorted(self.rng.sample(range(1, 10), self.rng.randint(0, 2)))
        for first, last in zip([0, *cuts], [*cuts, 10], strict=True):
            self.sender.send_delayed_batch(sends[first:last]).raise_for_failures()
        self.result.messages += len(ids)

    def _regular_delay(self, now_ms: int) -> int:
        """A delay of 3 s to ``max_delay`` s (to the ms: sends go in waves) outside the bursts' seconds (multiples
        of ``BURST_SECONDS``), at most ``REGULAR_PER_SECOND`` messages a second (a bucket the timer sends itself)."""
        for _ in range(1_000):
            delay_ms = self.rng.randint(3_000, self.max_delay * 1_000)
            second = (now_ms + delay_ms) // 1000
            if second % BURST_SECONDS and self.regular_seconds[second] < REGULAR_PER_SECOND:
                return delay_ms
        raise LabStalled(f"no second with room for a regular message in {self.max_delay} s")

    def send_burst(self) -> None:
        """``BURST`` messages of about 1 KiB due in the same second, 3 s to ``BURST_MAX_DELAY`` s ahead, in a second
        kept for bursts (a multiple of ``BURST_SECONDS``, no other burst's)."""
        start = self.result.messages
        now_ms = epoch_ms(self.clock.now())
        for _ in range(1_000):
            delay_ms = self.rng.randint(3_000, BURST_MAX_DELAY * 1_000)
            second = (now_ms + delay_ms) // 1000
            if second % BURST_SECONDS == 0 and second not in self.burst_seconds:
                break
        else:
            raise LabStalled(f"no free second for a burst in {BURST_MAX_DELAY} s")
        self.burst_seconds.add(second)
        self.bursts_on_their_way.append([f"m{n}" for n in range(start, start + BURST)])
        sends = []
        for n in range(start, start + BURST):
            message_id = f"m{n}"
            self.due_ms[message_id] = now_ms + delay_ms
            self.send_mark[message_id] = len(self.crash_log)
            delay = timedelta(milliseconds=delay_ms)
            body = _body(message_id, BIG_BODY if self.episode() == "restart_big_piece" else BURST_BODY)
            sends.append(DelayedSend(f"{self.run}-orders", body, delay, message_id=message_id))
        for first in range(0, BURST, 30):
            self.sender.send_delayed_batch(sends[first : first + 30]).raise_for_failures()
        self.result.messages += BURST
        self.result.bursts += 1
        if self.episode() == "release_cap":
            self.fault("release_cap")  # this burst goes out under the cap

    def _steps(self) -> float:
        """The workers' clock for their deadline: one step each time a worker asks (simulated, not real time)."""
        self.worker_steps += 1
        return float(self.worker_steps)

    def run_workers(self) -> None:
        """What the dispatch function's event source does: hand each task waiting to a worker, delete it after.

        Each invocation's deadline comes after ``WORKER_STEPS`` of its checks (an object or a piece each), so big
        partitions stop near their deadline, record where they are and enqueue their task again."""
        reply = self.sqs.receive_message(QueueUrl=self.dispatch_url, MaxNumberOfMessages=3, VisibilityTimeout=60)
        messages = reply.get("Messages", [])
        self.held_tasks = [m["ReceiptHandle"] for m in messages]  # all come back after a crash
        for message in messages:
            self.result.worker_runs += 1
            task = decode_task(message["Body"])
            deadline = self.worker_steps + WORKER_STEPS + 0.5
            self.killing, self.kill_writes = self.episode() == "restart_big_piece" and not self.episode_fired, 0
            if self.killing:
                deadline += 1_000_000  # no deadline: it sends piece after piece, then dies (see ``KILL_AFTER``)
                self.restart_watch = (task.bucket.iso, task.plan_ms, task.partition)
            watched = self.restart_watch == (task.bucket.iso, task.plan_ms, task.partition) and not self.killing
            before = self._position(task) if watched else None
            self.in_hand["worker"].clear()
            try:
                done = self.worker.run(task, deadline=deadline)
                self.in_hand["worker"].clear()
            finally:
                if self.killing and not self.episode_fired:
                    self.restart_watch = None  # done before it could die: the next burst's task is tried
                elif self.killing:
                    self._forget_deltas(task)
                    position = self._position(task)
                    self.restart_task, self.kill_place = task, position[1] if position is not None else (0, 0)
                self.killing = False
            if watched:
                self._judge_restart(task, before, done)
            self._worker_figures(done)
            self.sqs.delete_message(QueueUrl=self.dispatch_url, ReceiptHandle=message["ReceiptHandle"])
            self.held_tasks.remove(message["ReceiptHandle"])

    def _forget_deltas(self, task: DispatchTask) -> None:
        """The killed partition's deltas go (as if it was under way when the workers were upgraded, before deltas):
        the next workers must read again the lines before its progress."""
        prefix = f"{self.plans.seen_root}/{task.bucket.iso}/{task.plan_ms}-{task.partition}-"
        pages = self.s3.get_paginator("list_objects_v2").paginate(Bucket=self.run, Prefix=prefix)
        keys = [str(item["Key"]) for page in pages for item in page.get("Contents", [])]
        self.plans.store.delete(keys)

    def charged(self, request: dict[str, Any], reply: Any) -> Any:
        """While a killed partition is restarted, a worker's reads of bucket objects cost it deadline steps."""
        if self.restart_watch is None or "/plans/" in str(request.get("Key", "")):
            return reply
        return {**reply, "Body": _CostlyBody(reply["Body"], self)}

    def _position(self, task: DispatchTask) -> tuple[bool, tuple[int, int], tuple[int, int]] | None:
        """The partition's progress (done, place) and the place its next worker restores what it met to (its seen
        snapshot and deltas up to the progress, loaded as a worker loads them); None when its plan is gone.

        Not the snapshot's own place: a snapshot past the progress (its worker died after writing it, before the
        record) is not loaded, and the snapshot a restarted worker writes over it, behind it, is a step forward."""
        plan = self.plans.read_plan(task.bucket)
        if plan is None or plan.created_ms != task.plan_ms:
            return None
        progress = self.plans.read_progress(plan, task.partition).progress
        place = (progress.object, progress.line) if progress is not None else (0, 0)
        restored = PartitionSeen(self.plans, plan, task.partition, Tally(WorkerResult)).restore(place)
        return (progress is not None and progress.done, place, restored)

    def _judge_restart(
        self, task: DispatchTask, before: tuple[bool, tuple[int, int], tuple[int, int]] | None, done: WorkerResult
    ) -> None:
        """An invocation of the killed partition: it must get further (its progress, or where the next worker restores
        to) or finish."""
        after = self._position(task)
        if before is None or after is None:
            self.restart_watch = None  # the plan is gone (finished, expired): nothing left to restart
            return
        if done.skipped or done.lost_partition:
            return  # not its turn (held by another, a stale task): no invocation of the partition
        result = self.result
        result.restart_runs += 1
        if done.continued and done.lines_reread and not done.dispatched:
            result.restart_cut_rereading += 1
        if not (after[0] or after[1] > before[1] or after[2] > before[2]):
            result.restart_stalled += 1
        if after[0]:
            result.restarts_finished += 1
            self.restart_watch = None

    def _worker_figures(self, done: WorkerResult) -> None:
        result = self.result
        result.worker_continuations += done.continued
        result.lines_reread += done.lines_reread
        result.snapshots_read += done.snapshots_read
        result.deltas_read += done.deltas_read
        result.inherited += done.inherited
        result.held_written += done.held_written

    def ingest_once(self) -> None:
        """What the event source does: receive up to 10 ingest records, hand them over, delete those written."""
        reply = self.poller.receive_message(
            QueueUrl=self.ingest_url, MaxNumberOfMessages=10, VisibilityTimeout=60, MessageAttributeNames=["All"]
        )
        messages = reply.get("Messages", [])
        if not messages:
            return
        self.held = [m["ReceiptHandle"] for m in messages]
        for m in messages:
            for item in decode_ingest(m["Body"]):
                if isinstance(item, BucketMessage):
                    self.ingest_mark.setdefault(item.message_id, len(self.crash_log))
        records = [
            {"messageId": m["MessageId"], "body": m["Body"], "messageAttributes": _lambda_attributes(m)}
            for m in messages
        ]
        result = self.ingest.process(records)
        done = [m for m in messages if m["MessageId"] not in result.failures]
        if done:
            entries = [{"Id": str(n), "ReceiptHandle": m["ReceiptHandle"]} for n, m in enumerate(done)]
            self.poller.delete_message_batch(QueueUrl=self.ingest_url, Entries=entries)
        self.held = []

    def drain(self) -> None:
        """Receive and delete everything visible at the destination, counting arrivals by body (the id)."""
        while True:
            reply = self.sqs.receive_message(QueueUrl=self.dest_url, MaxNumberOfMessages=10)
            messages = reply.get("Messages", [])
            if not messages:
                return
            for m in messages:
                self.arrived[m["Body"].split(" ", 1)[0]] += 1
            entries = [{"Id": str(n), "ReceiptHandle": m["ReceiptHandle"]} for n, m in enumerate(messages)]
            self.sqs.delete_message_batch(QueueUrl=self.dest_url, Entries=entries)

    def tick(self) -> None:
        """Ingest, timer, workers, a simulated second, drain; a crash rebuilds the process with the next point armed."""
        self.result.ticks += 1
        try:
            self.ingest_once()
            self.expire_plans()
            self.in_hand["timer"].clear()
            ran = self.timer.run()
            self.in_hand["timer"].clear()  # a run that returned settled what it sent (else a repeat is "no_crash")
            self.result.timer_duplicates_skipped += ran.duplicates_skipped
            self.result.held_written += ran.held_written
            self.result.held_released += ran.held_released
            self.run_workers()
            self.release_cap_over()
        except InjectedCrash:
            self.crashed()
            self.quiet_ticks = 0
        else:
            self.quiet_ticks += 1
            if self.episode() in DESTINATION_FAULTS and self.episode_fired and self.quiet_ticks > QUIET_TICKS // 2:
                self.next_episode()  # fired, and the lab sent nothing more to fail: over
            elif self.faults.target is not None and self.quiet_ticks > QUIET_TICKS:
                raise LabStalled(
                    f"{self.faults.target} (after {self.faults.skip} more call(s)) not reached in {QUIET_TICKS} ticks"
                )
        self.clock.advance(1)
        if self.result.ticks % DRAIN_EVERY == 0:
            self.drain()

    def crashed(self) -> None:
        """Count the crash, let the held records' visibility pass and the lease expire, rebuild."""
        point = self.faults.fired or "unknown"
        self.crash_log.append(point)  # an episode's kill too: the repeats it causes are put down to it
        self.result.crash_ticks.append(self.result.ticks)
        self.result.crash_in_hand.append(len(self.in_hand["timer"] | self.in_hand["worker"]))
        for held in self.in_hand.values():
            held.clear()
        if point not in EPISODES:
            self.result.injected_crashes += 1
            self.result.crashes_by_point[point] = self.result.crashes_by_point.get(point, 0) + 1
            if point.split("_", 1)[1] in BURST_STEPS:
                self.result.burst_crashes += 1
        for handle in self.held:
            with contextlib.suppress(ClientError):  # deleted before the crash
                self.sqs.change_message_visibility(QueueUrl=self.ingest_url, ReceiptHandle=handle, VisibilityTimeout=0)
        for handle in self.held_tasks:
            with contextlib.suppress(ClientError):
                self.sqs.change_message_visibility(
                    QueueUrl=self.dispatch_url, ReceiptHandle=handle, VisibilityTimeout=0
                )
        self.held, self.held_tasks = [], []
        self.clock.advance(LEASE_SECONDS)
        self.calendar.rates = self._rates(UNCAPPED_RATE)
        self.build(self.next_target())

    def stalled(self, exc: LabStalled) -> None:
        """Record the stall as a finding, with what had not been sent, and arm the next target."""
        now_ms = epoch_ms(self.clock.now())
        gone = self.gone()
        waiting = sorted((m for m in self.due_ms if not self.sent_ok[m] and m not in gone), key=self.due_ms.__getitem__)
        oldest = [{"id": m, "overdue_s": (now_ms - self.due_ms[m]) / 1000, "arrived": self.arrived[m]} for m in waiting]
        self.result.stalls.append({
            "seed": self.result.seed,
            "target": self.faults.target,
            "tick": self.result.ticks,
            "after_crashes": len(self.crash_log),
            "reason": str(exc),
            "unsent_regular": self.unsent_regular(),
            "bursts_pending": self.bursts_pending(),
            "held_objects": len(list(HeldArea(self.timer.store).objects())),
            "unsent": len(waiting),
            "oldest_unsent": oldest[:8],
        })  # fmt: skip
        self.quiet_ticks = 0
        self.next_episode()

    def unsent(self) -> int:
        """Messages not yet dispatched successfully (but the cancelled ones)."""
        gone = self.gone()
        return sum(1 for message_id in self.due_ms if not self.sent_ok[message_id] and message_id not in gone)

    def unsent_regular(self) -> int:
        """Regular messages (not of a burst) not yet dispatched successfully."""
        bursts = {m for b in self.bursts_on_their_way for m in b} | self.gone()
        return sum(1 for m in self.due_ms if not self.sent_ok[m] and m not in bursts)


def _lambda_attributes(message: dict[str, Any]) -> dict[str, Any]:
    return {
        name: {"stringValue": value.get("StringValue"), "dataType": value.get("DataType")}
        for name, value in message.get("MessageAttributes", {}).items()
    }


def soak(
    endpoint: str,
    crashes: int,
    seed: int = 1,
    *,
    window: int = 40,
    timeout: float = 3600.0,
    progress: Callable[[LabResult], None] | None = None,
    first: Sequence[str] = (),
    checkpoint: Callable[[LabResult], None] | None = None,
) -> LabResult:
    """Crash the tier ``crashes`` times, then run it without faults until everything arrived (or ``timeout``);
    ``first``: points or episodes armed before the shuffled cycle; ``checkpoint``: given the figures so far after
    every crash or fault."""
    with _compressed_stall():
        return _soak(
            endpoint,
            crashes,
            seed,
            window=window,
            timeout=timeout,
            progress=progress,
            first=first,
            checkpoint=checkpoint,
        )


@contextlib.contextmanager
def _compressed_stall() -> Iterator[None]:
    """The timer hands out an abandoned partition after the lab's ``STALL_SECONDS``, not the product's 180 s."""
    with mock.patch.object(timer_module, "STALL_SECONDS", STALL_SECONDS):
        yield


def _soak(
    endpoint: str,
    crashes: int,
    seed: int,
    *,
    window: int,
    timeout: float,
    progress: Callable[[LabResult], None] | None,
    first: Sequence[str],
    checkpoint: Callable[[LabResult], None] | None = None,
) -> LabResult:
    started = time.monotonic()
    lab = BucketLab(endpoint, seed, window=window)
    lab.cycle = list(reversed(first))
    lab.build(lab.next_target())
    last = started
    done = 0
    while lab.result.injected_crashes + lab.result.faults < crashes and time.monotonic() - started < timeout:
        try:
            if lab.unsent_regular() < lab.window:
                lab.send_round()
            lab.tick()
        except LabStalled as exc:  # a finding, not the end of the soak's figures
            lab.stalled(exc)
            if progress is not None:
                print(f"seed {seed}: STALL {lab.result.stalls[-1]}", file=sys.stderr, flush=True)
            if checkpoint is not None:
                checkpoint(_so_far(lab, started))
            if len(lab.result.stalls) >= MAX_STALLS:
                break
            continue
        if checkpoint is not None and lab.result.injected_crashes + lab.result.faults != done:
            done = lab.result.injected_crashes + lab.result.faults
            checkpoint(_so_far(lab, started))
        if progress is not None and time.monotonic() - last > 10:
            lab.result.armed = lab.faults.target
            lab.result.crash_points = list(lab.crash_log)
            progress(lab.result)
            last = time.monotonic()
    lab.calendar.rates = lab._rates(UNCAPPED_RATE)
    lab.build(None)
    settle_ticks = 0
    while lab.unsent() and settle_ticks < 10 * lab.max_delay:  # after the timeout too: a soak ends sound
        lab.tick()
        settle_ticks += 1
    _final_drain(lab, deadline=time.monotonic() + 10)
    return _finish(lab, started)


def _final_drain(lab: BucketLab, deadline: float) -> None:
    """Wait (real time) for the last DelaySeconds to pass and drain."""
    while time.monotonic() < deadline:
        lab.drain()
        expected = [m for m in lab.due_ms if m not in lab.gone()]
        if all(lab.arrived[m] for m in expected) and sum(lab.arrived.values()) >= sum(lab.sent_ok.values()):
            return
        time.sleep(0.2)


def _so_far(lab: BucketLab, started: float) -> LabResult:
    """The figures so far, a copy: repeats per crash up to now; ``lost`` stays 0 (counted at the end), ``awaiting``
    counts what has not arrived yet."""
    result = copy.deepcopy(lab.result)
    result.delivered = sum(1 for m in lab.due_ms if lab.arrived[m])
    result.awaiting = sum(1 for m in lab.due_ms if not lab.arrived[m] and m not in lab.gone())
    result.duplicates = sum(lab.arrived.values()) - result.delivered
    result.simulated_seconds = (lab.clock.now() - START).total_seconds()
    result.seconds = round(time.monotonic() - started, 1)
    result.per_crash = [result.duplicates_by_crash.get(n, 0) for n in range(len(lab.crash_log))]
    result.crash_points = list(lab.crash_log)
    return _summarised(result)


def _finish(lab: BucketLab, started: float) -> LabResult:
    result = lab.result
    result.delivered = sum(1 for m in lab.due_ms if lab.arrived[m])
    missing = [m for m in lab.due_ms if not lab.arrived[m] and m not in lab.gone()]
    result.lost = len(missing)
    result.leftovers = missing[:20]
    result.duplicates = sum(lab.arrived.values()) - result.delivered
    attrs = lab.sqs.get_queue_attributes(QueueUrl=lab.error_url, AttributeNames=["ApproximateNumberOfMessages"])
    result.error_queue = int(attrs["Attributes"]["ApproximateNumberOfMessages"])
    result.simulated_seconds = (lab.clock.now() - START).total_seconds()
    result.seconds = round(time.monotonic() - started, 1)
    result.per_crash = [result.duplicates_by_crash.get(n, 0) for n in range(len(lab.crash_log))]
    result.crash_points = list(lab.crash_log)
    return _summarised(result)


def _summarised(result: LabResult) -> LabResult:
    """Fill in the per-crash figures from ``per_crash``."""
    per_crash = result.per_crash
    caused = [n for n in per_crash if n]
    result.crashes_with_duplicates = len(caused)
    result.duplicates_per_crash_median = statistics.median(per_crash) if per_crash else 0.0
    result.duplicates_per_crash_p99 = _percentile(per_crash, 0.99)
    result.duplicates_per_crash_median_when_any = statistics.median(caused) if caused else 0.0
    result.duplicates_per_crash_max = max(per_crash, default=0)
    result.piece_messages = piece_messages()
    hands = _hands(result)
    result.crashes_over_hand = sum(1 for copies, hand in zip(per_crash, hands, strict=True) if copies > hand)
    result.crashes_over_fixed_bound = sum(1 for copies in per_crash if copies > result.piece_messages)
    result.worst_crashes = _worst([result])
    return result


def _hands(result: LabResult) -> list[int]:
    """The bound of each crash: the messages in hand at it, or ``piece_messages`` where not recorded (old JSON)."""
    known = [h if h >= 0 else piece_messages() for h in result.crash_in_hand]
    return [*known, *[piece_messages()] * (len(result.per_crash) - len(known))][: len(result.per_crash)]


#: How many of the crashes that caused the most duplicates a result names.
WORST = 5


def _worst(runs: list[LabResult]) -> list[dict[str, Any]]:
    """The ``WORST`` crashes of ``runs`` that caused the most duplicates (any), most first, each with its seed, index
    in its own soak, point and tick (a run loaded from a JSON written before points were kept: "unknown", -1)."""
    crashes = [
        {
            "seed": r.seed,
            "crash": n,
            "point": r.crash_points[n] if n < len(r.crash_points) else "unknown",
            "tick": r.crash_ticks[n] if n < len(r.crash_ticks) else -1,
            "duplicates": copies,
            "in_hand": r.crash_in_hand[n] if n < len(r.crash_in_hand) else -1,
        }
        for r in runs
        for n, copies in enumerate(r.per_crash)
        if copies
    ]
    crashes.sort(key=lambda c: -c["duplicates"])  # stable: the earlier crash first among equals
    return crashes[:WORST]


def merged(results: list[LabResult]) -> LabResult:
    """Independent soaks (each its own tier and moto server) as one result: counts added, crashes in run order."""
    total = LabResult(results[0].seed)
    for r in results:
        offset = len(total.per_crash)
        for name in ("injected_crashes", "messages", "delivered", "lost", "early", "duplicates", "bursts"):
            setattr(total, name, getattr(total, name) + getattr(r, name))
        for name in (
            "worker_runs",
            "burst_crashes",
            "worker_continuations",
            "timer_duplicates_skipped",
            *_FAULT_FIGURES,
        ):
            setattr(total, name, getattr(total, name) + getattr(r, name))
        for kind, n in r.faults_by_kind.items():
            total.faults_by_kind[kind] = total.faults_by_kind.get(kind, 0) + n
        total.error_queue += r.error_queue
        total.ticks += r.ticks
        total.simulated_seconds += r.simulated_seconds
        total.seconds = max(total.seconds, r.seconds)
        total.leftovers += r.leftovers
        for point, n in r.crashes_by_point.items():
            total.crashes_by_point[point] = total.crashes_by_point.get(point, 0) + n
        for point, n in r.duplicates_by_point.items():
            total.duplicates_by_point[point] = total.duplicates_by_point.get(point, 0) + n
        for index, n in r.duplicates_by_crash.items():
            key = offset + index if index >= 0 else -1  # -1: repeats with no crash to put them down to
            total.duplicates_by_crash[key] = total.duplicates_by_crash.get(key, 0) + n
        total.per_crash += r.per_crash
        total.crash_points += [*r.crash_points, *["unknown"] * (len(r.per_crash) - len(r.crash_points))]
        total.crash_ticks += [*r.crash_ticks, *[-1] * (len(r.per_crash) - len(r.crash_ticks))]
        total.crash_in_hand += [*r.crash_in_hand, *[-1] * (len(r.per_crash) - len(r.crash_in_hand))]
        total.stalls += [{"seed": r.seed, **stall} for stall in r.stalls]
        total.fault_log += [{"seed": r.seed, **fault} for fault in r.fault_log]
    total = _summarised(total)
    total.worst_crashes = _worst(results)  # each with its own soak's seed and index
    return total


#: The figures of the faults that are not crashes, added up when soaks are merged.
_FAULT_FIGURES = (
    "faults",
    "cancels_certain",
    "cancels_uncertain",
    "reschedules_moved",
    "reschedules_in_flight",
    "reschedules_already_sent",
    "reschedules_by_record",
    "certain_cancels_delivered",
    "held_written",
    "held_released",
    "lines_reread",
    "snapshots_read",
    "inherited",
    "deltas_read",
    "awaiting",
    "restart_runs",
    "restart_cut_rereading",
    "restart_stalled",
    "restarts_finished",
)


def _percentile(values: list[int], q: float) -> float:
    """The ``q`` quantile by the nearest rank (0 for no values)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return float(ordered[max(0, math.ceil(q * len(ordered)) - 1)])


#: Where the soak command writes its JSON (``benchmarks/results`` is git-ignored but for its placeholder).
RESULT_JSON = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "bucketlab.json"


def table(result: LabResult, crashes: int) -> str:
    """The soak's figures as a Markdown table (what docs/buckets.md and tests/reliability/README.md quote)."""
    rows = [
        ("crashes and faults (asked / crashes injected + faults)",
         f"{crashes:,} / {result.injected_crashes:,} + {result.faults:,}"),
        ("crashes on the burst path (plan, enqueue, worker steps)", f"{result.burst_crashes:,}"),
        ("fault points hit / of", f"{len(result.crashes_by_point)} / {len(POINTS)}"),
        (f"messages (bursts of {BURST})", f"{result.messages:,} ({result.bursts:,} bursts)"),
        ("worker invocations / continuations", f"{result.worker_runs:,} / {result.worker_continuations:,}"),
        ("lost", f"{result.lost:,}"),
        ("early", f"{result.early:,}"),
        ("error queue", f"{result.error_queue:,}"),
        ("duplicates (total)", f"{result.duplicates:,}"),
        ("crashes that caused any duplicate", f"{result.crashes_with_duplicates:,}"),
        ("duplicates per crash: median / p99 / max", _per_crash(result)),
        ("duplicates per crash that caused any: median", f"{result.duplicates_per_crash_median_when_any:g}"),
        ("crashes that repeated more than they had in hand (the piece, or the bucket the timer sends itself)",
         f"{result.crashes_over_hand:,}"),
        ("messages in hand at a crash: median / max", _in_hand(result)),
        (f"old fixed bound ({result.piece_messages:,}, burst lines only): crashes over it",
         f"{result.crashes_over_fixed_bound:,}"),
        (f"the {WORST} crashes with the most duplicates: copies / in hand (point, seed, crash index, tick)",
         _worst_cell(result)),
        ("stalls (armed point not reached in {QUIET_TICKS} ticks)".replace("{QUIET_TICKS}", str(QUIET_TICKS)),
         _stalls_cell(result)),
        ("copies skipped inside a bucket", f"{result.timer_duplicates_skipped:,}"),
        ("faults that are not crashes (#31)", f"{result.faults:,}: " + ", ".join(
            f"{kind} {n:,}" for kind, n in sorted(result.faults_by_kind.items()))),
        ("cancels answered certain / not; certain ones delivered", f"{result.cancels_certain:,} / "
         f"{result.cancels_uncertain:,}; {result.certain_cancels_delivered:,}"),
        ("reschedules: moved / in flight (try later) / already handed on / left to the record",
         f"{result.reschedules_moved:,} / {result.reschedules_in_flight:,} / {result.reschedules_already_sent:,} / "
         f"{result.reschedules_by_record:,}"),
        ("held by a release cap / released from the held area", f"{result.held_written:,} / "
         f"{result.held_released:,}"),
        ("restarts: lines read again / snapshots read / deltas read / inherited from a lost plan",
         f"{result.lines_reread:,} / {result.snapshots_read:,} / {result.deltas_read:,} / {result.inherited:,}"),
        ("big-piece restart: invocations / cut while reading again / without progress / finished",
         f"{result.restart_runs:,} / {result.restart_cut_rereading:,} / {result.restart_stalled:,} / "
         f"{result.restarts_finished:,}"),
        ("ticks / simulated seconds / wall seconds", f"{result.ticks:,} / {result.simulated_seconds:,.0f} / "
         f"{result.seconds:,.0f}"),
    ]  # fmt: skip
    lines = ["| figure | value |", "|---|---:|", *(f"| {name} | {value} |" for name, value in rows)]
    return "\n".join(lines)


def _worst_cell(result: LabResult) -> str:
    return (
        "; ".join(
            f"{c['duplicates']} / {_hand(c.get('in_hand', -1))} ({c['point']}, seed {c['seed']}, #{c['crash']}, "
            f"tick {c['tick']})"
            for c in result.worst_crashes
        )
        or "none"
    )


def _hand(n: int) -> str:
    return "?" if n < 0 else str(n)


def _in_hand(result: LabResult) -> str:
    known = [h for h in result.crash_in_hand if h >= 0]
    return f"{statistics.median(known):g} / {max(known)}" if known else "not recorded"


def _stalls_cell(result: LabResult) -> str:
    return (
        "; ".join(
            f"{s['target']} (seed {s['seed']}, tick {s['tick']}, {s.get('unsent', '?')} unsent)" for s in result.stalls
        )
        or "none"
    )


def _per_crash(result: LabResult) -> str:
    r = result
    return f"{r.duplicates_per_crash_median:g} / {r.duplicates_per_crash_p99:g} / {r.duplicates_per_crash_max}"


def sound(result: LabResult, crashes: int) -> bool:
    """Whether a soak met its bounds: every crash and fault injected, nothing lost, early or on the error queue, no
    certain cancel delivered, no repeat without a crash, each crash's repeats within what it had in hand, no stall."""
    return (
        result.injected_crashes + result.faults >= crashes
        and not (result.lost or result.early or result.error_queue or result.certain_cancels_delivered)
        and not result.restart_stalled
        and "no_crash" not in result.duplicates_by_point
        and not result.crashes_over_hand
        and not result.stalls
    )


def _report(prefix: str) -> Callable[[LabResult], None]:
    def report(r: LabResult) -> None:
        most = max(r.duplicates_by_crash.items(), key=lambda item: item[1], default=(-1, 0))
        point = "" if most[0] < 0 or most[0] >= len(r.crash_points) else f" at #{most[0]} {r.crash_points[most[0]]}"
        print(
            f"{prefix}crashes {r.injected_crashes} faults {r.faults} {r.faults_by_kind} armed {r.armed} messages "
            f"{r.messages} ticks {r.ticks} duplicates so far "
            f"{sum(r.duplicates_by_point.values())} (most for one crash {most[1]}{point})",
            file=sys.stderr,
            flush=True,
        )

    return report


def _write_atomically(path: Path, payload: dict[str, Any]) -> None:
    """``payload`` as JSON at ``path``: written to a temporary file beside it, then renamed over it."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_text(json.dumps(payload, indent=2))
    os.replace(temporary, path)


def _part(out: Path, seed: int) -> Path:
    return out.with_name(f"{out.stem}.part-seed{seed}.json")


def _payload(asked: int, seeds: list[int], runs: list[LabResult], *, complete: bool) -> dict[str, Any]:
    result = merged(runs)
    return {"complete": complete, "crashes_asked": asked, "seeds": seeds, **asdict(result),
            "runs": [asdict(r) for r in runs]}  # fmt: skip


@dataclass(frozen=True)
class _Checkpoint:
    """Writes a job's figures so far beside ``out``, then every job's, merged, at ``out`` (both atomically); a class,
    not a closure, so a job in another process gets it."""

    out: Path
    asked: int
    seeds: list[int]
    seed: int

    def __call__(self, result: LabResult) -> None:
        _write_atomically(_part(self.out, self.seed), asdict(result))
        runs: list[LabResult] = []
        for other in self.seeds:
            with contextlib.suppress(OSError, ValueError, TypeError):  # a job that has written nothing yet
                run = LabResult(**json.loads(_part(self.out, other).read_text()))
                runs.append(replace(run, duplicates_by_crash={int(k): v for k, v in run.duplicates_by_crash.items()}))
        if runs:
            _write_atomically(self.out, _payload(self.asked, self.seeds, runs, complete=False))


def soak_on_own_moto(
    crashes: int,
    seed: int,
    window: int,
    timeout: float,
    quiet: bool,
    checkpoint: Callable[[LabResult], None] | None = None,
) -> LabResult:
    """``soak`` against a moto server of its own, started and stopped here (one per parallel job)."""
    os.environ.setdefault("POWERTOOLS_LOG_LEVEL", "WARNING")
    from tests.fixtures.services import ServiceProcess, free_port

    port = free_port()
    exe = str(Path(sys.executable).parent / "moto_server")
    service = ServiceProcess("moto", [exe, "-H", "127.0.0.1", "-p", str(port)], [port]).start()
    try:
        progress = None if quiet else _report(f"seed {seed}: ")
        return soak(f"http://127.0.0.1:{port}", crashes, seed, window=window, timeout=timeout, progress=progress,
                    checkpoint=checkpoint)  # fmt: skip
    finally:
        service.stop()


def _merge_files(paths: list[Path], out: Path) -> None:
    """Print (and write to ``out``) the merged result of soaks written by this command."""
    try:
        loaded = [json.loads(path.read_text()) for path in paths]
        runs = [LabResult(**run) for d in loaded for run in d["runs"]]
        asked = sum(int(d["crashes_asked"]) for d in loaded)
        seeds = [seed for d in loaded for seed in d["seeds"]]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        sys.exit(f"cannot merge: {exc} (give JSON files this command wrote)")
    runs = [replace(r, duplicates_by_crash={int(k): v for k, v in r.duplicates_by_crash.items()}) for r in runs]
    result = merged(runs)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"crashes_asked": asked, "seeds": seeds, "merged_from": [str(p) for p in paths],
                               **asdict(result), "runs": [asdict(r) for r in runs]}, indent=2))  # fmt: skip
    print(table(result, asked))
    print(f"JSON: {out}")
    if not sound(result, 0):  # the soaks may have stopped at their --timeout: the table says how many crashes
        print("NOT SOUND: see the table (lost, early, error queue, or a crash beyond one piece)", file=sys.stderr)
        sys.exit(1)


def _job_result(future: Any, out: Path, seed: int) -> LabResult:
    """A job's final figures; a job that raised gives its last checkpoint with the error as a stall (the other
    jobs' final figures are kept)."""
    try:
        return future.result()  # type: ignore[no-any-return]
    except Exception as exc:  # any job's failure is a finding, not the end of the others' figures
        print(f"seed {seed}: the job failed: {exc!r}", file=sys.stderr, flush=True)
        try:
            run = LabResult(**json.loads(_part(out, seed).read_text()))
        except (OSError, ValueError, TypeError):
            run = LabResult(seed)
        run = replace(run, duplicates_by_crash={int(k): v for k, v in run.duplicates_by_crash.items()})
        reason = f"job failed: {exc!r}; lost not counted ({run.awaiting} not arrived at its last checkpoint)"
        run.stalls.append(
            {"seed": seed, "target": run.armed, "tick": run.ticks, "reason": reason, "unsent": run.awaiting}
        )
        return run


def main() -> None:
    """Soak command line: one moto server per job; prints a table, writes JSON."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--crashes", type=int, default=1_000, help="in-process crashes at the tier's fault points, in all")
    p.add_argument("--jobs", type=int, default=1, help="independent soaks side by side (seeds seed, seed+1, ...)")
    p.add_argument("--window", type=int, default=40, help="regular messages on their way at a time")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--timeout", type=float, default=4 * 3600, help="seconds before the soak gives up")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    p.add_argument("--json", type=Path, default=RESULT_JSON, help=f"where the result goes (default {RESULT_JSON})")
    p.add_argument("--merge", type=Path, nargs="+", help="no soak: the table of these soaks' JSON files as one")
    a = p.parse_args()
    if a.merge:
        _merge_files(a.merge, a.json)
        return
    if a.crashes < 1 or a.window < 1 or not 1 <= a.jobs <= 8:
        p.error("--crashes and --window must be at least 1, --jobs from 1 to 8")
    each = -(-a.crashes // a.jobs)
    seeds = [a.seed + n for n in range(a.jobs)]
    a.json.parent.mkdir(parents=True, exist_ok=True)
    try:
        if a.jobs == 1:
            checkpoint = _Checkpoint(a.json, a.crashes, seeds, a.seed)
            results = [soak_on_own_moto(each, a.seed, a.window, a.timeout, a.quiet, checkpoint)]
        else:
            from concurrent.futures import ProcessPoolExecutor

            with ProcessPoolExecutor(max_workers=a.jobs) as pool:
                futures = [
                    pool.submit(
                        soak_on_own_moto,
                        each,
                        s,
                        a.window,
                        a.timeout,
                        a.quiet,
                        _Checkpoint(a.json, a.crashes, seeds, s),
                    )
                    for s in seeds
                ]
                results = [_job_result(f, a.json, s) for f, s in zip(futures, seeds, strict=True)]
    except LabStalled as exc:  # one job in this process: its figures so far are at --json
        print(f"the lab stalled: {exc} (the figures so far: {a.json})", file=sys.stderr)
        sys.exit(2)
    result = merged(results)
    _write_atomically(a.json, _payload(a.crashes, seeds, results, complete=True))
    for s in seeds:
        _part(a.json, s).unlink(missing_ok=True)
    print(table(result, a.crashes))
    print(f"JSON: {a.json}")
    if not sound(result, a.crashes):
        print("NOT SOUND: see the table (lost, early, error queue, or a crash beyond one piece)", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    os.environ.setdefault("POWERTOOLS_LOG_LEVEL", "WARNING")
    main()
