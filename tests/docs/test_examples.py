"""The code examples in the README and docs run as written, against moto server and Azurite."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_BLOCK = re.compile(r"<!-- runnable -->\s*\n```python\n(.*?)\n```", re.DOTALL)


def runnable_blocks() -> list[tuple[str, str]]:
    """Every ``<!-- runnable -->`` python block of README.md and docs/*.md, as (place, code)."""
    found: list[tuple[str, str]] = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = path.read_text(encoding="utf-8")
        for match in _BLOCK.finditer(text):
            line = text[: match.start()].count("\n") + 1
            found.append((f"{path.relative_to(ROOT)}:{line}", match.group(1)))
    return found


def _run(code: str, place: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, place, "exec"), {"__name__": "__doc_example__"})
    return out.getvalue()


def test_the_readme_has_runnable_examples() -> None:
    places = [place for place, _ in runnable_blocks()]
    assert sum(p.startswith("README.md") for p in places) >= 3, places


@pytest.mark.moto
@pytest.mark.azurite
def test_every_runnable_example_runs(
    moto_endpoint: str, azurite_conn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import os

    import boto3

    from delayed_delivery.aws import ensure_endpoint
    from delayed_delivery.azure.config import AzureDelayedDeliveryConfig
    from delayed_delivery.azure.runner import AzureDispatcherHost

    monkeypatch.chdir(tmp_path)
    for name in [n for n in os.environ if n.startswith("DELAYED_DELIVERY_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_endpoint)
    monkeypatch.setenv("DELAYED_DELIVERY_STORAGE_CONNECTION_STRING", azurite_conn)
    sqs = boto3.client("sqs", endpoint_url=moto_endpoint)
    ensure_endpoint(sqs, "orders")
    AzureDispatcherHost(
        AzureDelayedDeliveryConfig.for_endpoint("orders", connection_string=azurite_conn)
    ).setup_infrastructure()

    printed = {place: _run(code, place) for place, code in runnable_blocks()}

    assert all(out.strip() for out in printed.values()), printed
    fifo = sqs.get_queue_url(QueueName="orders-delay.fifo")["QueueUrl"]
    attrs = sqs.get_queue_attributes(QueueUrl=fifo, AttributeNames=["All"])["Attributes"]
    waiting = int(attrs["ApproximateNumberOfMessages"]) + int(attrs["ApproximateNumberOfMessagesDelayed"])
    assert waiting == 1, "the AWS example's 40-day message waits on orders-delay.fifo"
    assert any(out.strip().startswith("1 ['orders']") for out in printed.values()), printed
