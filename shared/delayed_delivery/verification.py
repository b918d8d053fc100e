"""Self-checks of a deployment (``aws verify``, ``azure verify``): typed results, the report, probe timings, clean-up.

Each check is a small function in a cloud adapter (``aws/verify/``, ``azure/verify/``) that returns one
``CheckResult``: what it found (the evidence) and, when it fails, the one-line fix. The report holds them in order
and decides the exit code. Probe waits are settings (``VerifySettings``), so tests on the emulators compress the
cloud's minutes into seconds.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from .durations import format_duration
from .errors import ConfigurationError
from .validation import is_number

__all__ = [
    "EXIT_UNREACHABLE",
    "PROBE_QUEUE",
    "VERIFY_ENV_PREFIX",
    "Arrival",
    "CheckResult",
    "Cleanup",
    "Group",
    "Mode",
    "Probe",
    "Progress",
    "Status",
    "VerifyReport",
    "VerifySettings",
    "failed",
    "judge_probe",
    "lateness_figures",
    "needs_account",
    "passed",
    "probe_progress",
    "run_verification",
    "skipped",
    "span",
    "warned",
]

#: Environment prefix of the probe timings.
#: The probe endpoint's queue both clouds' deployments create for verify (CDK and Bicep), allowed as a destination.
PROBE_QUEUE = "delayed-delivery-probe"
VERIFY_ENV_PREFIX = "DELAYED_DELIVERY_VERIFY_"

#: Exit code of a run that could not reach the account (or the emulator) or whose credential was refused: nothing was
#: checked. 0 all hold, 1 a check failed, 2 a usage error.
EXIT_UNREACHABLE = 3

#: ``progress(line)``: one line of progress for the operator (stderr in the CLI).
Progress = Callable[[str], None]


class Status(StrEnum):
    """The outcome of one check."""

    PASS = "pass"
    FAIL = "fail"
    WARN = "warn"
    NEEDS_ACCOUNT = "needs a real account"
    SKIPPED = "skipped"


class Group(StrEnum):
    """What kind of fact a check establishes."""

    CONFIGURATION = "configuration"
    PERMISSIONS = "permissions"
    BEHAVIOUR = "behaviour"
    COST = "cost"


class Mode(StrEnum):
    """``quick``: configuration and the short probes; ``full``: every probe, including the long routes."""

    QUICK = "quick"
    FULL = "full"


@dataclass(frozen=True, slots=True)
class CheckResult:
    """One check: its id, what it is about, the outcome, the evidence and (when it fails or warns) the fix."""

    check: str
    group: Group
    subject: str
    status: Status
    evidence: str
    fix: str = ""
    data: Mapping[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """The JSON form."""
        return {
            "check": self.check,
            "group": self.group.value,
            "subject": self.subject,
            "status": self.status.value,
            "evidence": self.evidence,
            "fix": self.fix or None,
            "data": dict(self.data),
        }


def passed(check: str, group: Group, subject: str, evidence: str, **data: Any) -> CheckResult:
    """A check that holds."""
    return CheckResult(check, group, subject, Status.PASS, evidence, data=data)


def failed(check: str, group: Group, subject: str, evidence: str, fix: str, **data: Any) -> CheckResult:
    """A check that does not hold, with the fix."""
    return CheckResult(check, group, subject, Status.FAIL, evidence, fix, data=data)


def warned(check: str, group: Group, subject: str, evidence: str, fix: str, **data: Any) -> CheckResult:
    """Works, but not as well as it should; does not fail the run."""
    return CheckResult(check, group, subject, Status.WARN, evidence, fix, data=data)


def needs_account(check: str, group: Group, subject: str, will_check: str, **data: Any) -> CheckResult:
    """A check an emulator cannot exercise: what it will check in a real account."""
    return CheckResult(check, group, subject, Status.NEEDS_ACCOUNT, will_check, data=data)


def skipped(check: str, group: Group, subject: str, why: str) -> CheckResult:
    """A check not run (``--quick``, or the part it checks is not deployed)."""
    return CheckResult(check, group, subject, Status.SKIPPED, why)


@dataclass(frozen=True, slots=True)
class VerifyReport:
    """Every check of one run, in order; ``exit_code`` 1 when any failed or the run was interrupted, 3 (``error``) when
    the account could not be reached or refused the credential, so nothing was checked."""

    cloud: str
    target: str
    mode: Mode
    local: bool
    started_at: datetime
    finished_at: datetime
    results: tuple[CheckResult, ...]
    cleanup_problems: tuple[str, ...] = ()
    interrupted: bool = False
    #: Why the run could not start: the account (or emulator) unreachable, or the credential refused.
    error: str | None = None

    @classmethod
    def unreachable(cls, *, cloud: str, target: str, mode: Mode, local: bool, at: datetime, error: str) -> VerifyReport:
        """The report of a run that could not reach ``target``: no checks, ``ok`` false, exit ``EXIT_UNREACHABLE``."""
        return cls(cloud, target, mode, local, at, at, (), error=error)

    @property
    def failures(self) -> tuple[CheckResult, ...]:
        """The failed checks."""
        return tuple(r for r in self.results if r.status is Status.FAIL)

    @property
    def ok(self) -> bool:
        """True when nothing failed, nothing was left behind and the run finished."""
        return not self.error and not self.failures and not self.cleanup_problems and not self.interrupted

    @property
    def exit_code(self) -> int:
        """0 when every check holds, 1 otherwise, ``EXIT_UNREACHABLE`` when nothing could be checked (2: usage)."""
        if self.error is not None:
            return EXIT_UNREACHABLE
        return 0 if self.ok else 1

    def counts(self) -> dict[str, int]:
        """How many checks ended in each status."""
        return {s.value: sum(1 for r in self.results if r.status is s) for s in Status}

    def as_dict(self) -> dict[str, Any]:
        """The JSON document of ``--json``."""
        return {
            "cloud": self.cloud,
            "target": self.target,
            "mode": self.mode.value,
            "local": self.local,
            "started_at": self.started_at.isoformat(),
            "finished_at": self.finished_at.isoformat(),
            "ok": self.ok,
            "exit_code": self.exit_code,
            "interrupted": self.interrupted,
            "error": self.error,
            "counts": self.counts(),
            "checks": [r.as_dict() for r in self.results],
            "cleanup_problems": list(self.cleanup_problems),
        }


@dataclass(frozen=True, slots=True)
class VerifySettings:
    """Probe delays and waits (seconds); ``DELAYED_DELIVERY_VERIFY_<NAME>`` overrides each one."""

    #: Native route: the probe's DelaySeconds (AWS) or initial visibility (Azure).
    native_delay: float = 30.0
    #: The ``-delay.fifo`` route: one 900 s hop, then the rest as native delay (about 16 minutes).
    fifo_delay: float = 960.0
    #: The time-bucket tier: due in about 12 minutes (sent to the tier whatever the native cap).
    tier_delay: float = 720.0
    #: Cancel and reschedule on the ``-delay.fifo`` route: due beyond the native cap plus the record cache.
    cancel_delay: float = 1020.0
    #: The rescheduled probe moves this much later than its first due time.
    reschedule_shift: float = 60.0
    #: The table route (Azure): due this far ahead, dispatched by the timer.
    table_delay: float = 90.0
    #: How late a probe may arrive before it counts as never arriving.
    grace: float = 120.0
    #: How long after the last arrival the probe queue is watched for duplicates.
    duplicate_watch: float = 20.0
    #: Longest wait of one receive (SQS long polling / Azure polling step).
    poll: float = 20.0
    #: Seconds between progress lines while probes are in flight.
    progress_every: float = 30.0
    #: The Azure dispatcher's heartbeat is stale after this long (three timer periods).
    heartbeat_max_age: float = 180.0
    #: How long the cost check waits for CloudWatch to show the probe window's requests (they lag minutes).
    metrics_wait: float = 360.0
    #: A probe later than this (seconds) is reported as a warning.
    lateness_warn: float = 60.0

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if not (is_number(value) and math.isfinite(value)):
                raise ConfigurationError(f"verify setting {f.name} must be a non-negative number, got {value!r}")
        if self.poll <= 0 or self.progress_every <= 0:
            raise ConfigurationError("verify settings poll and progress_every must be positive")

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> VerifySettings:
        """Read ``DELAYED_DELIVERY_VERIFY_<NAME>`` (seconds) for every field present in ``env``."""
        values: dict[str, float] = {}
        for f in fields(cls):
            name = VERIFY_ENV_PREFIX + f.name.upper()
            if name in env:
                raw = env[name].strip()
                try:
                    values[f.name] = float(raw)
                except ValueError:
                    raise ConfigurationError(f"{name}={raw[:40]!r} is not a number of seconds") from None
        return cls(**values)


class Cleanup:
    """What a run created, undone in reverse order on success, failure or Ctrl-C; problems are kept, not raised."""

    def __init__(self) -> None:
        self._undo: list[tuple[str, Callable[[], None]]] = []
        self.problems: list[str] = []
        self.done: list[str] = []

    def add(self, what: str, undo: Callable[[], None]) -> None:
        """Register ``undo`` for the resource ``what`` (e.g. "temporary queue x")."""
        self._undo.append((what, undo))

    def run(self) -> None:
        """Undo everything registered, newest first; each failure becomes one line in ``problems``."""
        while self._undo:
            what, undo = self._undo.pop()
            try:
                undo()
            except Exception as exc:  # one failed delete must not keep the others
                self.problems.append(f"could not delete {what}: {type(exc).__name__}: {' '.join(str(exc).split())}")
            else:
                self.done.append(what)

    @contextmanager
    def scope(self) -> Iterator[Cleanup]:
        """Run the clean-up when the block ends, whatever ends it (KeyboardInterrupt included)."""
        try:
            yield self
        finally:
            self.run()


#: One step of a run: it returns its checks' results (a check that cannot run returns a failed result).
Step = Callable[[], Iterable[CheckResult]]


def run_verification(
    *,
    cloud: str,
    target: str,
    mode: Mode,
    local: bool,
    clock: Any,
    cleanup: Cleanup,
    progress: Progress,
    steps: Iterable[Step],
) -> VerifyReport:
    """Run ``steps`` in order inside the clean-up's scope; Ctrl-C ends the run (reported), the clean-up runs anyway."""
    started = clock.now()
    results: list[CheckResult] = []
    interrupted = False
    with cleanup.scope():
        try:
            for step in steps:
                results += step()
        except KeyboardInterrupt:
            interrupted = True
            progress("interrupted: cleaning up")
    return VerifyReport(
        cloud=cloud,
        target=target,
        mode=mode,
        local=local,
        started_at=started,
        finished_at=clock.now(),
        results=tuple(results),
        cleanup_problems=tuple(cleanup.problems),
        interrupted=interrupted,
    )


def lateness_figures(values: Iterable[float]) -> dict[str, float]:
    """Median and worst lateness (seconds, 3 decimals) of the arrivals; empty when none arrived."""
    found = sorted(values)
    if not found:
        return {}
    return {"median_s": round(statistics.median(found), 3), "max_s": round(found[-1], 3), "min_s": round(found[0], 3)}


@dataclass(frozen=True, slots=True)
class Arrival:
    """One receive of a probe: when, what body and headers (in one comparable form per cloud), by which route."""

    received_at: datetime
    body: str
    headers: Mapping[str, str]
    route: str | None = None


@dataclass(slots=True)
class Probe:
    """One probe message: what was sent, when it is due, whether it must arrive, and every arrival seen."""

    kind: str
    message_id: str
    body: str
    headers: Mapping[str, str]
    sent_at: datetime
    due: datetime
    expect: bool = True
    route: str = ""
    error: str | None = None
    arrivals: list[Arrival] = field(default_factory=list)

    def deadline(self, settings: VerifySettings) -> datetime:
        """Waiting ends after the duplicate watch once it arrived; else after the grace (due + watch if cancelled)."""
        if self.error is not None:
            return self.sent_at
        if self.arrivals:
            return self.arrivals[-1].received_at + timedelta(seconds=settings.duplicate_watch)
        if not self.expect:
            return self.due + timedelta(seconds=settings.duplicate_watch)
        return self.due + timedelta(seconds=settings.grace)


def span(seconds: float) -> str:
    """A duration for people: ``2.2 s`` under a minute, else whole units (``16m``, ``1h2m``)."""
    if abs(seconds) < 60:
        return f"{seconds:.1f} s"
    return format_duration(round(seconds))


def probe_progress(probes: Sequence[Probe], now: datetime, start: datetime) -> str:
    """One progress line: how long it has waited and where each probe still waited for stands."""
    parts = []
    for p in probes:
        left = (p.due - now).total_seconds()
        if p.arrivals:
            state = "arrived, watching for duplicates"
        else:
            state = f"due in {span(left)}" if left > 0 else f"{span(-left)} past due"
        parts.append(f"{p.kind} {state}")
    elapsed = span(max(0.0, (now - start).total_seconds()))
    return f"{elapsed}: waiting for {len(probes)} probe(s): {'; '.join(parts)}"


def _late(lateness: float) -> str:
    return f"{lateness:.2f} s late" if lateness >= 0 else f"{-lateness:.2f} s early (clocks)"


def _probe_problems(probe: Probe) -> list[str]:
    first = probe.arrivals[0]
    problems = []
    if first.body != probe.body:
        problems.append(f"the body changed ({len(probe.body)} → {len(first.body)} characters)")
    if dict(first.headers) != dict(probe.headers):
        problems.append(f"the attributes changed (sent {sorted(probe.headers)}, got {sorted(first.headers)})")
    if len(probe.arrivals) > 1:
        problems.append(f"it arrived {len(probe.arrivals)} times")
    lateness = (first.received_at - probe.due).total_seconds()
    if lateness < -1.0:
        problems.append(f"it arrived {span(-lateness)} early")
    return problems


def _problem_fix(problems: list[str]) -> str:
    text = " ".join(problems)
    if "early" in text:
        return "check this machine's clock (NTP) and the queue's own delay settings"
    if "times" in text:
        return "look for a second dispatcher, requeue function or consumer on the probe's queues"
    return "something rewrites messages on the way: look for another producer or a changed function"


def judge_probe(
    probe: Probe,
    settings: VerifySettings,
    *,
    subject: str,
    route: str,
    missing: Callable[[], tuple[str, str]],
    send_fix: str,
    cancel_fix: str,
) -> CheckResult:
    """The probe's check: sent, arrived (or, cancelled, never), intact, once, and how late.

    ``missing()`` says where a probe that never arrived is and what to do (it is asked only then).
    """
    check, group = f"probe-{probe.kind}", Group.BEHAVIOUR
    if probe.error is not None:
        return failed(check, group, subject, f"the probe could not be sent: {probe.error}", send_fix)
    if not probe.expect:
        if probe.arrivals:
            return failed(check, group, subject, f"cancelled, yet it arrived (via {route})", cancel_fix)
        return passed(check, group, subject, f"cancelled on {route}: it did not arrive by its due time")
    if not probe.arrivals:
        evidence, fix = missing()
        waited = span((probe.due - probe.sent_at).total_seconds() + settings.grace)
        return failed(check, group, subject, f"sent via {route}, never arrived within {waited}: {evidence}", fix)
    lateness = (probe.arrivals[0].received_at - probe.due).total_seconds()
    data = {"route": probe.route, "lateness_s": round(lateness, 3), "arrivals": len(probe.arrivals)}
    problems = _probe_problems(probe)
    if problems:
        return failed(check, group, subject, f"via {route}: " + "; ".join(problems), _problem_fix(problems), **data)
    evidence = f"via {route}: arrived {_late(lateness)}, body and attributes intact, once"
    if lateness > settings.lateness_warn:
        return warned(check, group, subject, evidence, "see docs/verify.md, 'Reading the lateness line'", **data)
    return passed(check, group, subject, evidence, **data)
