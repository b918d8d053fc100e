"""Spark job: migrate legacy timeouts into native delayed delivery (``preview``, ``run``, ``abort``).

Run with ``python -m delayed_delivery.pipelines migrate run --source … --target …``,
``spark-submit …/delayed_delivery/pipelines/__main__.py migrate run …`` or ``delayed-delivery migrate run …``.
"""

from __future__ import annotations

from delayed_delivery.pipelines.migrate.abort import AbortResult, abort_migration
from delayed_delivery.pipelines.migrate.load import LoadedSource, load_source
from delayed_delivery.pipelines.migrate.options import MigrationOptions
from delayed_delivery.pipelines.migrate.preview import (
    DUE_SOON_WINDOW,
    DestinationCount,
    PreviewResult,
    preview_migration,
)
from delayed_delivery.pipelines.migrate.run import MigrationSummary, run_migration

__all__ = [
    "DUE_SOON_WINDOW",
    "AbortResult",
    "DestinationCount",
    "LoadedSource",
    "MigrationOptions",
    "MigrationSummary",
    "PreviewResult",
    "abort_migration",
    "load_source",
    "preview_migration",
    "run_migration",
]
