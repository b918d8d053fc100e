"""The alert rules ``azure verify`` checks are the rules ``operations.bicep`` deploys (all of them, ``release-lag`` and
``schedule-missed`` too), from listings as `az monitor scheduled-query list` prints them: present and enabled pass; a
missing or disabled one fails with its fix."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from delayed_delivery.azure.config import AzureDelayedDeliveryConfig
from delayed_delivery.azure.verify.configuration import ALERT_RULES, alert_rules
from delayed_delivery.azure.verify.context import AzureTarget, AzureVerifyContext
from delayed_delivery.verification import Status

OPERATIONS = Path(__file__).resolve().parents[2] / "infra" / "azure" / "modules" / "operations.bicep"
CONFIG = AzureDelayedDeliveryConfig(table_name="delaysx", container_name="delaysx", account_name="delays1")


def _bicep_rules() -> list[str]:
    """The ``name`` of every rule in operations.bicep's ``rules`` array."""
    text = OPERATIONS.read_text(encoding="utf-8")
    body = text[text.index("var rules = [") : text.index("\n]\n", text.index("var rules = ["))]
    return re.findall(r"^    name: '([a-z-]+)'$", body, re.MULTILINE)


def _check(listing: list[dict[str, Any]]) -> Any:
    target = AzureTarget(CONFIG, "test", local=False, alert_rules=listing)
    clients = SimpleNamespace(queues=SimpleNamespace(account_name="delays1"))
    return alert_rules(AzureVerifyContext(target, clients, None, None, None, None, None))  # type: ignore[arg-type]


def _listing(names: list[str], disabled: str | None = None) -> list[dict[str, Any]]:
    return [{"name": f"dd-{n}", "resourceGroup": "rg", "properties": {"enabled": n != disabled}} for n in names]


def test_verify_checks_every_rule_the_bicep_deploys() -> None:
    """Before (issue 32): 6 checked, 7 deployed (release-lag never checked); schedule-missed and schedule-failures
    came with #35; the burst path's run-overrun, removal-failures and placement-not-withdrawn with #34."""
    assert {"run-overrun", "removal-failures", "placement-not-withdrawn", "placement-lag", "schedule-failures"} <= set(
        _bicep_rules()
    )
    assert len(_bicep_rules()) == len(ALERT_RULES) == 13 and sorted(ALERT_RULES) == sorted(_bicep_rules())


def test_every_rule_present_and_enabled_passes() -> None:
    result = _check(_listing(list(ALERT_RULES)))
    assert result.status is Status.PASS and f"{len(ALERT_RULES)} alert rules" in result.evidence


def test_a_missing_release_lag_rule_fails() -> None:
    result = _check(_listing([r for r in ALERT_RULES if r != "release-lag"]))
    assert result.status is Status.FAIL and result.evidence == "missing alert rules: release-lag", result


@pytest.mark.parametrize("rule", ["release-lag", "send-failures", "run-overrun", "schedule-failures"])
def test_a_disabled_rule_fails_with_the_command_that_enables_it(rule: str) -> None:
    result = _check(_listing(list(ALERT_RULES), disabled=rule))
    assert result.status is Status.FAIL and result.evidence == f"disabled: dd-{rule}", result
    assert result.fix == f"az monitor scheduled-query update -g rg -n dd-{rule} --disabled false"


def test_a_missing_schedule_failures_rule_fails() -> None:
    result = _check(_listing([r for r in ALERT_RULES if r != "schedule-failures"]))
    assert result.status is Status.FAIL and result.evidence == "missing alert rules: schedule-failures", result
