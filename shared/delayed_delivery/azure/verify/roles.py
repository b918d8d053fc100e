"""Role assignments of the dispatcher's identity and their scopes, against the least roles ``roles.bicep`` grants.

The listing is what ``az role assignment list --assignee <identity client id> --all -o json`` prints. Each expected
role must be assigned on its narrowest scope: the delays table, the lease container, each destination queue and
the error queue (or the whole delays account when the destinations are patterns), the host storage account and
Application Insights, and with recurring schedules on the schedules table. A role on a wider scope than that, or a
broad role anywhere, is a finding with its fix.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ...verification import CheckResult, Group, failed, needs_account, passed, skipped
from .context import AzureVerifyContext

__all__ = ["Assignment", "parse_assignments", "role_checks"]

P = Group.PERMISSIONS
#: Role definition ids of the built-in roles the checks name.
ROLE_NAMES = {
    "b7e6dc6d-f1e8-4753-8033-0f2253ddb2a6": "Storage Blob Data Owner",
    "ba92f5b4-2d11-453d-a403-e96b0029c9fe": "Storage Blob Data Contributor",
    "0a9a7e1f-b9d0-4cc4-a60d-0319b160aaa3": "Storage Table Data Contributor",
    "c6a89b2d-59bc-44d0-9896-0f6e12d7b80a": "Storage Queue Data Message Sender",
    "3913510d-42f4-4e42-8a64-420c390055eb": "Monitoring Metrics Publisher",
    "8e3af657-a8ff-443c-a75c-2fe8c4bcb635": "Owner",
    "b24988ac-6180-42a0-ab88-20f7382dd24c": "Contributor",
    "17d1049b-9a84-46fb-8f53-869881c3d3ab": "Storage Account Contributor",
    "974c5e8b-45b9-4653-ba55-5f855dd0fb88": "Storage Queue Data Contributor",
    "8a0f0c08-91a1-4084-bc3d-661d67233fed": "Storage Queue Data Message Processor",
}
#: Roles the dispatcher never needs: each is a finding wherever it is assigned.
BROAD = (
    "Owner",
    "Contributor",
    "Storage Account Contributor",
    "Storage Queue Data Contributor",
    "Storage Queue Data Message Processor",
)
_SERVICES = {
    "table": "tableServices/default/tables",
    "blob": "blobServices/default/containers",
    "queue": "queueServices/default/queues",
}


@dataclass(frozen=True, slots=True)
class Assignment:
    """One role assignment: the role's name, its scope and its id (for the fix)."""

    role: str
    scope: str
    id: str
    principal: str


def parse_assignments(items: Sequence[Mapping[str, Any]]) -> list[Assignment]:
    """The assignments of an ``az role assignment list`` listing (``roleDefinitionName`` or the id's GUID)."""
    found = []
    for item in items:
        if not isinstance(item, Mapping):
            continue
        props = item.get("properties") if isinstance(item.get("properties"), Mapping) else item
        assert isinstance(props, Mapping)
        definition = str(props.get("roleDefinitionId") or item.get("roleDefinitionId") or "")
        role = str(item.get("roleDefinitionName") or ROLE_NAMES.get(definition.rsplit("/", 1)[-1].lower(), definition))
        scope = str(props.get("scope") or item.get("scope") or "")
        principal = str(props.get("principalId") or item.get("principalId") or "")
        found.append(Assignment(role, scope, str(item.get("id") or item.get("name") or ""), principal))
    return found


def _account_scope(account: str) -> str:
    return f"/providers/Microsoft.Storage/storageAccounts/{account}".lower()


def _covers(scope: str, wanted_suffix: str) -> str:
    """``exact`` when ``scope`` is the wanted resource, ``wider`` when it contains it, else ``no``."""
    scope, wanted = scope.lower().rstrip("/"), wanted_suffix.lower()
    if scope.endswith(wanted):
        return "exact"
    if "/providers/" not in scope or wanted.startswith(scope[scope.index("/providers/") :] + "/"):
        return "wider"  # a subscription or resource group, or a parent resource of the wanted one
    return "no"


def _within(scope: str, account: str) -> bool:
    """True when ``scope`` is the account ``account`` (an ``_account_scope``) or a resource inside it."""
    scope = scope.lower().rstrip("/")
    return scope.endswith(account) or f"{account}/" in scope


def _check_one(check: str, role: str, wanted: str, what: str, found: list[Assignment], principal: str) -> CheckResult:
    """``role`` must be on the resource ending ``wanted``: exact passes, wider or missing fails with the fix."""
    mine = [a for a in found if a.role == role]
    exact = [a for a in mine if _covers(a.scope, wanted) == "exact"]
    wider = [a for a in mine if _covers(a.scope, wanted) == "wider"]
    create = f'az role assignment create --assignee {principal or "<identity>"} --role "{role}" --scope <...>{wanted}'
    if wider:
        ids = " ".join(a.id for a in wider)
        return failed(
            check,
            P,
            what,
            f"{role} is on {wider[0].scope}, wider than {what}: the identity can reach more than it needs",
            f"az role assignment delete --ids {ids}" + ("" if exact else f"; {create}"),
        )
    if exact:
        return passed(check, P, what, f"{role} on {exact[0].scope}")
    return failed(check, P, what, f"{role} is not assigned on {what}", create)


def role_checks(ctx: AzureVerifyContext) -> list[CheckResult]:
    """One check per expected role (and one for broad roles), or why they cannot run."""
    listing = ctx.target.role_assignments
    if listing is None:
        return [_unlisted(ctx)]
    found = parse_assignments(listing)
    principal = next((a.principal for a in found if a.principal), "")
    config, account = ctx.target.config, _account_scope(ctx.account)
    results = [
        _check_one(
            "role-table",
            "Storage Table Data Contributor",
            f"{account}/{_SERVICES['table']}/{config.table_name}",
            f"table {config.table_name}",
            found,
            principal,
        ),
        _check_one(
            "role-leases",
            "Storage Blob Data Contributor",
            f"{account}/{_SERVICES['blob']}/{config.container_name}",
            f"container {config.container_name}",
            found,
            principal,
        ),
    ]
    if ctx.notes.get("schedules") and ctx.target.schedules_table:  # schedule_checks found them on
        name = ctx.target.schedules_table
        wanted = f"{account}/{_SERVICES['table']}/{name}"
        results.append(_check_one("role-schedules", "Storage Table Data Contributor", wanted,
                                  f"schedules table {name}", found, principal))  # fmt: skip
    results += _queue_checks(ctx, found, principal, account)
    return [*results, _host_check(found, account), _broad_check(found)]


def _unlisted(ctx: AzureVerifyContext) -> CheckResult:
    """What the role checks would do, when no assignments were given."""
    if ctx.target.local:
        return needs_account(
            "roles",
            P,
            "identity",
            "will check the dispatcher identity's role assignments "
            "and their scopes: Table Data Contributor on the delays table only, Blob Data "
            "Contributor on the lease container only, Queue Data Message Sender on each "
            "destination and the error queue, Blob Data Owner on the host account, Monitoring "
            "Metrics Publisher on Application Insights, and no broad role",
        )
    return skipped(
        "roles",
        P,
        "identity",
        "give --role-assignments FILE, the output of `az role assignment "
        "list --assignee <identityClientId> --all -o json` (docs/verify.md)",
    )


def _host_check(found: list[Assignment], account: str) -> CheckResult:
    """Storage Blob Data Owner on the Functions host account, never on the delays account."""
    host = [a for a in found if a.role == "Storage Blob Data Owner"]
    on_delays = [a for a in host if _within(a.scope, account)]
    if on_delays:
        return failed(
            "role-host",
            P,
            "host account",
            f"Storage Blob Data Owner is on the delays account "
            f"({on_delays[0].scope}): it may read and delete every blob there",
            f"az role assignment delete --ids {on_delays[0].id} (it belongs on the host account)",
        )
    if host:
        return passed("role-host", P, "host account", f"Storage Blob Data Owner on {host[0].scope}")
    return failed(
        "role-host",
        P,
        "host account",
        "Storage Blob Data Owner is not assigned on the "
        "Functions host account: the host cannot keep its timer schedule",
        "deploy infra/azure again (roles.bicep assigns it)",
    )


def _broad_check(found: list[Assignment]) -> CheckResult:
    """No role broader than the ones the dispatcher needs."""
    broad = [a for a in found if a.role in BROAD]
    if broad:
        said = "; ".join(f"{a.role} on {a.scope}" for a in broad[:4])
        return failed(
            "role-broad",
            P,
            "identity",
            f"broad roles: {said}",
            "az role assignment delete --ids " + " ".join(a.id for a in broad),
        )
    return passed("role-broad", P, "identity", f"{len(found)} assignment(s), none broader than needed")


def _queue_checks(ctx: AzureVerifyContext, found: list[Assignment], principal: str, account: str) -> list[CheckResult]:
    """Message Sender on each exact queue; on the whole account only when the destinations are patterns."""
    config = ctx.target.config
    patterns = any(ch in d for d in config.allowed_destinations for ch in "*?")
    senders = [a for a in found if a.role == "Storage Queue Data Message Sender"]
    whole = [a for a in senders if a.scope.lower().rstrip("/").endswith(account)]
    if whole and patterns:
        return [
            passed(
                "role-queues",
                P,
                "queues",
                f"Storage Queue Data Message Sender on the delays account "
                f"(the destinations are patterns: {', '.join(config.allowed_destinations)})",
            )
        ]
    queues = list(dict.fromkeys([config.settings.error_queue, *config.allowed_destinations, ctx.target.probe_queue]))
    return [
        _check_one(
            "role-queue",
            "Storage Queue Data Message Sender",
            f"{account}/{_SERVICES['queue']}/{q}",
            f"queue {q}",
            found,
            principal,
        )
        for q in queues
        if not any(ch in q for ch in "*?")
    ]
