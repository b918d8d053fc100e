"""``delayed-delivery azure setup --queue``: the destination queues are created with the endpoint's resources."""

from __future__ import annotations

import pytest
from azure.storage.queue import QueueServiceClient

from tests.app.cli.conftest import run

pytestmark = pytest.mark.azurite


def test_setup_creates_the_destination_queues_too(azurite_conn: str, unique_name: str) -> None:
    queues = QueueServiceClient.from_connection_string(azurite_conn)
    names = [f"{unique_name}a", f"{unique_name}b"]
    args = ["azure", "setup", "--connection-string", azurite_conn, "--endpoint", unique_name]
    done = run(*args, "--queue", names[0], "-q", names[1])
    assert done.exit_code == 0, done.output
    assert f"queue(s) {names[0]}, {names[1]}" in done.stdout
    existing = {q.name for q in queues.list_queues(name_starts_with=unique_name)}
    assert existing == set(names)
    assert run(*args, "--queue", names[0]).exit_code == 0  # idempotent
    # the operator commands can send to them at once, on the delays table
    cloud = ["--cloud", "azure", "--connection-string", azurite_conn, "--endpoint", unique_name]
    sent = run("send", *cloud, "--to", names[1], "--delay", "40d", "--body", "x", "--json")
    assert sent.exit_code == 0 and '"azure-table"' in sent.stdout, sent.output


def test_setup_checks_every_queue_name_before_creating_anything(azurite_conn: str, unique_name: str) -> None:
    args = ["azure", "setup", "--connection-string", azurite_conn, "--endpoint", unique_name]
    result = run(*args, "--queue", f"{unique_name}ok", "--queue", "Bad_Name")
    assert result.exit_code == 2 and "Bad_Name" in result.output
    queues = QueueServiceClient.from_connection_string(azurite_conn)
    assert not list(queues.list_queues(name_starts_with=unique_name))
