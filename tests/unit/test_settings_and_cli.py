from __future__ import annotations

import json
import math

import pytest
from typer.testing import CliRunner

from delayed_delivery import ConfigurationError, DelayedDeliverySettings
from delayed_delivery.app.cli import app

runner = CliRunner()


def test_defaults_follow_the_seed() -> None:
    s = DelayedDeliverySettings()
    assert s.number_of_retries == 0
    assert s.time_to_trigger_store_circuit_breaker == 30
    assert s.time_to_trigger_fetch_circuit_breaker == 30
    assert s.time_to_trigger_dispatch_circuit_breaker == 30
    assert s.maximum_recovery_failures_per_second == 1
    assert s.max_native_delay == 900


def test_from_env_parses_types() -> None:
    s = DelayedDeliverySettings.from_env(
        {
            "DELAYED_DELIVERY_NUMBER_OF_RETRIES": "3",
            "DELAYED_DELIVERY_ENABLED": "false",
            "DELAYED_DELIVERY_MAX_NATIVE_DELAY": "2",
            "DELAYED_DELIVERY_ERROR_QUEUE": "poison",
            "UNRELATED": "x",
        }
    )
    assert (s.number_of_retries, s.enabled, s.max_native_delay, s.error_queue) == (3, False, 2, "poison")


@pytest.mark.parametrize(
    ("name", "value"),
    [("NUMBER_OF_RETRIES", "three"), ("ENABLED", "maybe"), ("BATCH_SIZE", "0"), ("MAX_IDLE_SLEEP", "nan")],
)
def test_bad_env_values_name_the_variable(name: str, value: str) -> None:
    with pytest.raises(ConfigurationError, match=name if name in ("NUMBER_OF_RETRIES", "ENABLED") else name.lower()):
        DelayedDeliverySettings.from_env({f"DELAYED_DELIVERY_{name}": value})


def test_negative_and_nan_settings_are_refused() -> None:
    with pytest.raises(ConfigurationError):
        DelayedDeliverySettings(retry_backoff=-1)
    with pytest.raises(ConfigurationError):
        DelayedDeliverySettings(failure_delay=math.nan)


def test_reference_documents_every_setting() -> None:
    rows = list(DelayedDeliverySettings.reference())
    assert {r[0] for r in rows} == set(DelayedDeliverySettings.__dataclass_fields__)
    assert all(r[3] for r in rows)


def test_cli_version_and_help() -> None:
    assert runner.invoke(app, ["--version"]).output.startswith("delayed-delivery 0.1.0")
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0 and "cost" in result.output and "demo" in result.output


def test_cli_cost_json_matches_the_seed_formula() -> None:
    result = runner.invoke(app, ["cost", "--delay", "365d", "--messages", "1", "--json"])
    assert result.exit_code == 0
    data = json.loads(result.output)
    assert data["seed_formula_usd_per_message"] == pytest.approx(0.03504)
    assert data["our_plan_fifo_cycles"] == 35_039


def test_cli_bad_duration_is_one_line_and_exit_2() -> None:
    result = runner.invoke(app, ["cost", "--delay", "soon"])
    assert result.exit_code == 2
    assert "cannot read duration" in result.output
    assert "Traceback" not in result.output


def test_cli_demo_loses_nothing() -> None:
    result = runner.invoke(app, ["demo", "--core", "--messages", "40", "--span", "2", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["lost"] == 0 and data["duplicates"] == 0
    assert data["delivered"] == 40 and data["error_queue"] == 4


def test_readme_configuration_table_matches_the_settings() -> None:
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    start = readme.index("<!-- settings:start")
    start = readme.index("\n", start) + 1
    end = readme.index("<!-- settings:end -->")
    assert readme[start:end].strip() == DelayedDeliverySettings.markdown_reference(), (
        "README configuration table is stale: regenerate it with `python -m delayed_delivery.settings`"
    )
