"""``azure verify`` end to end on Azurite, the dispatcher run locally: a healthy deployment passes; the wrong role
scope, a timer not running (no heartbeat, or a stale one), a probe never arriving, a missing table, container or
error queue and a corrupt heartbeat are each reported with their fix (the missing ones: recreated, with the command,
and the run creates none of them); unreachable storage and a refused key end the run with exit 3 and one JSON
document; the heartbeat's format is pinned."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from azure.data.tables import TableServiceClient
from azure.storage.blob import BlobServiceClient
from azure.storage.queue import QueueServiceClient
from typer.testing import CliRunner

from delayed_delivery.app.cli import app
from delayed_delivery.azure.heartbeat import HEARTBEAT_BLOB, Heartbeat, read_heartbeat, write_heartbeat
from delayed_delivery.naming import azure_delays_table_name
from tests.azure.conftest import new_name
from tests.docs.verify_checks import assert_documented
from tests.fixtures.azurite import Azurite

pytestmark = pytest.mark.azurite
runner = CliRunner()
GROUP = "/subscriptions/s/resourceGroups/rg/providers"
ACCOUNT = f"{GROUP}/Microsoft.Storage/storageAccounts/devstoreaccount1"
GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "azure_heartbeat.v1.json"

#: Compressed probes: native 1 s, table route due in 2 s, short grace and watches.
FAST = {
    "DELAYED_DELIVERY_VERIFY_NATIVE_DELAY": "1",
    "DELAYED_DELIVERY_VERIFY_TABLE_DELAY": "2",
    "DELAYED_DELIVERY_VERIFY_GRACE": "6",
    "DELAYED_DELIVERY_VERIFY_DUPLICATE_WATCH": "1",
    "DELAYED_DELIVERY_VERIFY_PROGRESS_EVERY": "2",
}


@pytest.fixture
def endpoint(azurite: Azurite, monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh endpoint set up as `azure setup` makes it, its settings in the environment."""
    name = new_name("e")
    monkeypatch.setenv("DELAYED_DELIVERY_STORAGE_CONNECTION_STRING", azurite.connection_string)
    monkeypatch.setenv("DELAYED_DELIVERY_ENDPOINT", name)
    for key in ("DELAYED_DELIVERY_ALLOWED_DESTINATIONS", "DELAYED_DELIVERY_ENABLED", "DELAYED_DELIVERY_ERROR_QUEUE"):
        monkeypatch.delenv(key, raising=False)
    for key, value in FAST.items():
        monkeypatch.setenv(key, value)
    result = runner.invoke(app, ["azure", "setup"])
    assert result.exit_code == 0, result.output
    return name


@pytest.fixture
def running(endpoint: str) -> str:
    """…and its timer ran: one dispatcher run wrote the heartbeat."""
    result = runner.invoke(app, ["azure", "dispatch", "--seconds", "1"])
    assert result.exit_code == 0, result.output
    return endpoint


def _verify(*args: str) -> tuple[int, dict[str, Any], str]:
    result = runner.invoke(app, ["azure", "verify", "--json", *args])
    try:
        return result.exit_code, json.loads(result.stdout), result.stderr
    except ValueError:
        raise AssertionError(
            f"not one JSON document (exit {result.exit_code}): {result.stdout}{result.stderr}"
        ) from None


def _checks(document: dict[str, Any], status: str) -> dict[str, dict[str, Any]]:
    return {c["check"]: c for c in document["checks"] if c["status"] == status}


def _roles(endpoint: str, *, table_scope: str | None = None) -> list[dict[str, str]]:
    """What `az role assignment list` prints for a deployment made by roles.bicep (the table scope replaceable)."""
    delays = azure_delays_table_name(endpoint)
    scopes = {
        "Storage Table Data Contributor": table_scope or f"{ACCOUNT}/tableServices/default/tables/{delays}",
        "Storage Blob Data Contributor": f"{ACCOUNT}/blobServices/default/containers/{delays}",
        "Storage Blob Data Owner": f"{GROUP}/Microsoft.Storage/storageAccounts/host1",
        "Monitoring Metrics Publisher": f"{GROUP}/Microsoft.Insights/components/ai",
    }
    items = [
        {"roleDefinitionName": r, "scope": s, "id": f"/id/{i}", "principalId": "p1"}
        for i, (r, s) in enumerate(scopes.items())
    ]
    for q in ("error", "delayed-delivery-probe"):
        items.append(
            {
                "roleDefinitionName": "Storage Queue Data Message Sender",
                "scope": f"{ACCOUNT}/queueServices/default/queues/{q}",
                "id": f"/id/{q}",
                "principalId": "p1",
            }
        )
    return items


def test_a_healthy_deployment_passes(running: str, tmp_path: Path) -> None:
    roles = tmp_path / "roles.json"
    roles.write_text(json.dumps(_roles(running)))
    code, document, err = _verify("--local", "--role-assignments", str(roles))
    assert code == 0 and document["ok"], _checks(document, "fail")
    passed = _checks(document, "pass")
    assert {"table", "lease-container", "error-queue", "probe-queue", "timer", "role-table", "role-broad"} <= set(
        passed
    )
    for kind, route in (("native", "native"), ("table", "table")):
        probe = passed[f"probe-{kind}"]
        assert probe["data"]["route"] == route and probe["data"]["arrivals"] == 1, probe
        assert -1 < probe["data"]["lateness_s"] < 5, probe
    account = _checks(document, "needs a real account")
    assert {"lease-semantics", "visibility-7d", "alerts"} <= set(account)
    assert "emulator answered" in account["lease-semantics"]["evidence"]
    assert "sending 2 probe(s)" in err
    assert_documented(document)


def test_the_wrong_role_scope_is_reported_with_its_fix(running: str, tmp_path: Path) -> None:
    roles = tmp_path / "roles.json"
    roles.write_text(json.dumps(_roles(running, table_scope=ACCOUNT)))  # the whole account, not the table
    code, document, _ = _verify("--local", "--role-assignments", str(roles))
    failure = _checks(document, "fail")["role-table"]
    assert code == 1 and "wider than table" in failure["evidence"], failure
    assert failure["fix"].startswith("az role assignment delete --ids /id/0; az role assignment create"), failure
    assert f"tables/{azure_delays_table_name(running)}" in failure["fix"], failure


def test_a_timer_that_never_ran_is_reported_with_its_fix(endpoint: str) -> None:
    code, document, _ = _verify("--local")
    failure = _checks(document, "fail")["timer"]
    assert code == 1 and "no heartbeat" in failure["evidence"], failure
    assert "azure dispatch" in failure["fix"] or "func start" in failure["fix"], failure


def test_a_timer_that_stopped_is_reported_with_its_fix(endpoint: str, azurite: Azurite) -> None:
    container = BlobServiceClient.from_connection_string(azurite.connection_string).get_container_client(
        azure_delays_table_name(endpoint)
    )
    write_heartbeat(container, Heartbeat(datetime.now(UTC) - timedelta(minutes=10), True, 1, 5, 0))
    code, document, _ = _verify("--local")
    failure = _checks(document, "fail")["timer"]
    assert code == 1 and "the timer is not running" in failure["evidence"], failure
    assert failure["data"]["heartbeat_age_s"] >= 600


def test_a_probe_never_arriving_is_reported_with_where_it_went(running: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DELAYED_DELIVERY_ALLOWED_DESTINATIONS", "orders")  # the dispatcher refuses the probe queue
    monkeypatch.setenv("DELAYED_DELIVERY_VERIFY_GRACE", "3")
    code, document, _ = _verify("--local")
    failures = _checks(document, "fail")
    assert code == 1 and "probe-table" in failures and "probe-allowed" in failures, failures
    assert "not on the probe queue" in failures["probe-table"]["evidence"], failures["probe-table"]
    assert "error queue" in failures["probe-table"]["fix"]
    assert "add it to allowedDestinations" in failures["probe-allowed"]["fix"]
    assert _checks(document, "pass")["probe-native"]  # the native route does not pass the dispatcher


def test_a_bad_listing_is_a_usage_error(endpoint: str, tmp_path: Path) -> None:
    bad = tmp_path / "roles.json"
    bad.write_text('{"not": "a list"}')
    result = runner.invoke(app, ["azure", "verify", "--local", "--role-assignments", str(bad)])
    assert result.exit_code == 2 and "JSON list" in result.stderr and result.stdout == ""


def test_the_heartbeat_format_is_pinned(azurite: Azurite) -> None:
    beat = Heartbeat(datetime(2030, 1, 1, 0, 0, 30, tzinfo=UTC), True, 2, 7, 1)
    assert json.loads(beat.to_json()) == json.loads(GOLDEN.read_text(encoding="utf-8"))
    container = BlobServiceClient.from_connection_string(azurite.connection_string).get_container_client(new_name("c"))
    container.create_container()
    assert read_heartbeat(container) is None
    container.upload_blob(HEARTBEAT_BLOB, GOLDEN.read_bytes())
    assert read_heartbeat(container) == beat


def _storage(connection: str) -> dict[str, list[str]]:
    """Every table, container (with its blobs) and queue of the account: what a run could have created."""
    blobs = BlobServiceClient.from_connection_string(connection)
    return {
        "tables": sorted(t.name for t in TableServiceClient.from_connection_string(connection).list_tables()),
        "containers": sorted(
            f"{c.name}/{b.name}"
            for c in blobs.list_containers()
            for b in blobs.get_container_client(c.name).list_blobs()
        )
        + sorted(c.name for c in blobs.list_containers()),
        "queues": sorted(q.name for q in QueueServiceClient.from_connection_string(connection).list_queues()),
    }


def test_missing_storage_is_recreated_with_the_command_and_a_local_run_creates_none_of_it(
    endpoint: str, azurite: Azurite, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before (issue 32): the table and container were answered with a deployment hint, the probes that need them
    with "give the identity the data roles", and the run created the table, the container and the error queue (the
    dispatcher's setup), so the next run passed."""
    errors = new_name("err")
    monkeypatch.setenv("DELAYED_DELIVERY_ERROR_QUEUE", errors)
    assert runner.invoke(app, ["azure", "setup"]).exit_code == 0
    connection, delays = azurite.connection_string, azure_delays_table_name(endpoint)
    TableServiceClient.from_connection_string(connection).delete_table(delays)
    BlobServiceClient.from_connection_string(connection).delete_container(delays)
    QueueServiceClient.from_connection_string(connection).delete_queue(errors)
    before = _storage(connection)
    code, document, _ = _verify("--local")
    assert _storage(connection) == before  # nothing it checks was created, nothing was left behind
    failures = _checks(document, "fail")
    assert code == 1 and {"table", "lease-container", "error-queue"} <= set(failures), failures
    for check in ("table", "lease-container", "error-queue"):
        assert failures[check]["fix"] == f"recreate it: delayed-delivery azure setup --endpoint {endpoint}", failures
    assert not [c for c in document["checks"] if "data roles" in (c["fix"] or "")], document["checks"]
    skipped = _checks(document, "skipped")
    assert {"probe-table", "lease-semantics"} <= set(skipped) and "table check" in skipped["probe-table"]["evidence"]
    assert _checks(document, "pass")["probe-native"]  # the native route needs none of it
    assert_documented(document)
    # the fix as printed
    assert runner.invoke(app, ["azure", "setup", "--endpoint", endpoint]).exit_code == 0
    _, document, _ = _verify("--local")
    assert {"table", "lease-container", "error-queue", "probe-table"} <= set(_checks(document, "pass")), document


def test_a_corrupt_heartbeat_is_recreated_with_the_command(running: str, azurite: Azurite) -> None:
    container = BlobServiceClient.from_connection_string(azurite.connection_string).get_container_client(
        azure_delays_table_name(running)
    )
    container.upload_blob(HEARTBEAT_BLOB, b"{not json", overwrite=True)
    code, document, _ = _verify("--local")
    failure = _checks(document, "fail")["timer"]
    assert code == 1 and "is not a heartbeat this version reads" in failure["evidence"], failure
    command = f"delayed-delivery azure dispatch --endpoint {running} --seconds 1"
    assert failure["fix"] == f"recreate it: {command} writes a new one", failure
    assert runner.invoke(app, command.split()[1:]).exit_code == 0
    assert "timer" in _checks(_verify("--local")[1], "pass")


def test_unreachable_storage_is_one_json_document_and_exit_3(endpoint: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before (issue 32): exit 2 (documented for usage errors) with nothing on stdout."""
    monkeypatch.setenv(
        "DELAYED_DELIVERY_STORAGE_CONNECTION_STRING",
        "DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey=a2V5;"
        "QueueEndpoint=http://127.0.0.1:9/devstoreaccount1;BlobEndpoint=http://127.0.0.1:9/devstoreaccount1;"
        "TableEndpoint=http://127.0.0.1:9/devstoreaccount1;",
    )
    code, document, err = _verify("--local")
    assert code == 3 and document["exit_code"] == 3 and document["ok"] is False and document["checks"] == []
    assert "could not be reached: cannot connect to 127.0.0.1:9" in document["error"], document
    assert err.startswith("error: ") and len(err.strip().splitlines()) == 1, err


def test_a_refused_key_is_one_json_document_and_exit_3(
    endpoint: str, azurite: Azurite, monkeypatch: pytest.MonkeyPatch
) -> None:
    wrong = azurite.connection_string.replace("AccountKey=Eby8", "AccountKey=AAAA")
    monkeypatch.setenv("DELAYED_DELIVERY_STORAGE_CONNECTION_STRING", wrong)
    code, document, _ = _verify("--local")
    assert (
        code == 3
        and not document["ok"]
        and document["error"] == "Azurite refused the credential (AuthenticationFailed)"
    )
    result = runner.invoke(app, ["azure", "verify", "--local"])  # without --json: one line, the same exit
    assert result.exit_code == 3 and result.stdout == "" and "refused the credential" in result.stderr


def test_the_shard_count_is_compared_with_the_partitions_in_use(running: str, azurite: Azurite) -> None:
    from delayed_delivery.azure.table_store import TableDelayedMessageStore
    from delayed_delivery.model import DelayedMessage

    code, document, _ = _verify("--local")
    check = {c["check"]: c for c in document["checks"]}["shard-count"]
    assert check["status"] == "pass" and "1 shard(s) recorded" in check["evidence"], check
    # a sender set to 4 shards by a version that did not check: rows land in partitions no dispatcher reads
    stray = TableDelayedMessageStore.from_connection_string(
        azurite.connection_string, azure_delays_table_name(running), shards=4
    )
    due = datetime.now(UTC) + timedelta(days=30)
    stray.store_many([DelayedMessage(f"m-{i}", "orders", b"x", due) for i in range(12)])
    code, document, _ = _verify("--local")
    failure = _checks(document, "fail")["shard-count"]
    assert code == 1 and "past the 1 shard(s) the table records: no dispatcher reads them" in failure["evidence"]
    assert "azure reshard --endpoint <endpoint> --local --to 1" in failure["fix"], failure
