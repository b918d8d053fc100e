"""``azure verify``'s recurring-schedule checks on Azurite: off (no table) is skipped; required but missing fails
with the commands; a schedule overdue because the timer does not run fails, naming it, and passes once the timer ran;
a timer that never ran fails; the schedules table's role is checked on its own scope when schedules are on."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from delayed_delivery.azure.verify.context import AzureTarget, AzureVerifyContext
from delayed_delivery.azure.verify.roles import role_checks
from delayed_delivery.azure.verify.schedules import schedule_checks
from delayed_delivery.clock import ManualClock
from delayed_delivery.verification import Cleanup, Status, VerifySettings
from tests.azure.schedules.conftest import Endpoint, rate_schedule
from tests.docs.verify_checks import DOC

pytestmark = pytest.mark.azurite


def _ctx(endpoint: Endpoint, *, table: str | None = None, on: bool = False, now: datetime | None = None,
         roles: list[dict[str, Any]] | None = None) -> AzureVerifyContext:  # fmt: skip
    target = AzureTarget(
        endpoint.host.config,
        "test",
        local=True,
        role_assignments=roles,
        schedules_table=table or endpoint.schedules.table.table_name,
        schedules_on=on,
        cli_options="--local --endpoint e1",
    )
    clock = ManualClock(now or datetime.now(UTC))
    return AzureVerifyContext(target, endpoint.host.clients, VerifySettings(), clock, lambda _: None, Cleanup(), None)  # type: ignore[arg-type]


def _by_check(ctx: AzureVerifyContext) -> dict[str, Any]:
    found = {r.check: r for r in schedule_checks(ctx)}
    assert all(f"`{name}`" in DOC for name in found), f"not explained in docs/verify.md: {sorted(found)}"
    return found


def test_no_schedules_table_is_skipped_unless_schedules_are_required(endpoint: Endpoint) -> None:
    off = _by_check(_ctx(endpoint, table="nosuchsched"))
    assert list(off) == ["schedules-table"] and off["schedules-table"].status is Status.SKIPPED
    assert "recurring schedules are off" in off["schedules-table"].evidence
    required = _by_check(_ctx(endpoint, table="nosuchsched", on=True))
    assert {name: r.status for name, r in required.items()} == {
        "schedules-table": Status.FAIL,
        "schedule-timer": Status.FAIL,
    }
    assert "azure setup" in required["schedules-table"].fix
    assert "azure dispatch --local --endpoint e1 --schedules" in required["schedule-timer"].fix


def test_an_overdue_schedule_fails_the_timer_check_until_the_timer_runs(endpoint: Endpoint) -> None:
    schedule = rate_schedule("verify-late", endpoint.queue, minutes_ago=10)
    endpoint.schedules.create(schedule)
    assert schedule.next_at is not None
    before = _by_check(_ctx(endpoint, now=schedule.next_at + timedelta(minutes=10)))
    assert before["schedules-table"].status is Status.PASS
    timer = before["schedule-timer"]
    assert timer.status is Status.FAIL and "(verify-late due 10m ago)" in timer.evidence, timer
    assert "the schedule timer is not running" in timer.evidence and timer.data == {"overdue": 1}

    endpoint.timer(lead=0).run()  # writes the ten occurrences due and moves the schedule past now
    after = _by_check(_ctx(endpoint))["schedule-timer"]
    assert after.status is Status.PASS, after
    assert after.data == {"lease_blobs": 16} and "no active schedule overdue" in after.evidence
    # The same storage seen 10 minutes later, the timer stopped since: overdue again.
    later = _by_check(_ctx(endpoint, now=datetime.now(UTC) + timedelta(minutes=10)))["schedule-timer"]
    assert later.status is Status.FAIL and "verify-late" in later.evidence, later


def test_a_timer_that_never_ran_fails(endpoint: Endpoint) -> None:
    timer = _by_check(_ctx(endpoint))["schedule-timer"]
    assert timer.status is Status.FAIL and "has never run" in timer.evidence, timer


def _roles(endpoint: Endpoint, schedules_scope: str | None) -> list[dict[str, Any]]:
    account = "/subscriptions/s/resourceGroups/rg/providers/Microsoft.Storage/storageAccounts/devstoreaccount1"
    delays = endpoint.host.config.table_name
    items = [{"roleDefinitionName": "Storage Table Data Contributor", "id": "/ra/0", "principalId": "p1",
              "scope": f"{account}/tableServices/default/tables/{delays}"}]  # fmt: skip
    if schedules_scope is not None:
        items.append({"roleDefinitionName": "Storage Table Data Contributor", "id": "/ra/1", "principalId": "p1",
                      "scope": schedules_scope.replace("<account>", account)})  # fmt: skip
    return items


@pytest.mark.parametrize(
    ("scope", "status", "said"),
    [
        ("<account>/tableServices/default/tables/{table}", Status.PASS, "Storage Table Data Contributor on"),
        (None, Status.FAIL, "is not assigned on schedules table"),
        ("<account>", Status.FAIL, "wider than schedules table"),
    ],
)
def test_the_schedules_tables_role_is_checked_when_schedules_are_on(
    endpoint: Endpoint, scope: str | None, status: Status, said: str
) -> None:
    table = endpoint.schedules.table.table_name
    ctx = _ctx(endpoint, roles=_roles(endpoint, scope.format(table=table) if scope else None))
    assert "role-schedules" not in {r.check for r in role_checks(ctx)}  # not known to be on yet
    _by_check(ctx)  # the table exists: schedules are on
    (check,) = [r for r in role_checks(ctx) if r.check == "role-schedules"]
    assert check.status is status and said in check.evidence, check
    if status is Status.FAIL:
        assert f"tables/{table}" in check.fix
