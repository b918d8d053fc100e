"""The demo's emulator manager starts moto server and Azurite on free ports and stops them."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from delayed_delivery.app.emulators import LocalEmulators


def _open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


@pytest.mark.moto
@pytest.mark.azurite
def test_emulators_start_answer_and_stop() -> None:
    import boto3
    from azure.data.tables import TableServiceClient

    with LocalEmulators() as emulators:
        sqs = boto3.client("sqs", endpoint_url=emulators.sqs_endpoint, region_name="us-east-1")
        assert sqs.create_queue(QueueName="demo")["QueueUrl"].endswith("/demo")
        tables = TableServiceClient.from_connection_string(emulators.azure_connection_string)
        assert tables.create_table_if_not_exists("demotable").table_name == "demotable"
        ports = [p for e in emulators.emulators.values() for p in e.ports]
        assert all(_open(p) for p in ports)
    assert not any(_open(p) for p in ports)


def test_a_source_checkout_finds_its_own_azurite_from_any_folder(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    checkout = Path(__file__).resolve().parents[1] / "node_modules" / "azurite" / "dist" / "src" / "azurite.js"
    if not checkout.exists():
        pytest.fail(f"{checkout} is missing: run scripts/bootstrap.sh")
    monkeypatch.delenv("DELAYED_DELIVERY_AZURITE", raising=False)
    monkeypatch.chdir(tmp_path)
    emulators = LocalEmulators(moto=False)
    assert str(checkout) in emulators.emulators["azurite"].argv
