"""Role assignments against the least roles of roles.bicep, from listings as `az role assignment list` prints them:
the right scopes pass; a role on its resource group or account, a broad role, the host's role on the delays account
fail with the commands that fix them; account-wide sending passes only when the destinations are patterns."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from delayed_delivery.azure.config import AzureDelayedDeliveryConfig
from delayed_delivery.azure.verify.context import AzureTarget, AzureVerifyContext
from delayed_delivery.azure.verify.roles import role_checks
from delayed_delivery.verification import Status

GROUP = "/subscriptions/s/resourceGroups/rg"
ACCOUNT = f"{GROUP}/providers/Microsoft.Storage/storageAccounts/delays1"
HOST = f"{GROUP}/providers/Microsoft.Storage/storageAccounts/host1"
CONFIG = AzureDelayedDeliveryConfig(
    table_name="delaysx", container_name="delaysx", account_name="delays1", allowed_destinations=("orders",)
)


def _ctx(items: list[dict[str, Any]], config: AzureDelayedDeliveryConfig = CONFIG) -> AzureVerifyContext:
    target = AzureTarget(config, "test", local=False, role_assignments=items)
    clients = SimpleNamespace(queues=SimpleNamespace(account_name="delays1"))
    return AzureVerifyContext(target, clients, None, None, None, None, None)  # type: ignore[arg-type]


def _item(role: str, scope: str, i: int = 0) -> dict[str, Any]:
    return {"roleDefinitionName": role, "scope": scope, "id": f"/ra/{role[:5]}{i}", "principalId": "p1"}


def _healthy() -> list[dict[str, Any]]:
    queues = [
        _item("Storage Queue Data Message Sender", f"{ACCOUNT}/queueServices/default/queues/{q}", i)
        for i, q in enumerate(("error", "orders", "delayed-delivery-probe"))
    ]
    return [
        _item("Storage Table Data Contributor", f"{ACCOUNT}/tableServices/default/tables/delaysx"),
        _item("Storage Blob Data Contributor", f"{ACCOUNT}/blobServices/default/containers/delaysx"),
        _item("Storage Blob Data Owner", HOST),
        _item("Monitoring Metrics Publisher", f"{GROUP}/providers/Microsoft.Insights/components/ai"),
        *queues,
    ]


def _by_check(items: list[dict[str, Any]], config: AzureDelayedDeliveryConfig = CONFIG) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for result in role_checks(_ctx(items, config)):
        found.setdefault(result.check, []).append(result)
    return found


def test_the_roles_bicep_grants_pass() -> None:
    results = [r for rs in _by_check(_healthy()).values() for r in rs]
    assert all(r.status is Status.PASS for r in results), [r for r in results if r.status is not Status.PASS]
    assert len(_by_check(_healthy())["role-queue"]) == 3  # the error queue, orders and the probe queue


def test_a_role_on_the_resource_group_is_wider_than_its_resource() -> None:
    items = [i for i in _healthy() if i["roleDefinitionName"] != "Storage Blob Data Contributor"]
    items.append(_item("Storage Blob Data Contributor", GROUP, 9))
    [leases] = _by_check(items)["role-leases"]
    assert leases.status is Status.FAIL and f"is on {GROUP}, wider than container delaysx" in leases.evidence
    assert leases.fix.startswith("az role assignment delete --ids /ra/Stora9; az role assignment create")


def test_broad_roles_and_the_hosts_role_on_the_delays_account_fail() -> None:
    items = [*_healthy(), _item("Contributor", GROUP, 7), _item("Storage Blob Data Owner", ACCOUNT, 8)]
    found = _by_check(items)
    [broad] = found["role-broad"]
    assert broad.status is Status.FAIL and broad.fix == "az role assignment delete --ids /ra/Contr7"
    [host] = found["role-host"]
    assert host.status is Status.FAIL and "may read and delete every blob there" in host.evidence


def test_sending_on_the_whole_account_passes_only_for_pattern_destinations() -> None:
    items = [i for i in _healthy() if i["roleDefinitionName"] != "Storage Queue Data Message Sender"]
    items.append(_item("Storage Queue Data Message Sender", ACCOUNT, 5))
    assert all(r.status is Status.FAIL and "wider than queue" in r.evidence for r in _by_check(items)["role-queue"])
    patterns = AzureDelayedDeliveryConfig(
        table_name="delaysx", container_name="delaysx", account_name="delays1", allowed_destinations=("orders-*",)
    )
    [queues] = _by_check(items, patterns)["role-queues"]
    assert queues.status is Status.PASS and "orders-*" in queues.evidence


def test_a_missing_role_names_the_command_that_grants_it() -> None:
    items = [i for i in _healthy() if i["roleDefinitionName"] != "Storage Table Data Contributor"]
    [table] = _by_check(items)["role-table"]
    assert (
        table.status is Status.FAIL
        and table.evidence == "Storage Table Data Contributor is not assigned on table delaysx"
    )
    assert table.fix.startswith('az role assignment create --assignee p1 --role "Storage Table Data Contributor"')
