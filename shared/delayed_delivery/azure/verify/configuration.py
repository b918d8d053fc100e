"""Configuration checks of ``azure verify``: the delays table, the lease container and its blobs, the error and
probe queues, the timer's heartbeat, and the alert rules.

What is missing is recreated, not granted: the fix names the command that makes it again (``azure setup`` on an
emulator, ``az storage … create`` or the Bicep deployment in Azure), and the checks note it in ``ctx.missing`` so
the probes that need it are skipped rather than failed for the wrong reason (and, on an emulator, the dispatcher run
here does not create it behind the check's back)."""

from __future__ import annotations

from typing import Any

from azure.core.exceptions import AzureError, ResourceNotFoundError

from ...errors import DelayedDeliveryError
from ...verification import CheckResult, Group, failed, needs_account, passed, skipped, span
from ..blob_lease import lease_blob_name
from ..heartbeat import HEARTBEAT_BLOB, read_heartbeat
from ..sdk_errors import translate
from .context import AzureVerifyContext

__all__ = ["ALERT_RULES", "alert_rules", "heartbeat", "lease_container", "queues", "recreate", "table"]

C = Group.CONFIGURATION
#: The scheduled query rules ``operations.bicep`` creates (``<prefix>-<name>``); a test compares them with the Bicep.
ALERT_RULES = (
    "dispatch-lateness",
    "oldest-overdue",
    "release-lag",
    "run-overrun",
    "placement-lag",
    "removal-failures",
    "placement-not-withdrawn",
    "error-queue",
    "lease-loss",
    "no-timer-run",
    "schedule-missed",
    "schedule-failures",
    "send-failures",
)
_DEPLOY = "deploy infra/azure (az deployment group create …)"
_AGAIN = "or deploy infra/azure again, which restores its role assignments too"


def recreate(ctx: AzureVerifyContext, kind: str, name: str) -> str:
    """The fix for a missing table, container or queue: the command that makes it again."""
    if ctx.target.local:
        return f"recreate it: {ctx.target.command('setup')}"
    return (
        f"recreate it: az storage {kind} create --name {name} --account-name {ctx.account} --auth-mode login ({_AGAIN})"
    )


def table(ctx: AzureVerifyContext) -> CheckResult:
    """The delays table exists and can be read."""
    name = ctx.target.config.table_name
    try:
        entities = ctx.clients.tables.get_table_client(name).query_entities("PartitionKey ne ''", results_per_page=1)
        next(iter(entities.by_page()), None)
    except ResourceNotFoundError:
        ctx.missing.add("table")
        return failed(
            "table",
            C,
            name,
            f"the delays table {name!r} does not exist: no message can be kept past 7 days, none waiting is sent",
            recreate(ctx, "table", name),
        )
    except AzureError as exc:
        raise translate(exc, f"reading table {name}") from exc
    return passed("table", C, name, f"the delays table {name!r} exists and can be read")


def lease_container(ctx: AzureVerifyContext) -> CheckResult:
    """The lease container exists with one lease blob per shard."""
    config = ctx.target.config
    container = ctx.clients.blobs.get_container_client(config.container_name)
    try:
        names = {b.name for b in container.list_blobs(name_starts_with="shard-")}
    except ResourceNotFoundError:
        ctx.missing.update(("container", "lease blobs"))
        fix = recreate(ctx, "container", config.container_name)
        return failed(
            "lease-container",
            C,
            config.container_name,
            f"the lease container {config.container_name!r} does not exist: no dispatcher can hold a shard",
            fix if ctx.target.local else f"{fix}; the timer's next run creates the lease blobs in it",
        )
    except AzureError as exc:
        raise translate(exc, f"listing container {config.container_name}") from exc
    missing = [lease_blob_name(s) for s in range(config.shards) if lease_blob_name(s) not in names]
    if missing:
        ctx.missing.add("lease blobs")
        again = ctx.target.command("setup") if ctx.target.local else "the timer's next run creates them"
        return failed(
            "lease-container",
            C,
            config.container_name,
            f"lease blobs missing for {len(missing)} of {config.shards} shard(s): {', '.join(missing[:5])}",
            f"recreate them: {again}",
        )
    return passed("lease-container", C, config.container_name, f"{config.shards} lease blob(s)")


def queues(ctx: AzureVerifyContext) -> list[CheckResult]:
    """The error queue and the probe queue exist."""
    results = []
    for check, name in (
        ("error-queue", ctx.target.config.settings.error_queue),
        ("probe-queue", ctx.target.probe_queue),
    ):
        try:
            ctx.clients.queues.get_queue_client(name).get_queue_properties()
        except ResourceNotFoundError:
            if check == "error-queue":
                ctx.missing.add("error queue")
                fix = recreate(ctx, "queue", name)
            else:
                fix = "deploy infra/azure with deployVerifyProbe=true (the default)"
            results.append(failed(check, C, name, f"queue {name!r} does not exist", fix))
            continue
        except AzureError as exc:
            raise translate(exc, f"reading queue {name}") from exc
        made = " (made for this run on the emulator, deleted after)" if ctx.notes.get("probe_queue_made") else ""
        results.append(passed(check, C, name, f"queue {name!r} exists{made if check == 'probe-queue' else ''}"))
    refusal = ctx.target.config.destination_policy.refusal(ctx.target.probe_queue)
    if ctx.target.config.allowed_destinations and refusal:
        results.append(
            failed(
                "probe-allowed",
                C,
                ctx.target.probe_queue,
                f"the dispatcher would refuse it: {refusal}",
                "add it to allowedDestinations (deployVerifyProbe does)",
            )
        )
    return results


def heartbeat(ctx: AzureVerifyContext) -> CheckResult:
    """The timer runs: the dispatcher's last heartbeat is recent and says delayed delivery is on."""
    container = ctx.clients.blobs.get_container_client(ctx.target.config.container_name)
    start = "publish the function app and check it runs (Functions > dispatch_delayed_messages > Monitor)"
    if ctx.target.local:
        start = "start the dispatcher: `func start` in the published folder, or `delayed-delivery azure dispatch`"
    try:
        beat = read_heartbeat(container)
    except AzureError as exc:
        raise translate(exc, f"reading {HEARTBEAT_BLOB}") from exc
    except DelayedDeliveryError as exc:  # there, but not a heartbeat this version reads
        return failed("timer", C, "dispatcher", f"{exc}: whether the timer runs is unknown", _rewrite_heartbeat(ctx))
    if "container" in ctx.missing:
        return failed(
            "timer",
            C,
            "dispatcher",
            "no lease container, so no heartbeat: no dispatcher can run",
            "recreate the lease container first (the lease-container check)",
        )
    if beat is None:
        return failed(
            "timer",
            C,
            "dispatcher",
            f"no heartbeat in {ctx.target.config.container_name}/{HEARTBEAT_BLOB}: the timer has never finished a run",
            start,
        )
    age = (ctx.clock.now() - beat.finished_at).total_seconds()
    evidence = (
        f"last run finished {span(max(0.0, age))} ago: {beat.dispatched} dispatched, "
        f"{beat.error_queue} to the error queue, {beat.shards} shard(s)"
    )
    data: dict[str, Any] = {"heartbeat_age_s": round(age, 1)}
    if age > ctx.settings.heartbeat_max_age:
        return failed(
            "timer",
            C,
            "dispatcher",
            f"{evidence}: the timer is not running (older than {span(ctx.settings.heartbeat_max_age)})",
            start,
            **data,
        )
    if not beat.enabled:
        return failed(
            "timer",
            C,
            "dispatcher",
            f"{evidence}, but delayed delivery is switched off",
            "set the app setting DELAYED_DELIVERY_ENABLED=true (Bicep parameter enabled)",
            **data,
        )
    return passed("timer", C, "dispatcher", evidence, **data)


def _rewrite_heartbeat(ctx: AzureVerifyContext) -> str:
    """Recreate an unreadable heartbeat: the dispatcher overwrites it at the end of every run."""
    container = ctx.target.config.container_name
    if ctx.target.local:
        return f"recreate it: {ctx.target.command('dispatch')} --seconds 1 writes a new one"
    return (
        f"recreate it: az storage blob delete --account-name {ctx.account} --container-name {container} --name "
        f"{HEARTBEAT_BLOB} --auth-mode login; the timer's next run writes a new one (if it stays unreadable, the "
        "function app is not finishing its runs: Functions > dispatch_delayed_messages > Monitor)"
    )


def alert_rules(ctx: AzureVerifyContext) -> CheckResult:
    """Every alert rule of ``operations.bicep`` exists and is enabled."""
    listing = ctx.target.alert_rules
    if listing is None:
        will = (
            f"will check the {len(ALERT_RULES)} scheduled query rules ({', '.join(ALERT_RULES)}) exist and are enabled"
        )
        if ctx.target.local:
            return needs_account("alerts", C, "alerts", will)
        return skipped(
            "alerts",
            C,
            "alerts",
            "give --alert-rules FILE, the output of `az monitor scheduled-query "
            "list -g <resource group> -o json` (docs/verify.md)",
        )
    rules, groups = {}, {}
    for item in listing:
        if isinstance(item, dict):
            props = item.get("properties") if isinstance(item.get("properties"), dict) else item
            rules[str(item.get("name", ""))] = bool((props or {}).get("enabled", True))
            groups[str(item.get("name", ""))] = str(item.get("resourceGroup") or "<resource group>")
    missing = [r for r in ALERT_RULES if not any(n.endswith(f"-{r}") for n in rules)]
    disabled = [n for n, on in rules.items() if not on and any(n.endswith(f"-{r}") for r in ALERT_RULES)]
    if missing:
        return failed("alerts", C, "alerts", f"missing alert rules: {', '.join(missing)}", _DEPLOY)
    if disabled:
        return failed(
            "alerts",
            C,
            "alerts",
            f"disabled: {', '.join(disabled)}",
            "; ".join(f"az monitor scheduled-query update -g {groups[n]} -n {n} --disabled false" for n in disabled),
        )
    return passed("alerts", C, "alerts", f"{len(ALERT_RULES)} alert rules present and enabled")
