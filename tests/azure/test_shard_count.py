"""The shard count is the delays table's (Azurite): recorded at setup, read by senders, the timer and operators, a
process set otherwise refused at start-up with one line, earlier tables adopted, and ``azure reshard``."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from azure.data.tables import TableServiceClient, UpdateMode
from azure.storage.queue import QueueServiceClient

from delayed_delivery.azure.config import ENV_CONNECTION, ENV_ENDPOINT, ENV_SHARDS, AzureDelayedDeliveryConfig
from delayed_delivery.azure.layout import LAYOUT_PARTITION, LAYOUT_ROW, misplaced_partitions, read_layout
from delayed_delivery.azure.reshard import reshard
from delayed_delivery.azure.runner import AzureDispatcherHost
from delayed_delivery.azure.sender import AzureDelayedSender
from delayed_delivery.azure.table_store import TableDelayedMessageStore
from delayed_delivery.errors import ConfigurationError, MessagePlacedError
from delayed_delivery.model import DelayedMessage
from delayed_delivery.naming import azure_delays_table_name
from tests.app.cli.conftest import ok_json, run
from tests.azure.conftest import new_name
from tests.azure.harness import drain
from tests.fixtures.azurite import Azurite

pytestmark = pytest.mark.azurite


def _env(azurite: Azurite, endpoint: str, shards: int | None = None) -> dict[str, str]:
    env = {ENV_ENDPOINT: endpoint, ENV_CONNECTION: azurite.connection_string, "DELAYED_DELIVERY_ERROR_QUEUE": "error"}
    if shards is not None:
        env[ENV_SHARDS] = str(shards)
    return env


def _host(azurite: Azurite, endpoint: str, shards: int | None = None, run: float = 4.0) -> AzureDispatcherHost:
    config = AzureDelayedDeliveryConfig.from_env(
        {
            **_env(azurite, endpoint, shards),
            "DELAYED_DELIVERY_RUN_SECONDS": str(run),
            "DELAYED_DELIVERY_LEASE_SECONDS": "15",
        }
    )
    return AzureDispatcherHost(config)


def _sender(azurite: Azurite, endpoint: str, shards: int | None = None) -> AzureDelayedSender:
    return AzureDelayedSender.from_config(AzureDelayedDeliveryConfig.from_env(_env(azurite, endpoint, shards)))


def test_senders_the_timer_and_operators_use_the_tables_count_and_a_process_set_otherwise_is_refused(
    azurite: Azurite, queues: QueueServiceClient, queue: str
) -> None:
    """The issue's case: senders with 4 shards and the timer with the default 1 stranded 5 of 8 messages."""
    endpoint = new_name("ep")
    _host(azurite, endpoint, shards=4).setup_infrastructure()  # `azure setup` with DELAYED_DELIVERY_SHARDS=4
    sender = _sender(azurite, endpoint)  # senders and the timer with no setting follow the table
    host = _host(azurite, endpoint)
    host.setup_infrastructure()
    assert (sender.store.shards, host.config.shards, read_layout(host.store.table).shards) == (4, 4, 4)  # type: ignore[union-attr]
    due = datetime.now(UTC) - timedelta(seconds=1)
    for i in range(8):
        sender.send(queue, b"x", at=due + timedelta(microseconds=i), message_id=f"m-{i}", cancellable=True)
    assert host.store.count() == 8 and len(_partitions(host)) > 1, "spread over the 4 partitions"
    where = ["--cloud", "azure", "--connection-string", azurite.connection_string, "--endpoint", endpoint]
    assert ok_json("pending", *where)["pending"] == 8, "an operator with no setting sees them all"
    with pytest.raises(ConfigurationError, match=r"records 4 shard\(s\), but DELAYED_DELIVERY_SHARDS is 1"):
        _host(azurite, endpoint, shards=1).run()
    with pytest.raises(ConfigurationError, match="records 4 shard"):
        _sender(azurite, endpoint, 2)
    summary = host.run()
    assert summary.dispatched == 8 and sorted(e.message_id for e in drain(queues, queue)) == [
        f"m-{i}" for i in range(8)
    ]


def test_a_sender_made_before_the_table_learns_its_count_before_writing_a_row(azurite: Azurite, queue: str) -> None:
    endpoint = new_name("ep")
    early = _sender(azurite, endpoint, 4)  # no table yet: nothing recorded, nothing written
    fine = _sender(azurite, endpoint)
    _host(azurite, endpoint).setup_infrastructure()  # setup records 1
    with pytest.raises(ConfigurationError, match=r"records 1 shard\(s\), but DELAYED_DELIVERY_SHARDS is 4"):
        early.send(queue, b"x", delay="40d")
    fine.send(queue, b"x", delay="40d", message_id="m-1")
    assert fine.store.shards == 1 and fine.store.get("m-1") is not None


def test_a_cli_process_set_to_another_count_fails_with_one_line(
    azurite: Azurite, monkeypatch: pytest.MonkeyPatch
) -> None:
    endpoint = new_name("ep")
    monkeypatch.setenv(ENV_SHARDS, "3")
    setup = run("azure", "setup", "--connection-string", azurite.connection_string, "--endpoint", endpoint)
    assert setup.exit_code == 0 and "3 shard(s)" in setup.output, setup.output
    monkeypatch.setenv(ENV_SHARDS, "1")
    where = ["--cloud", "azure", "--connection-string", azurite.connection_string, "--endpoint", endpoint]
    for args in (["cancel", "m-1", *where], ["pending", *where], ["azure", "setup", *where[2:]]):
        result = run(*args)
        assert result.exit_code == 2, result.output
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and "records 3 shard(s), but DELAYED_DELIVERY_SHARDS is 1" in lines[0], lines
    monkeypatch.delenv(ENV_SHARDS)
    assert ok_json("pending", *where)["pending"] == 0


def test_a_table_made_before_the_count_was_recorded_keeps_working_and_gets_it_recorded(
    azurite: Azurite, tables: TableServiceClient, queues: QueueServiceClient, queue: str
) -> None:
    endpoint = new_name("ep")
    table = azure_delays_table_name(endpoint)
    old = TableDelayedMessageStore.from_connection_string(azurite.connection_string, table, shards=4)
    old.setup_infrastructure()  # what an earlier version did: no layout entity
    due = datetime.now(UTC) - timedelta(seconds=1)
    old.store_many([DelayedMessage(f"m-{i}", queue, b"x", due) for i in range(20)])
    assert read_layout(old.table) is None
    with pytest.raises(ConfigurationError, match=r"records no shard count and its rows were written with 4 shard"):
        _host(azurite, endpoint).setup_infrastructure()  # no setting: it would take 1 and strand 3 partitions
    assert read_layout(old.table) is None, "nothing recorded by a process that was refused"
    host = _host(azurite, endpoint, shards=4)
    host.setup_infrastructure()
    assert read_layout(old.table).shards == 4  # type: ignore[union-attr]
    assert host.run().dispatched == 20 and len(drain(queues, queue)) == 20
    entity = tables.get_table_client(table).get_entity(LAYOUT_PARTITION, LAYOUT_ROW)
    assert (entity["Shards"], entity["Version"]) == (4, 1)


@pytest.mark.parametrize(("before", "after"), [(1, 4), (4, 2)])
def test_reshard_moves_every_message_to_its_new_partition(
    azurite: Azurite, queues: QueueServiceClient, queue: str, before: int, after: int
) -> None:
    endpoint = new_name("ep")
    host = _host(azurite, endpoint, shards=before)
    host.setup_infrastructure()
    now = datetime.now(UTC)
    soon = [DelayedMessage(f"due-{i}", queue, f"d{i}".encode(), now - timedelta(seconds=1)) for i in range(12)]
    later = [DelayedMessage(f"far-{i}", queue, b"f", now + timedelta(days=400), {"k": "v"}) for i in range(12)]
    host.store.store_many(soon + later)
    claimed = host.store.for_shards(range(before), exclusive=True).fetch_due(now, 3)  # a dead dispatcher's claims
    assert len(claimed) == 3
    located = host.store._rows.locate(later[0].message_id)  # and a claim written before the Sending mark existed
    assert located is not None
    legacy = {"PartitionKey": located[0], "RowKey": located[1], "ClaimToken": "5" * 32}
    host.store.table.update_entity(legacy, mode=UpdateMode.MERGE)
    where = ["--connection-string", azurite.connection_string, "--endpoint", endpoint]
    result = run("azure", "reshard", *where, "--to", str(after), "--wait", "30")
    assert result.exit_code == 0, result.output
    document = ok_json_text(result.stdout)
    assert (document["shards_before"], document["shards"]) == (before, after)
    assert document["moved"] + document["kept"] == 24 and document["moved"] > 0
    store = TableDelayedMessageStore(host.store.table, shards=after)
    assert store.count() == 24 and misplaced_partitions(host.store.table, after) == []
    for m in soon + later:  # each found by id where the new count puts it, unchanged
        got = store.get(m.message_id)
        assert got == m, m.message_id
    for mid in [m.message_id for m in claimed] + [later[0].message_id]:  # their sends may have been made
        with pytest.raises(MessagePlacedError, match="may already be on its way"):
            store.remove(mid)
    with pytest.raises(ConfigurationError, match=f"records {after} shard"):
        _host(azurite, endpoint, shards=before).run()
    summary = _host(azurite, endpoint).run()  # no setting: the new count; the dead claims were cleared
    assert summary.dispatched == 12 and sorted(e.message_id for e in drain(queues, queue)) == sorted(
        m.message_id for m in soon
    )
    assert store.count() == 12


def test_an_interrupted_reshard_refuses_every_process_until_it_is_run_again(azurite: Azurite, queue: str) -> None:
    endpoint = new_name("ep")
    host = _host(azurite, endpoint, shards=1)
    host.setup_infrastructure()
    host.store.store_many(
        [DelayedMessage(f"m-{i}", queue, b"x", datetime.now(UTC) + timedelta(days=9)) for i in range(10)]
    )
    lease = host.lease(0)
    assert lease.try_acquire()  # a timer run holding shard 0 that does not end in time
    with pytest.raises(Exception, match="still held"):
        reshard(host.store.table, host.container, 3, configured=1, lease_seconds=15, wait_seconds=2)
    for process in (lambda: _host(azurite, endpoint).run(), lambda: _sender(azurite, endpoint)):
        with pytest.raises(ConfigurationError, match=r"being resharded from 1 to 3"):
            process()
    lease.release()
    with pytest.raises(ConfigurationError, match="being resharded to 3"):
        reshard(host.store.table, host.container, 2, configured=1, lease_seconds=15, wait_seconds=2)
    done = reshard(host.store.table, host.container, 3, configured=1, lease_seconds=15, wait_seconds=10)
    assert (done.before, done.after, done.moved + done.kept) == (1, 3, 10)
    assert _sender(azurite, endpoint).store.shards == 3


def _partitions(host: AzureDispatcherHost) -> set[str]:
    return {str(e["PartitionKey"]) for e in host.store.table.query_entities("RowKey ge 'd_' and RowKey lt 'd`'")}


def ok_json_text(text: str) -> dict[str, object]:
    import json

    return dict(json.loads(text))


def test_reshard_refuses_a_count_out_of_range(azurite: Azurite) -> None:
    endpoint = new_name("ep")
    where = ["--connection-string", azurite.connection_string, "--endpoint", endpoint]
    assert run("azure", "setup", *where).exit_code == 0
    result = run("azure", "reshard", *where, "--to", "0")
    assert result.exit_code == 2 and "--to must be from 1 to 1000" in result.stderr
    assert (
        read_layout(
            TableServiceClient.from_connection_string(azurite.connection_string).get_table_client(
                azure_delays_table_name(endpoint)
            )
        ).shards
        == 1
    )  # type: ignore[union-attr]


def test_a_migration_into_the_table_must_give_its_recorded_count(azurite: Azurite) -> None:
    from delayed_delivery.pipelines.targets import AzureTableTarget

    endpoint = new_name("ep")
    _host(azurite, endpoint, shards=4).setup_infrastructure()
    table = azure_delays_table_name(endpoint)
    with pytest.raises(
        ConfigurationError, match=rf"records 4 shard\(s\): give the target as azure-table:{table}\?shards=4"
    ):
        AzureTableTarget(azurite.connection_string, table).prepare()
    AzureTableTarget(azurite.connection_string, table, shards=4).prepare()
    fresh = new_name()
    AzureTableTarget(azurite.connection_string, fresh, shards=3).prepare()  # a new table records the target's count
    assert (
        read_layout(TableServiceClient.from_connection_string(azurite.connection_string).get_table_client(fresh)).shards
        == 3
    )  # type: ignore[union-attr]
