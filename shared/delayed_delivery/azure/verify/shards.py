"""The ``shard-count`` check of ``azure verify``: the count the delays table records against the partitions in use,
a sample of rows, the timer's last run and this process's own setting (docs/azure.md, "Shards")."""

from __future__ import annotations

from typing import Any

from azure.core.exceptions import AzureError, ResourceNotFoundError

from ...verification import CheckResult, Group, failed, passed, skipped
from ..heartbeat import HEARTBEAT_BLOB, read_heartbeat
from ..layout import SAMPLE, Layout, partitions_in_use, read_layout, written_with
from ..sdk_errors import translate
from .context import AzureVerifyContext

__all__ = ["shard_count"]

C = Group.CONFIGURATION
CHECK = "shard-count"


def shard_count(ctx: AzureVerifyContext) -> CheckResult:
    """The table records its shard count, and nothing disagrees with it: no rows where no dispatcher reads, ids in the
    partitions the count puts them in, the timer and this process using that count."""
    config = ctx.target.config
    table = ctx.clients.tables.get_table_client(config.table_name)
    name = config.table_name
    command = f"delayed-delivery azure {{}} --endpoint <endpoint>{' --local' if ctx.target.local else ''}"
    try:
        next(iter(table.query_entities("PartitionKey eq 'layout'", results_per_page=1)), None)
    except ResourceNotFoundError:
        return skipped(CHECK, C, name, "no delays table (see the table check)")
    except AzureError as exc:
        raise translate(exc, f"reading table {name}") from exc
    layout = _layout(ctx, read_layout(table), name, command)
    if isinstance(layout, CheckResult):
        return layout
    shards = layout.shards
    repair = f"`{command.format('reshard')} --to {shards}` moves every message to its partition"
    problem = _rows_problem(table, shards, name, repair)
    if problem is not None:
        return problem
    last_run = _last_run_shards(ctx)
    if last_run is not None and last_run != shards:
        return failed(
            CHECK,
            C,
            name,
            f"the timer's last run dispatched {last_run} shard(s); the table records {shards}",
            "publish this version of the function app (it uses the table's count at every run), or set its "
            f"DELAYED_DELIVERY_SHARDS to {shards}",
        )
    used = partitions_in_use(table)
    return passed(
        CHECK,
        C,
        name,
        f"{shards} shard(s) recorded; rows in {len(used)} of them and in no other partition; a sample of up to "
        f"{SAMPLE} due rows in their partitions" + ("" if last_run is None else "; the timer's last run used the same"),
        shards=shards,
        partitions_in_use=len(used),
    )


def _layout(ctx: AzureVerifyContext, layout: Layout | None, name: str, command: str) -> Layout | CheckResult:
    """The recorded layout, or a failed check when there is none, a reshard did not finish, or this process uses
    another count."""
    config = ctx.target.config
    if layout is None:
        return failed(
            CHECK,
            C,
            name,
            "the delays table records no shard count (made before it was recorded, and no process has started since)",
            f"`{command.format('setup')}` records it, after checking the rows agree "
            "(DELAYED_DELIVERY_SHARDS: the count the senders used)",
        )
    if layout.resharding_to is not None:
        return failed(
            CHECK,
            C,
            name,
            f"a reshard from {layout.shards} to {layout.resharding_to} shard(s) did not finish: every process refuses "
            "to start",
            f"`{command.format('reshard')} --to {layout.resharding_to}` finishes it",
        )
    if config.shards_configured and config.shards != layout.shards:
        return failed(
            CHECK,
            C,
            name,
            f"the table records {layout.shards} shard(s), DELAYED_DELIVERY_SHARDS here says {config.shards}",
            f"unset DELAYED_DELIVERY_SHARDS (the table's count is used) or set it to {layout.shards}",
        )
    return layout


def _rows_problem(table: Any, shards: int, name: str, repair: str) -> CheckResult | None:
    """A failed check when rows sit past the recorded shards, or in partitions their ids do not map to."""
    stranded = partitions_in_use(table, shards)
    if stranded:
        return failed(
            CHECK,
            C,
            name,
            f"rows in partition(s) {', '.join(stranded[:5])}, past the {shards} shard(s) the table records: no "
            "dispatcher reads them",
            repair,
            stranded=stranded,
        )
    agree, other = written_with(table, shards)
    if not agree:
        how = f" (they fit {other} shard(s))" if other is not None else ""
        return failed(
            CHECK,
            C,
            name,
            f"due rows whose ids the table's {shards} shard(s) put in other partitions{how}: cancel and reschedule "
            "cannot find them",
            repair,
        )
    return None


def _last_run_shards(ctx: AzureVerifyContext) -> int | None:
    """The shard count the timer's last run dispatched (its heartbeat), or None before it has run."""
    container = ctx.clients.blobs.get_container_client(ctx.target.config.container_name)
    try:
        beat = read_heartbeat(container)
    except AzureError as exc:
        raise translate(exc, f"reading {HEARTBEAT_BLOB}") from exc
    return None if beat is None else beat.shards
