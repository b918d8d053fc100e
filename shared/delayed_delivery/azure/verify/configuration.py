"""Configuration checks of ``azure verify``: the delays table, the lease container and its blobs, the error and
probe queues, the timer's heartbeat, and the alert rules."""

from __future__ import annotations

from typing import Any

from azure.core.exceptions import AzureError, ResourceNotFoundError

from ...verification import CheckResult, Group, failed, needs_account, passed, skipped, span
from ..blob_lease import lease_blob_name
from ..heartbeat import HEARTBEAT_BLOB, read_heartbeat
from ..sdk_errors import translate
from .context import AzureVerifyContext

__all__ = ["ALERT_RULES", "alert_rules", "heartbeat", "lease_container", "queues", "table"]

C = Group.CONFIGURATION
#: The scheduled query rules ``operations.bicep`` creates (``<prefix>-<name>``).
ALERT_RULES = ("dispatch-lateness", "oldest-overdue", "error-queue", "lease-loss", "no-timer-run", "send-failures")
_DEPLOY = "deploy infra/azure (az deployment group create …)"


def table(ctx: AzureVerifyContext) -> CheckResult:
    """The delays table exists and can be read."""
    name = ctx.target.config.table_name
    try:
        entities = ctx.clients.tables.get_table_client(name).query_entities("PartitionKey ne ''", results_per_page=1)
        next(iter(entities.by_page()), None)
    except ResourceNotFoundError:
        return failed("table", C, name, f"the delays table {name!r} does not exist", _DEPLOY)
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
        return failed(
            "lease-container",
            C,
            config.container_name,
            f"the lease container {config.container_name!r} does not exist",
            _DEPLOY,
        )
    except AzureError as exc:
        raise translate(exc, f"listing container {config.container_name}") from exc
    missing = [lease_blob_name(s) for s in range(config.shards) if lease_blob_name(s) not in names]
    if missing:
        return failed(
            "lease-container",
            C,
            config.container_name,
            f"lease blobs missing for {len(missing)} of {config.shards} shard(s): {', '.join(missing[:5])}",
            "run the dispatcher once (it creates them) or `delayed-delivery azure setup`",
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
            fix = _DEPLOY if check == "error-queue" else "deploy infra/azure with deployVerifyProbe=true (the default)"
            results.append(failed(check, C, name, f"queue {name!r} does not exist", fix))
            continue
        except AzureError as exc:
            raise translate(exc, f"reading queue {name}") from exc
        results.append(passed(check, C, name, f"queue {name!r} exists"))
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
    try:
        beat = read_heartbeat(container)
    except AzureError as exc:
        raise translate(exc, f"reading {HEARTBEAT_BLOB}") from exc
    start = "publish the function app and check it runs (Functions > dispatch_delayed_messages > Monitor)"
    if ctx.target.local:
        start = "start the dispatcher: `func start` in the published folder, or `delayed-delivery azure dispatch`"
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
    rules = {}
    for item in listing:
        if isinstance(item, dict):
            props = item.get("properties") if isinstance(item.get("properties"), dict) else item
            rules[str(item.get("name", ""))] = bool((props or {}).get("enabled", True))
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
            "az monitor scheduled-query update -g <resource group> -n <name> --disabled false",
        )
    return passed("alerts", C, "alerts", f"{len(ALERT_RULES)} alert rules present and enabled")
