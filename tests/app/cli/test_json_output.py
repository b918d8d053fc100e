"""Every command with ``--json`` (and every command that always prints JSON) writes exactly one JSON document on
stdout: nothing before it, nothing after it; progress and warnings go to stderr. (``local up --json``: in
test_local_up.py.)"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.app.cli.conftest import run


def one_document(text: str) -> Any:
    """The single JSON document ``text`` holds, or fail: ``json.loads`` of the whole of it (surrounding space only)."""
    assert text.strip(), "nothing on stdout"
    decoder = json.JSONDecoder()
    document, end = decoder.raw_decode(text.lstrip())
    assert not text.lstrip()[end:].strip(), f"more than one document on stdout: {text!r}"
    return document


def _json(*args: str) -> Any:
    result = run(*args)
    assert result.exit_code == 0, result.output
    return one_document(result.stdout)


def test_the_commands_without_a_cloud(tmp_path: Path) -> None:
    store = ["--store", f"sqlite:///{tmp_path / 'd.db'}"]
    assert _json("cost", "--delay", "40d", "--json")["messages"] == 1_000_000
    demo = run("demo", "--core", "--quick", "--messages", "20", "--json")
    assert demo.exit_code in (0, 1), demo.output  # 1: the demo's own verdict, printed in the document all the same
    assert one_document(demo.stdout)["sent"] >= 20
    assert _json("send", *store, "--to", "q", "--delay", "1h", "--body", "b", "--id", "i", "--json")["route"] == "store"
    assert _json("pending", *store, "--json")["pending"] == 1
    assert _json("reschedule", "i", *store, "--delay", "2h", "--json")["message_id"] == "i"
    assert _json("cancel", "i", *store, "--json")["cancelled"] is True


@pytest.mark.moto
def test_the_aws_commands(moto_endpoint: str) -> None:
    where = ["--endpoint-url", moto_endpoint, "--region", "us-east-1"]
    aws = ["--cloud", "aws", *where]
    assert _json("aws", "create", "--queue", "orders", *where, "--buckets")["delay"].endswith("orders-delay.fifo")
    # auto sends 40 d through the tier
    assert _json("aws", "send", "--queue", "orders", "--delay", "40d", "--body", "b", *where)["route"] == "buckets"
    assert (
        _json("send", *aws, "--to", "orders", "--delay", "40d", "--body", "b", "--id", "a1", "--json")["cloud"] == "aws"
    )
    assert _json("pending", *aws, "--json")["pending"] is None
    assert _json("cancel", "a1", *aws, "--to", "orders", "--json")["requested"] == "cancel"
    assert _json("reschedule", "a1", *aws, "--to", "orders", "--delay", "2d", "--json")["requested"] == "reschedule"
    requeue = run("aws", "requeue", "--queue", "orders", *where, "--for", "1", "--json")
    assert requeue.exit_code == 0 and "requeue on orders-delay.fifo" in requeue.stderr, requeue.output
    assert "invocations" in one_document(requeue.stdout)
    tier = run("aws", "tier", *where, "--every", "0.5", "--for", "1", "--json")
    assert tier.exit_code == 0 and " s  run 1: " in tier.stderr, tier.output
    assert one_document(tier.stdout)["timer_runs"] >= 1


@pytest.mark.azurite
def test_the_azure_commands(azurite_conn: str, unique_name: str) -> None:
    connection = ["--connection-string", azurite_conn, "--endpoint", unique_name]
    assert run("azure", "setup", *connection, "--queue", "orders").exit_code == 0
    assert _json("azure", "names", "--endpoint", unique_name)["table"].startswith("delays")
    assert _json("azure", "send", "--queue", "orders", "--delay", "40d", "--body", "b", *connection)["route"] == "table"
    assert _json("azure", "dispatch", "--seconds", "0.5", *connection)["dispatched"] == 0
    azure = ["--cloud", "azure", *connection]
    assert (
        _json("send", *azure, "--to", "orders", "--delay", "40d", "--body", "b", "--id", "z", "--json")["cloud"]
        == "azure"
    )
    assert _json("pending", *azure, "--json")["pending"] == 2
    assert _json("reschedule", "z", *azure, "--delay", "41d", "--json")["route"] == "azure"
    assert _json("cancel", "z", *azure, "--json")["cancelled"] is True


@pytest.mark.spark
def test_the_spark_commands(spark: Any, tmp_path: Path) -> None:
    from delayed_delivery.pipelines.schema import LegacyShape
    from delayed_delivery.pipelines.synthetic import write_legacy_export, write_logs

    write_legacy_export(tmp_path / "export", LegacyShape.TIMEOUT_MANAGER, 30)
    write_logs(tmp_path / "logs" / "a.jsonl", 30)
    source, output = str(tmp_path / "export"), str(tmp_path / "migration")
    assert _json("migrate", "preview", "--source", source, "--output", output, "--json")["total_rows"] == 30
    target = f"sqlite:{tmp_path / 'd.db'}"
    assert _json("migrate", "run", "--source", source, "--target", target, "--output", output, "--json")["run_id"]
    report = _json("report", "--logs", str(tmp_path / "logs"), "--output", str(tmp_path / "report"), "--json")
    assert report["messages"] == 30
