"""Peak memory of one run of the tier's timer or of one dispatch worker on big buckets (#24: at most 128 MiB a run).

Each case writes a burst with the tier's own writer (``S3BucketStore.write``, the v2 object format): all messages
due in the same minute, random text bodies (incompressible: the largest objects and gzip work for their size), ids
``m<n>`` for ten destination queues.

* ``coarse`` cases: the burst sits in one coarse (day) bucket in objects as the ingest function writes them (one
  invocation's batch: at most Lambda's 6 MB event payload of bodies, or 10,000 messages). Step ``cascade``: one
  ``BucketTimer.run`` when that day is the one to cascade, which splits it into the fine (minute) bucket, a group
  of ``bucket_cascade_group_bytes`` at a time (nothing is due yet, so nothing is sent).
* ``fine`` cases: the burst sits in one fine bucket in objects of 10,000 messages (as a cascade group writes them).
* Step ``plan``: one ``BucketTimer.run`` 400 s before the minute (inside the 420 s dispatch lead), with a dispatch
  queue: the bucket is bigger than ``bucket_inline_max_bytes``, so the timer plans it and enqueues its tasks.
* Step ``worker``: one ``PartitionWorker.run`` of partition 0 of that plan (the dispatch Lambda's work for one task):
  it streams every object of the bucket, keeps its partition's lines and sends them piece by piece.

Each step runs in a fresh Python process (so its resident memory is its own), against S3 and SQS answered in that
process behind real boto3 clients (``benchmarks/fakeaws.py``), with S3 objects kept in files on disk (not in the
measured process's memory) and sends only counted. Per step, two runs of the same state: one under ``tracemalloc``
(the peak of Python allocations during ``run()``), one without it (the resident high-water mark ``VmHWM``, reset just
before ``run()`` through ``/proc/self/clear_refs`` and read at its end, minus the resident size at its
start: everything the run took, allocator slack and buffers included). "max RSS" is that high-water mark itself,
the whole process's (interpreter, imports, boto3 included): what Lambda reports as "Max Memory Used". A step meets
the target when both the tracemalloc peak and the resident growth are at most 128 MiB. ``--smoke`` runs one small
case, every step in one process measuring both (its resident growth then includes tracemalloc's own bookkeeping).

Run: ``python -m benchmarks.bucket_memory [--smoke] [--cases NAME ...]``. Prints a table and writes
``benchmarks/results/bucket_memory[-smoke].json``. Figures: benchmarks/aws.md and docs/buckets.md ("Bursts").
"""

from __future__ import annotations

import argparse
import base64
import gc
import hashlib
import json
import os
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

from botocore.awsrequest import AWSResponse
from botocore.response import StreamingBody

from benchmarks.common import Row, print_table, rss_mib, write_json
from benchmarks.fakeaws import FakeAws
from delayed_delivery.aws.tier.config import TierSettings
from delayed_delivery.aws.tier.plan_store import PlanStore, SqsTaskQueue
from delayed_delivery.aws.tier.store import S3BucketStore
from delayed_delivery.aws.tier.timer import BucketTimer
from delayed_delivery.aws.tier.worker import PartitionWorker
from delayed_delivery.clock import ManualClock
from delayed_delivery.delivery import DELIVERY_HEADER, decode_delivery, epoch_ms
from delayed_delivery.settings import DelayedDeliverySettings
from delayed_delivery.timebuckets.format import MAX_OBJECT_MESSAGES, BucketMessage, encoded_line_bytes
from delayed_delivery.timebuckets.plans import DispatchTask, partition_of
from delayed_delivery.timebuckets.wheel import COARSE, FINE, BucketKey, BucketLevel

NAME = "bucket_memory"
TARGET_MIB = 128.0
#: The burst's day (a coarse bucket) and minute (a fine bucket): 09:00.
DAY = BucketKey(COARSE, datetime(2031, 3, 3, tzinfo=UTC))
MINUTE = BucketKey(FINE, datetime(2031, 3, 3, 9, tzinfo=UTC))
#: When the timer cascades the day (cascade_window names it), and when it plans the minute (400 s before it).
CASCADE_AT = datetime(2031, 3, 2, 12, tzinfo=UTC)
PLAN_AT = MINUTE.start - timedelta(seconds=400)
WORKER_AT = PLAN_AT + timedelta(seconds=5)
#: Lambda's synchronous invocation payload (6 MB) bounds the records of one ingest batch, so one ingest object.
INGEST_BATCH_BYTES = 6_000_000
DESTINATIONS = 10
BUCKET_NAME = "memory-bench"
PREFIX = "bench"
DISPATCH_QUEUE = "dispatch"
ERROR_QUEUE = "errors"
SETTINGS = DelayedDeliverySettings(error_queue=ERROR_QUEUE)
TIER = TierSettings(bucket_dispatch_queue=DISPATCH_QUEUE)
STEPS = ("cascade", "plan", "worker")


@dataclass(frozen=True, slots=True)
class Case:
    """One burst: ``messages`` of ``body_bytes`` written at ``level``; the steps measured on it, in order."""

    name: str
    messages: int
    body_bytes: int
    level: str
    steps: tuple[str, ...]


CASES = (
    Case("coarse_50000x8KiB", 50_000, 8 * 1024, COARSE, ("cascade", "plan", "worker")),
    Case("coarse_1000x256KiB", 1_000, 256 * 1024, COARSE, ("cascade", "plan", "worker")),
    Case("fine_100000x1KiB", 100_000, 1024, FINE, ("plan", "worker")),
)
#: Just over ``bucket_inline_max_bytes`` (4 MiB), so the minute is planned, not sent inline.
SMOKE_CASES = (Case("coarse_20x256KiB", 20, 256 * 1024, COARSE, ("cascade", "plan", "worker")),)


# --- S3 on disk, SQS counted ------------------------------------------------------------------------------------------
class DiskAws(FakeAws):
    """``FakeAws`` with S3 objects in files under ``root`` (ETag: the content's MD5, as S3's for a single PUT) and
    sends to the destination queues counted per message index (``copies``), not kept."""

    def __init__(self, root: Path, messages: int) -> None:
        super().__init__(latency={"s3": 0.0, "sqs": 0.0})
        self.root = root
        (root / "s3").mkdir(parents=True, exist_ok=True)
        self.copies = bytearray(messages)
        self.other_sends = 0

    def _path(self, key: str) -> Path:
        return self.root / "s3" / quote(key, safe="")

    def _etag(self, key: str) -> str | None:
        try:
            return (self.root / "s3" / (quote(key, safe="") + ".etag")).read_text()
        except FileNotFoundError:
            return None

    def store(self, key: str, body: Any) -> str:
        """Write an object (a new file replacing the old: hard-linked copies of ``root`` stay intact)."""
        path = self._path(key)
        digest = hashlib.md5(usedforsecurity=False)
        with tempfile.NamedTemporaryFile(dir=path.parent, delete=False) as out:
            if isinstance(body, bytes | bytearray | str):
                data = body.encode() if isinstance(body, str) else body
                digest.update(data)
                out.write(data)
            else:
                while chunk := body.read(1 << 20):
                    digest.update(chunk)
                    out.write(chunk)
        etag = f'"{digest.hexdigest()}"'
        etag_path = path.with_name(path.name + ".etag")
        etag_tmp = etag_path.with_name(etag_path.name + ".tmp")
        etag_tmp.write_text(etag)
        Path(out.name).replace(path)
        etag_tmp.replace(etag_path)
        return etag

    def _remove(self, key: str) -> None:
        path = self._path(key)
        for p in (path, path.with_name(path.name + ".etag")):
            p.unlink(missing_ok=True)

    def _s3_PutObject(self, p: dict[str, Any]) -> tuple[AWSResponse, dict[str, Any]]:
        with self.lock:
            current = self._etag(p["Key"])
            if p.get("IfNoneMatch") == "*" and current is not None:
                return _error("PreconditionFailed", 412)
            if "IfMatch" in p and current != p["IfMatch"]:
                return _error("PreconditionFailed" if current else "NoSuchKey", 412 if current else 404)
            etag = self.store(p["Key"], p.get("Body", b""))
        return _ok(), {"ETag": etag}

    def _s3_GetObject(self, p: dict[str, Any]) -> tuple[AWSResponse, dict[str, Any]]:
        etag = self._etag(p["Key"])
        try:
            handle = self._path(p["Key"]).open("rb")
        except FileNotFoundError:
            return _error("NoSuchKey", 404)
        size = os.fstat(handle.fileno()).st_size
        return _ok(), {"Body": StreamingBody(handle, size), "ETag": etag, "ContentLength": size}

    def _s3_DeleteObjects(self, p: dict[str, Any]) -> tuple[AWSResponse, dict[str, Any]]:
        with self.lock:
            for item in p["Delete"]["Objects"]:
                self._remove(item["Key"])
        return _ok(), {"Deleted": [{"Key": item["Key"]} for item in p["Delete"]["Objects"]]}

    def _s3_DeleteObject(self, p: dict[str, Any]) -> tuple[AWSResponse, dict[str, Any]]:
        with self.lock:
            current = self._etag(p["Key"])
            if current is not None and "IfMatch" in p and current != p["IfMatch"]:
                return _error("PreconditionFailed", 412)
            self._remove(p["Key"])
        return _ok(204), {}

    def _s3_CopyObject(self, p: dict[str, Any]) -> tuple[AWSResponse, dict[str, Any]]:
        try:
            with self._path(p["CopySource"]["Key"]).open("rb") as source:
                self.store(p["Key"], source)
        except FileNotFoundError:
            return _error("NoSuchKey", 404)
        return _ok(), {}

    def stored_keys(self) -> list[str]:
        """Every stored key, sorted."""
        names = [p.name for p in (self.root / "s3").iterdir()]
        return sorted(unquote(n) for n in names if not n.endswith((".etag", ".tmp")) and not n.startswith("tmp"))

    def _s3_ListObjectsV2(self, p: dict[str, Any]) -> tuple[AWSResponse, dict[str, Any]]:
        prefix = p.get("Prefix", "")
        after = p.get("ContinuationToken") or p.get("StartAfter") or ""
        keys = [k for k in self.stored_keys() if k.startswith(prefix) and k > after]
        page = keys[: p.get("MaxKeys", 1000)]
        reply: dict[str, Any] = {
            "Contents": [{"Key": k, "Size": self._path(k).stat().st_size} for k in page],
            "IsTruncated": len(keys) > len(page),
            "KeyCount": len(page),
        }
        if reply["IsTruncated"]:
            reply["NextContinuationToken"] = page[-1]
        return _ok(), reply

    def _sqs_SendMessageBatch(self, p: dict[str, Any]) -> tuple[AWSResponse, dict[str, Any]]:
        name = str(p["QueueUrl"]).rsplit("/", 1)[-1]
        ok = []
        for entry in p["Entries"]:
            ok.append({"Id": entry["Id"], "MessageId": entry["Id"], "MD5OfMessageBody": ""})
            index = _index(entry) if name.startswith("orders-") else -1
            with self.lock:
                if 0 <= index < len(self.copies):
                    self.copies[index] = min(255, self.copies[index] + 1)
                else:  # dispatch tasks, error-queue copies: few and small
                    self.other_sends += 1
                    if name == DISPATCH_QUEUE:
                        self.queues.setdefault(name, []).append((0.0, entry["MessageBody"]))
        return _ok(), {"Successful": ok, "Failed": []}


def _ok(status: int = 200) -> AWSResponse:
    return AWSResponse("https://fake.us-east-1.amazonaws.com/", status, {}, None)


def _error(code: str, status: int) -> tuple[AWSResponse, dict[str, Any]]:
    return _ok(status), {"Error": {"Code": code, "Message": code}, "ResponseMetadata": {"HTTPStatusCode": status}}


def _index(entry: dict[str, Any]) -> int:
    """The message index an entry carries (its id ``m<n>``, read from the delivery header)."""
    header = entry.get("MessageAttributes", {}).get(DELIVERY_HEADER, {}).get("StringValue")
    message_id = decode_delivery(header).message_id
    return int(message_id[1:]) if message_id and message_id.startswith("m") else -1


def _account(root: Path, messages: int) -> tuple[DiskAws, Any, Any, S3BucketStore]:
    fake = DiskAws(root, messages)
    for name in (*(f"orders-{d}" for d in range(DESTINATIONS)), ERROR_QUEUE, DISPATCH_QUEUE):
        fake.create_queue(name)
    s3, sqs = fake.client("s3"), fake.client("sqs")
    return fake, s3, sqs, S3BucketStore(s3, BUCKET_NAME, PREFIX, BucketLevel())


# --- the burst, written by the tier's writer ----------------------------------------------------------------------
def _message(n: int, count: int, body_bytes: int, rng: random.Random) -> BucketMessage:
    text = base64.b64encode(rng.randbytes(body_bytes * 3 // 4 + 3))[:body_bytes]
    due = epoch_ms(MINUTE.start) + n * 60_000 // count
    return BucketMessage(f"m{n}", f"orders-{n % DESTINATIONS}", text, due, {}, 0, due - 30 * 86_400_000)


def write_burst(case: Case, root: Path) -> dict[str, float]:
    """Write the case's burst under ``root``; objects written, their bytes and the seconds it took."""
    started = time.monotonic()
    _, _, _, store = _account(root, 0)
    rng = random.Random(case.name)
    bucket = DAY if case.level == COARSE else MINUTE
    limit = INGEST_BATCH_BYTES if case.level == COARSE else 1 << 62
    batch: list[BucketMessage] = []
    size = objects = 0
    for n in range(case.messages):
        message = _message(n, case.messages, case.body_bytes, rng)
        line = encoded_line_bytes(message)
        if batch and (len(batch) >= MAX_OBJECT_MESSAGES or size + line > limit):
            objects += len(store.write(bucket, batch))
            batch, size = [], 0
        batch.append(message)
        size += line
    if batch:
        objects += len(store.write(bucket, batch))
    stored = sum(f.stat().st_size for f in (root / "s3").iterdir() if not f.name.endswith(".etag"))
    return {"objects": objects, "stored_mib": stored / 2**20, "seconds": time.monotonic() - started}


# --- one step, in a fresh process ---------------------------------------------------------------------------------
def _max_rss_mib() -> float:
    """The resident high-water mark: ``VmHWM`` (``ru_maxrss`` also counts the parent's size at the fork)."""
    try:
        with Path("/proc/self/status").open() as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def _reset_max_rss() -> bool:
    """Reset the process's resident high-water mark (Linux: ``clear_refs`` 5), so ``ru_maxrss`` is the run's own."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def run_step(step: str, root: Path, messages: int, *, traced: bool, untraced_rss: bool) -> dict[str, Any]:
    """One step on the state under ``root``: its peaks (MiB), seconds and what it did."""
    fake, s3, sqs, store = _account(root, messages)
    queue = SqsTaskQueue(sqs, DISPATCH_QUEUE)
    task: DispatchTask | None = None
    if step == "worker":
        plan = PlanStore(store).read_plan(MINUTE)
        if plan is None:
            raise RuntimeError("no plan to work on: run the plan step first")
        task = DispatchTask(plan.bucket, plan.created_ms, 0, plan.partitions)
        clock = ManualClock(WORKER_AT)
        doer: Any = PartitionWorker(store, sqs, SETTINGS, clock, tier=TIER, owner="w0", queue=queue)
    else:
        clock = ManualClock(CASCADE_AT if step == "cascade" else PLAN_AT)
        doer = BucketTimer(store, sqs, SETTINGS, clock, owner="timer", tier=TIER, queue=queue)
    # warm up what any first request loads (endpoint rules, models, the queue look-ups) outside the measurement
    s3.head_bucket(Bucket=BUCKET_NAME)
    for name in (*(f"orders-{d}" for d in range(DESTINATIONS)), ERROR_QUEUE, DISPATCH_QUEUE):
        sqs.get_queue_url(QueueName=name)
    gc.collect()
    max_setup = _max_rss_mib()
    reset = _reset_max_rss()
    rss_before, max_before = rss_mib(), _max_rss_mib()
    if traced:
        tracemalloc.start()
    started = time.perf_counter()
    result = doer.run(task) if task is not None else doer.run()
    seconds = time.perf_counter() - started
    peak = tracemalloc.get_traced_memory()[1] / 2**20 if traced else None
    tracemalloc.stop()
    max_after = _max_rss_mib()
    out: dict[str, Any] = {
        "step": step,
        "seconds": seconds,
        "traced_peak_mib": peak,
        "max_rss_setup_mib": max_setup,
        "max_rss_reset": reset,
        "rss_before_mib": rss_before,
        "max_rss_before_mib": max_before,
        "max_rss_mib": max_after,
        "rss_growth_mib": max_after - rss_before if untraced_rss else None,
        "result": asdict(result),
        "other_sends": fake.other_sends,
        "objects_after": {
            level: sum(1 for k in fake.stored_keys() if k.startswith(f"{PREFIX}/{level}/")) for level in (COARSE, FINE)
        },
    }
    if task is not None:
        mine = bytearray(partition_of(f"m{n}", task.partitions) == task.partition for n in range(messages))
        out["partition"] = {"messages": sum(mine), "partitions": task.partitions}
        out["lost"] = sum(1 for n in range(messages) if mine[n] and not fake.copies[n])
        out["strangers"] = sum(1 for n in range(messages) if fake.copies[n] and not mine[n])
    out["duplicates"] = sum(max(0, c - 1) for c in fake.copies)
    out["sent"] = sum(1 for c in fake.copies if c)
    return out


def _child(steps: Sequence[str], root: Path, messages: int, mode: str) -> list[dict[str, Any]]:
    """Run ``steps`` one after another in a fresh Python process (``mode``: traced, untraced or both)."""
    spec = json.dumps({"steps": list(steps), "root": str(root), "messages": messages, "mode": mode})
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.bucket_memory", "--child", spec],
        cwd=Path(__file__).resolve().parents[1],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{', '.join(steps)} ({mode}) failed:\n{done.stderr[-4000:]}")
    return list(json.loads(done.stdout.strip().splitlines()[-1]))


def _check(case: Case, step: str, out: dict[str, Any]) -> None:
    """The step did its whole work (else its peak measures something else)."""
    r = out["result"]
    problems = []
    if step == "cascade" and (r["cascaded_messages"] != case.messages or r["buckets_left_for_deadline"]):
        problems.append(f"cascaded {r['cascaded_messages']} of {case.messages}")
    if step == "plan" and (r.get("buckets_planned") != 1 or not r.get("tasks_enqueued")):
        problems.append(f"planned {r.get('buckets_planned')} bucket(s), {r.get('tasks_enqueued')} task(s)")
    if step == "worker" and (r["finished"] != 1 or out["lost"] or out["strangers"] or out["duplicates"]):
        problems.append(f"finished {r['finished']}, lost {out['lost']}, duplicates {out['duplicates']}")
    if r.get("buckets_failed") or r.get("to_error_queue"):
        problems.append(f"failed buckets {r.get('buckets_failed')}, to the error queue {r.get('to_error_queue')}")
    if problems:
        raise RuntimeError(f"{case.name} {step}: " + "; ".join(problems))


def measure_case(case: Case, work: Path, smoke: bool) -> dict[str, Any]:
    """Write the case's burst, then measure its steps in order (each on the state the one before left)."""
    state = work / case.name
    wrote = write_burst(case, state)
    print(f"{NAME}: {case.name}: wrote {wrote}", file=sys.stderr, flush=True)
    steps: dict[str, Any] = {}
    try:
        both = _child(case.steps, state, case.messages, "both") if smoke else []  # smoke: one process, every step
        for n, step in enumerate(case.steps):
            if smoke:
                out = both[n]
            else:
                copy = work / f"{case.name}-{step}-untraced"
                shutil.copytree(state, copy, copy_function=os.link)  # objects are replaced, never changed in place
                untraced = _child([step], copy, case.messages, "untraced")[0]
                shutil.rmtree(copy)
                _check(case, step, untraced)
                out = _child([step], state, case.messages, "traced")[0]
                out["rss_growth_mib"] = untraced["rss_growth_mib"]
                out["max_rss_mib_untraced"] = untraced["max_rss_mib"]
                out["seconds_untraced"] = untraced["seconds"]
            _check(case, step, out)
            steps[step] = out
            print(f"{NAME}: {case.name} {step}: {_summary(out)}", file=sys.stderr, flush=True)
    except RuntimeError as exc:  # the later steps need this one's state: the case stops here, the others go on
        print(f"{NAME}: {case.name}: {exc}", file=sys.stderr, flush=True)
        return {"wrote": wrote, "steps": steps, "failed": str(exc)[-2000:]}
    finally:
        shutil.rmtree(state)
    return {"wrote": wrote, "steps": steps}


def _summary(out: dict[str, Any]) -> str:
    return (
        f"tracemalloc peak {out['traced_peak_mib']:.1f} MiB, RSS growth {out['rss_growth_mib']:.1f} MiB, "
        f"max RSS {out['max_rss_mib']:.1f} MiB, {out['seconds']:.1f} s"
    )


def _rows(done: dict[str, dict[str, Any]], cases: Sequence[Case]) -> list[Row]:
    rows: list[Row] = []
    for case in cases:
        measured = done[case.name]
        for step, out in measured["steps"].items():
            note = (
                f"{case.messages:,} x {case.body_bytes // 1024} KiB in one {case.level} bucket "
                f"({measured['wrote']['objects']} objects)"
            )
            label = f"{case.name}_{step}"
            rows += [
                Row(
                    NAME,
                    f"{label}_tracemalloc_peak",
                    "MiB",
                    (out["traced_peak_mib"],),
                    f"target {TARGET_MIB:.0f} MiB",
                    out["traced_peak_mib"] / TARGET_MIB,
                    notes=note,
                ),
                Row(
                    NAME,
                    f"{label}_rss_growth",
                    "MiB",
                    (out["rss_growth_mib"],),
                    f"target {TARGET_MIB:.0f} MiB",
                    out["rss_growth_mib"] / TARGET_MIB,
                ),
                Row(NAME, f"{label}_max_rss", "MiB", (out.get("max_rss_mib_untraced", out["max_rss_mib"]),)),
                Row(NAME, f"{label}_run", "s", (out.get("seconds_untraced", out["seconds"]),)),
            ]
    return rows


def verdicts(done: dict[str, dict[str, Any]]) -> list[str]:
    """One line per step measured: its peaks against the target; one per case that failed."""
    lines = []
    for name, measured in done.items():
        for step, out in measured["steps"].items():
            peak = max(out["traced_peak_mib"], out["rss_growth_mib"])
            verdict = "meets" if peak <= TARGET_MIB else "MISSES"
            lines.append(
                f"{name} {step}: tracemalloc {out['traced_peak_mib']:.1f} MiB, resident growth "
                f"{out['rss_growth_mib']:.1f} MiB: {verdict} the {TARGET_MIB:.0f} MiB target"
            )
        if "failed" in measured:
            lines.append(f"{name}: FAILED ({measured['failed'].splitlines()[0]})")
    return lines


def measure(smoke: bool = False, cases: Sequence[str] = ()) -> tuple[list[Row], dict[str, Any]]:
    """Measure the cases: the rows and everything measured (``runs``: per case, what was written and each step)."""
    chosen = [c for c in (SMOKE_CASES if smoke else CASES) if not cases or c.name in cases]
    done: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="bucket-memory-") as work:
        for case in chosen:
            done[case.name] = measure_case(case, Path(work), smoke)
    last = {"target_mib": TARGET_MIB, "cases": {c.name: asdict(c) for c in chosen}, "runs": done}
    return _rows(done, chosen), last


def run(smoke: bool = False, *, cases: Sequence[str] = ()) -> list[Row]:
    """The benchmark-runner entry point; raises when a case could not be measured whole."""
    rows, last = measure(smoke, cases)
    failed = [name for name, measured in last["runs"].items() if "failed" in measured]
    if failed:
        raise RuntimeError(f"not measured whole: {', '.join(failed)}")
    return rows


def main() -> None:
    """Command line: print the table and write ``benchmarks/results/bucket_memory[-smoke].json``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="small bursts, both measures in one process per step")
    parser.add_argument("--cases", nargs="+", default=[], help="only these cases (names as in the table)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    a = parser.parse_args()
    if a.child:
        spec = json.loads(a.child)
        traced, untraced = spec["mode"] in {"traced", "both"}, spec["mode"] in {"untraced", "both"}
        root, messages = Path(spec["root"]), spec["messages"]
        outs = [run_step(step, root, messages, traced=traced, untraced_rss=untraced) for step in spec["steps"]]
        print(json.dumps(outs))
        return
    known = {c.name for c in (*CASES, *SMOKE_CASES)}
    if unknown := [c for c in a.cases if c not in known]:
        parser.error(f"unknown case(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    begin = time.monotonic()
    load = os.getloadavg()
    rows, last = measure(a.smoke, a.cases)
    print_table(rows, f"Peak memory of one timer or worker run on a burst (target {TARGET_MIB:.0f} MiB)")
    print("\n".join(verdicts(last["runs"])))
    extra = {**last, "seconds": time.monotonic() - begin, "load_average": {"start": load, "end": os.getloadavg()}}
    print(write_json(NAME + ("-smoke" if a.smoke else ""), rows, extra))
    if any("failed" in measured for measured in last["runs"].values()):
        sys.exit(1)


if __name__ == "__main__":
    main()
