"""The cloud demo: delayed messages through SQS (moto server) and Azure Storage Queues (Azurite), time compressed.

How it works and what it measures: docs/demo.md.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator, Mapping

from delayed_delivery.app.demo.cloud_aws import AwsSide
from delayed_delivery.app.demo.cloud_azure import AzureSide
from delayed_delivery.app.demo.cloud_model import (
    CLOUD_DEMO_DELAYS,
    CloudDemoConfig,
    CloudDemoResult,
    CloudProgress,
    CloudSummary,
)
from delayed_delivery.app.demo.cloud_tracking import Tracker, plan_messages
from delayed_delivery.app.emulators import LocalEmulators

__all__ = [
    "CLOUD_DEMO_DELAYS",
    "CloudDemoConfig",
    "CloudDemoResult",
    "CloudProgress",
    "CloudSummary",
    "run_cloud_demo",
]

_Side = AwsSide | AzureSide
_OnProgress = Callable[[list[CloudProgress]], None]


@contextlib.contextmanager
def _environment(values: Mapping[str, str]) -> Iterator[None]:
    """Set environment variables for the run (what the Lambda configuration would set), then restore them."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, old in saved.items():
            if old is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = old


def _wait(trackers: list[Tracker], config: CloudDemoConfig, on_progress: _OnProgress | None) -> None:
    """Until everything arrived or the last due time plus the grace period has passed."""
    last_due = max((max(t.due.values(), default=0.0) for t in trackers), default=0.0)
    deadline = last_due + config.grace_seconds
    while time.time() < deadline:
        if on_progress:
            on_progress([t.progress(time.time()) for t in trackers])
        if all(t.done() for t in trackers):
            time.sleep(0.5)  # let a late duplicate show up
            break
        time.sleep(0.2)
    if on_progress:
        on_progress([t.progress(time.time()) for t in trackers])


def _run_sides(
    sides: list[_Side], config: CloudDemoConfig, on_progress: _OnProgress | None, status: Callable[[str], None]
) -> list[CloudSummary]:
    """Provision, start, send, wait until drained and summarise each side; always stop them."""
    try:
        status("provisioning queues, FIFO queues, table, lease container …")
        for side in sides:
            side.provision()
        for side in sides:
            side.start()
        status("sending …")
        for side in sides:
            side.send(plan_messages(config, side.tracker.cloud))
        status("dispatching …")
        _wait(_trackers(sides), config, on_progress)
        status("stopping …")
        summaries = []
        for side in sides:
            summary = side.tracker.summary(side.finish())
            if isinstance(side, AwsSide) and side.tier is not None:
                summary.buckets = side.tier.finish()
            if isinstance(side, AzureSide):
                summary.release = side.capped.summary(side.reports)
            summary.recurring = side.recurring_summary()
            summaries.append(summary)
        return summaries
    finally:
        for side in sides:
            side.close()


def _trackers(sides: list[_Side]) -> list[Tracker]:
    """Every cloud's tracker, the S3 tier's beside AWS's, the capped burst's beside Azure's, each schedule's."""
    trackers = [side.tracker for side in sides]
    trackers += [side.tier.tracker for side in sides if isinstance(side, AwsSide) and side.tier is not None]
    trackers += [side.capped.tracker for side in sides if isinstance(side, AzureSide)]
    trackers += [side.recurring.tracker for side in sides]
    return trackers


def _native_caps(sides: list[_Side]) -> dict[str, int]:
    """The compressed native caps each side ran with."""
    caps = {}
    for side in sides:
        if isinstance(side, AwsSide):
            caps["sqs_native_and_hop_seconds"] = side.sqs_settings.max_native_delay
            if side.tier is not None:
                levels = side.tier.tier.levels
                caps["bucket_fine_seconds"] = levels.fine_seconds
                caps["bucket_coarse_seconds"] = levels.coarse_seconds
                caps["bucket_dispatch_lead_seconds"] = levels.dispatch_lead_seconds
        else:
            caps["azure_native_seconds"] = side.native_cap
    return caps


def run_cloud_demo(
    config: CloudDemoConfig | None = None,
    *,
    on_progress: _OnProgress | None = None,
    on_status: Callable[[str], None] | None = None,
    verbose: bool = False,
) -> CloudDemoResult:
    """Start the emulators, run the demo on both clouds, stop the emulators and return the summary."""
    config = config or CloudDemoConfig()
    status = on_status or (lambda _: None)
    started = time.monotonic()
    status("starting moto server and Azurite on loopback …")
    with LocalEmulators(moto=config.aws, azurite=config.azure) as emulators:
        sides: list[_Side] = []
        if config.aws:
            sides.append(AwsSide(emulators.sqs_endpoint, config, Tracker("aws"), verbose))
        if config.azure:
            sides.append(AzureSide(emulators.azure_connection_string, config, Tracker("azure")))
        env = next((side.env for side in sides if isinstance(side, AwsSide)), {})
        with _environment(env):
            summaries = _run_sides(sides, config, on_progress, status)
    return CloudDemoResult(
        clouds=summaries,
        compression=config.compression,
        year_seconds=config.year_seconds,
        native_caps=_native_caps(sides),
        seconds=round(time.monotonic() - started, 1),
    )
