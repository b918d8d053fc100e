"""The ``shard-count`` check of ``azure verify``: the count the delays table records against the partitions in use,
a sample of rows, the timer's last run and this process's own setting (docs/azure.md, "Shards")."""

from __future__ import annotations

from azure.core.exceptions import AzureError, ResourceNotFoundError

from ...verification import CheckResult, Group, failed, passed, skipped
from ..heartbeat import HEARTBEAT_BLOB, read_heartbeat
from ..layout import SAMPLE, partitions_in_use, read_layout, written_with
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
    layout = read_layout(table)
    if layout is None:
        return failed(
            CHECK,
            C,
            name,
            "the delays table records no shard count (made before it was recorded, and no process has started since)",
            f"`{command.format('setup')}` records it, after checking the rows agree "
            "(DELAYED_DELIVERY_SHARDS: the count the senders used)",
        )
    shards = layout.shards
    if layout.resharding_to is not None:
        return failed(
            CHECK,
            C,
            name,
            f"a reshard from {shards} to {layout.resharding_to} shard(s) did not finish: every process refuses to "
            "start",
            f"`{command.format('reshard')} --to {layout.resharding_to}` finishes it",
        )
    repair = f"`{command.format('reshard')} --to {shards}` moves every message to its partition"
    if config.shards_configured and config.shards != shards:
        return failed(
            CHECK,
            C,
            name,
            f"the table records {shards} shard(s), DELAYED_DELIVERY_SHARDS here says {config.shards}",
            f"unset DELAYED_DELIVERY_SHARDS (the table's count is used) or set it to {shards}",
        )
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
    container = ctx.clients.blobs.get_container_client(config.container_name)
    try:
        beat = read_heartbeat(container)
    except AzureError as exc:
        raise translate(exc, f"reading {HEARTBEAT_BLOB}") from exc
    if beat is not None and beat.shards != shards:
        return failed(
            CHECK,
            C,
            name,
            f"the timer's last run dispatched {beat.shards} shard(s); the table records {shards}",
            "publish this version of the function app (it uses the table's count at every run), or set its "
            f"DELAYED_DELIVERY_SHARDS to {shards}",
        )
    used = partitions_in_use(table)
    return passed(
        CHECK,
        C,
        name,
        f"{shards} shard(s) recorded; rows in {len(used)} of them and in no other partition; a sample of up to "
        f"{SAMPLE} due rows in their partitions" + ("" if beat is None else "; the timer's last run used the same"),
        shards=shards,
        partitions_in_use=len(used),
    )
