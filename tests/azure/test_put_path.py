"""The put path: one connection pool sized to every shard's parallel puts, the environment read once per host."""

from __future__ import annotations

from typing import Any

import pytest
import requests

from delayed_delivery.azure.config import AzureClients, AzureDelayedDeliveryConfig, http_transport
from delayed_delivery.settings import DelayedDeliverySettings

CONN = (
    "DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey=a2V5;"
    "QueueEndpoint=http://127.0.0.1:1/devstoreaccount1;TableEndpoint=http://127.0.0.1:1/devstoreaccount1;"
    "BlobEndpoint=http://127.0.0.1:1/devstoreaccount1"
)


def _pool_of(clients: AzureClients) -> int:
    session = clients.queues._config.transport.session  # the transport AzureClients.create gave the queue client
    return int(session.get_adapter("https://x").poolmanager.connection_pool_kw["maxsize"])


@pytest.mark.parametrize(("shards", "ahead", "want"), [(1, 0.0, 20), (16, 0.0, 16 * 16 + 4), (4, 3600.0, 4 * 32 + 4)])
def test_the_pool_holds_every_shards_parallel_puts(shards: int, ahead: float, want: int) -> None:
    config = AzureDelayedDeliveryConfig(
        table_name="t" * 3,
        container_name="c" * 3,
        connection_string=CONN,
        shards=shards,
        place_ahead=ahead,
        settings=DelayedDeliverySettings(max_concurrency=16),
    )
    assert _pool_of(AzureClients.create(config)) == want


def test_the_environment_is_merged_once_per_host(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    real = requests.Session.merge_environment_settings

    def counting(self: Any, url: str, *args: Any) -> Any:
        calls.append(url)
        return real(self, url, *args)

    monkeypatch.setattr(requests.Session, "merge_environment_settings", counting)
    session = http_transport(10).session
    for n in range(5):
        merged = session.merge_environment_settings(
            f"https://a.queue.core.windows.net/q/messages?{n}", {}, False, True, None
        )
        merged["proxies"]["x"] = "changed by a caller"  # each caller gets its own copy
    session.merge_environment_settings("https://a.table.core.windows.net/t", {}, False, True, None)
    assert len([u for u in calls if "queue" in u]) == 1, "requests merged the environment once for the host"
    assert len([u for u in calls if "table" in u]) == 1
    assert session.trust_env is False, "requests reads no environment (nor ~/.netrc) per request"
