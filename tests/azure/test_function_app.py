"""The Function app: defined once, thin entry files, nothing read at import, host.json sensible, 403-tolerant."""

from __future__ import annotations

import ast
import base64
import importlib
import inspect
import json
import logging
import re
import time
from pathlib import Path
from typing import Any

import pytest
from azure.core.exceptions import HttpResponseError
from azure.data.tables import TableServiceClient

import functions.azure.function_app as function_app
from delayed_delivery.azure import function_host
from delayed_delivery.azure.app_files import function_app as published_app
from delayed_delivery.azure.packaging import function_source_dir
from delayed_delivery.azure.storage_queue import StorageQueueTransport
from delayed_delivery.azure.table_store import TableDelayedMessageStore
from tests.azure.conftest import new_name
from tests.azure.harness import fire_timer, functions_of, timer_schedule
from tests.fixtures.azurite import Azurite

#: The published app's files (``function_app.py``, ``host.json``, ``requirements.txt``).
APP_DIR = function_source_dir()
#: ``func start`` runs here.
FUNC_START_DIR = Path(function_app.__file__).parent


def test_import_reads_no_settings_and_builds_no_client(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in ("DELAYED_DELIVERY_ENDPOINT", "DELAYED_DELIVERY_STORAGE_CONNECTION_STRING", "AzureWebJobsStorage"):
        monkeypatch.delenv(key, raising=False)
    function_host.host_from_settings.cache_clear()
    module = importlib.reload(function_app)  # would raise ConfigurationError if settings were read at import
    assert function_host.host_from_settings.cache_info().currsize == 0
    assert list(functions_of(module)) == ["dispatch_delayed_messages"]
    schedule = timer_schedule(module, "dispatch_delayed_messages")
    assert len(schedule.split()) == 6, "NCRONTAB with seconds"


def test_timer_body_is_a_few_lines() -> None:
    body = inspect.getsource(function_host.dispatch_delayed_messages).split('"""')[-1]
    statements = [line.strip() for line in body.splitlines() if line.strip()]
    assert statements == ["host().run()"]


def _statements(path: Path) -> list[str]:
    """The module's top-level statements after its docstring, as source."""
    tree = ast.parse(path.read_text())
    return [ast.unparse(node) for node in tree.body[1:]]


@pytest.mark.parametrize("entry", [FUNC_START_DIR / "function_app.py", APP_DIR / "function_app.py"], ids=str)
def test_each_entry_file_only_builds_the_one_app(entry: Path) -> None:
    assert _statements(entry) == [
        "from __future__ import annotations",
        "from delayed_delivery.azure.function_host import create_app",
        "app = create_app()",
    ], "the app is defined once, in function_host.create_app (no sys.modules swap, no copy)"


def _registry(module: Any) -> dict[str, tuple[Any, list[dict[str, Any]]]]:
    """The app's functions: name -> (the user function, every binding as the host reads it)."""
    return {
        name: (f.get_user_function(), [b.get_dict_repr() for b in f.get_bindings()])
        for name, f in functions_of(module).items()
    }


@pytest.mark.parametrize(
    "settings",
    [{}, {function_host.ENV_EXAMPLE_CONSUMER_QUEUE: "orders", function_host.ENV_PENDING_CENSUS: "true"}],
    ids=["plain", "consumer-and-census"],
)
def test_func_start_and_the_published_app_register_the_same_functions(
    monkeypatch: pytest.MonkeyPatch, settings: dict[str, str]
) -> None:
    for key in (function_host.ENV_EXAMPLE_CONSUMER_QUEUE, function_host.ENV_PENDING_CENSUS):
        monkeypatch.delenv(key, raising=False)
    for key, value in settings.items():
        monkeypatch.setenv(key, value)
    try:
        local, published = importlib.reload(function_app), importlib.reload(published_app)
        assert local is not published and local.app is not published.app
        assert _registry(local) == _registry(published)
        assert len(_registry(local)) == 1 + len(settings)
    finally:
        monkeypatch.undo()
        importlib.reload(function_app)
        importlib.reload(published_app)


def test_func_start_uses_the_published_host_json() -> None:
    assert (FUNC_START_DIR / "host.json").read_bytes() == (APP_DIR / "host.json").read_bytes()


def test_host_json_is_sensible() -> None:
    host = json.loads((APP_DIR / "host.json").read_text())
    assert host["version"] == "2.0"
    levels = host["logging"]["logLevel"]
    assert levels["default"] == "Warning" and levels["delayed_delivery"] == "Information"
    h, m, s = (int(x) for x in host["functionTimeout"].split(":"))
    assert h * 3600 + m * 60 + s > 60, "a run (≤ 58 s) fits the timeout"
    assert "Request" in host["logging"]["applicationInsights"]["samplingSettings"]["excludedTypes"]
    # the example consumer's queue trigger reads the envelope as it is (JSON text), not as base64
    assert host["extensions"]["queues"]["messageEncoding"] == "none"
    requirements = (APP_DIR / "requirements.txt").read_text()
    for package in (
        "azure-functions",
        "azure-data-tables",
        "azure-storage-blob",
        "azure-storage-queue",
        "azure-identity",
    ):
        assert re.search(rf"^{package}[<>=]", requirements, re.MULTILINE)


class _Forbidden:
    """A client whose create calls answer 403, as with a least-privilege identity."""

    table_name = "delays"

    def _deny(self, *args: Any, **kwargs: Any) -> None:
        exc = HttpResponseError(message="AuthorizationPermissionMismatch")
        exc.status_code = 403
        raise exc

    create_table = create_queue = _deny


def test_setup_tolerates_a_least_privilege_identity() -> None:
    TableDelayedMessageStore(_Forbidden()).setup_infrastructure()  # type: ignore[arg-type]

    class Service:
        def get_queue_client(self, name: str) -> _Forbidden:
            return _Forbidden()

    StorageQueueTransport(Service()).create_queue("error")  # type: ignore[arg-type]


def test_a_prepared_host_replaces_the_one_from_app_settings() -> None:
    class Prepared:
        runs = 0

        def run(self) -> None:
            Prepared.runs += 1

    prepared = Prepared()
    function_host.use_host(prepared)
    try:
        assert function_host.host() is prepared
        fire_timer(function_app, "dispatch_delayed_messages")
        fire_timer(published_app, "dispatch_delayed_messages")
        assert Prepared.runs == 2, "both entry files' timers run the prepared host"
    finally:
        function_host.use_host(None)


def test_the_example_consumer_is_registered_only_when_its_queue_is_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(function_host.ENV_EXAMPLE_CONSUMER_QUEUE, raising=False)
    assert list(functions_of(importlib.reload(function_app))) == ["dispatch_delayed_messages"]
    monkeypatch.setenv(function_host.ENV_EXAMPLE_CONSUMER_QUEUE, "orders")
    function_host.host_from_settings.cache_clear()
    try:
        module = importlib.reload(function_app)
        found = functions_of(module)
        assert sorted(found) == ["consume_example_message", "dispatch_delayed_messages"]
        (binding,) = found["consume_example_message"].get_bindings()
        assert binding.type == "queueTrigger"
        assert binding.queue_name == f"%{function_host.ENV_EXAMPLE_CONSUMER_QUEUE}%", "the queue is the app setting's"
        assert binding.connection == function_host.EXAMPLE_CONSUMER_CONNECTION == "DelayedDeliveryQueues"
        assert function_host.host_from_settings.cache_info().currsize == 0, "still nothing built at import"
    finally:
        monkeypatch.delenv(function_host.ENV_EXAMPLE_CONSUMER_QUEUE)
        importlib.reload(function_app)


def test_the_example_consumer_logs_each_message_with_its_lateness(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.delenv("APPLICATIONINSIGHTS_CONNECTION_STRING", raising=False)
    message = _envelope_message("order-17")
    with caplog.at_level(logging.INFO, logger="delayed_delivery"):
        function_host.consume_example_message(message)
    [line] = [r for r in caplog.records if getattr(r, "event", None) == "consumed"]
    assert line.message_id == "order-17"  # type: ignore[attr-defined]
    assert 1.5 <= line.consumer_lateness_s < 30  # type: ignore[attr-defined]


def test_the_copy_this_consumer_is_one_queue_trigger() -> None:
    consumer_app = importlib.import_module("functions.azure.consumer_app")
    found = functions_of(consumer_app)
    assert list(found) == ["consume_orders"]
    (binding,) = found["consume_orders"].get_bindings()
    assert (binding.type, binding.queue_name, binding.connection) == (
        "queueTrigger",
        "%ORDERS_QUEUE%",
        "DelayedDeliveryQueues",
    )
    source = Path(consumer_app.__file__).read_text()
    assert len(source.splitlines()) <= 50, "a consumer to copy stays short"


def _envelope_message(message_id: str) -> Any:
    """A queue-trigger message holding the envelope the table route writes, due 2 s ago."""
    import azure.functions as func

    due = int(time.time() * 1000) - 2_000
    delivery = f"v1;id={message_id};due={due};sent={due - 60_000};hops=0;route=table"
    envelope = {
        "v": 1,
        "id": message_id,
        "headers": {"DelayedDelivery.Delivery": delivery},
        "body": base64.b64encode(b"hello").decode(),
    }
    return func.QueueMessage(id="q-1", body=json.dumps(envelope).encode())


def test_the_copy_this_consumer_processes_each_id_once_with_its_table(
    azurite: Azurite, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    consumer_app = importlib.import_module("functions.azure.consumer_app")
    table = new_name("processed")
    monkeypatch.setenv("IDEMPOTENCY_CONNECTION", azurite.connection_string)
    monkeypatch.setenv("IDEMPOTENCY_TABLE", table)
    consumer_app._processor.cache_clear()
    consume = functions_of(consumer_app)["consume_orders"].get_user_function()
    try:
        with caplog.at_level(logging.INFO, logger="delayed_delivery"):
            for _ in range(3):  # the same message delivered three times (at-least-once)
                consume(_envelope_message("order-17"))
            consume(_envelope_message("order-18"))
    finally:
        consumer_app._processor.cache_clear()
        TableServiceClient.from_connection_string(azurite.connection_string).delete_table(table)
    events = [(getattr(r, "event", None), getattr(r, "message_id", None)) for r in caplog.records]
    assert events.count(("consumed", "order-17")) == 3
    assert [e for e in events if e[0] == "processed"] == [("processed", "order-17"), ("processed", "order-18")]
