from __future__ import annotations

import hashlib

import pytest

from delayed_delivery import (
    ConfigurationError,
    azure_delays_table_name,
    estimate_sqs_cost,
    fifo_cycle_cost,
    sqs_delay_queue_name,
)
from delayed_delivery.naming import (
    sqs_input_queue_name,
    validate_azure_container_name,
    validate_azure_queue_name,
    validate_azure_table_name,
)


def test_sqs_delay_queue_name() -> None:
    assert sqs_delay_queue_name("orders") == "orders-delay.fifo"
    assert sqs_input_queue_name("orders-delay.fifo") == "orders"
    assert len(sqs_delay_queue_name("q" * 69)) == 80


@pytest.mark.parametrize("bad", ["", "has space", "q" * 70, "orders.fifo", "ünï", "a/b"])
def test_bad_sqs_names(bad: str) -> None:
    with pytest.raises(ConfigurationError):
        sqs_delay_queue_name(bad)


def test_fifo_destination_explains_why() -> None:
    with pytest.raises(ConfigurationError, match="per-message delay"):
        sqs_delay_queue_name("orders.fifo")


def test_input_queue_name_requires_the_suffix() -> None:
    with pytest.raises(ConfigurationError):
        sqs_input_queue_name("orders.fifo")


def test_azure_table_name_is_delays_plus_sha1() -> None:
    name = azure_delays_table_name("Sales.Endpoint")
    assert name == "delays" + hashlib.sha1(b"Sales.Endpoint").hexdigest()
    assert validate_azure_table_name(name) == name
    assert validate_azure_container_name(name) == name


@pytest.mark.parametrize("bad", ["", "  "])
def test_azure_endpoint_must_be_named(bad: str) -> None:
    with pytest.raises(ConfigurationError):
        azure_delays_table_name(bad)


@pytest.mark.parametrize("bad", ["ab", "1table", "has-hyphen", "t" * 64, "tables"])
def test_bad_table_names(bad: str) -> None:
    with pytest.raises(ConfigurationError):
        validate_azure_table_name(bad)


@pytest.mark.parametrize("bad", ["ab", "Upper", "a--b", "-ab", "ab-", "a_b", "x" * 64])
def test_bad_queue_and_container_names(bad: str) -> None:
    with pytest.raises(ConfigurationError):
        validate_azure_queue_name(bad)
    with pytest.raises(ConfigurationError):
        validate_azure_container_name(bad)


def test_nservicebus_cost_formula_one_year() -> None:
    assert fifo_cycle_cost("365d") == pytest.approx(0.03504)
    assert fifo_cycle_cost(31_536_000, requests_per_cycle=0.3) == pytest.approx(0.005256)


def test_estimate_counts_planned_cycles() -> None:
    short = estimate_sqs_cost(845)
    assert short.fifo_cycles == 0 and short.requests == 1
    long = estimate_sqs_cost(1925, requests_per_hop=2)
    assert long.fifo_cycles == 2 and long.requests == 5
