"""An operator's cancel never answers "cancelled" for a message a dispatcher's put may have left on its queue.

The real ``AzureDispatcherHost`` on Azurite, in two interleavings:

* a put slower than its claim: the queue endpoint is behind a proxy that lets Put Message through (the message is
  on the queue) but holds its answer, as a hanging queue does. Its claim expires, an operator cancels, then the answer
  comes. Every put must end (here: time out) within its send bound, before its claim runs out, and the cancel must
  not say "cancelled".
* a dispatcher killed between its put and the row's delete: its claim expires, an operator cancels; another host
  then sends the message again (the one duplicate a crash may cause) and removes the row.

Waits are polls with deadlines, never fixed sleeps; what is asserted does not depend on the machine's speed.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest
from azure.storage.queue import QueueServiceClient

from delayed_delivery.azure.config import AzureDelayedDeliveryConfig
from delayed_delivery.azure.runner import AzureDispatcherHost, RunSummary
from delayed_delivery.azure.table_store import TableDelayedMessageStore
from delayed_delivery.errors import MessageInFlightError, MessagePlacedError
from delayed_delivery.model import DelayedMessage
from delayed_delivery.naming import azure_delays_table_name
from delayed_delivery.ports import claim_of, claimed_until
from delayed_delivery.settings import DelayedDeliverySettings
from tests.app.cli.conftest import run
from tests.azure.conftest import new_name
from tests.azure.harness import drain
from tests.fixtures.azurite import Azurite
from tests.fixtures.outage import TcpProxy

pytestmark = pytest.mark.azurite

#: Longest any wait here may take before the test fails (seconds; generous for a loaded machine).
PATIENCE = 120.0


class HeldAnswers(TcpProxy):
    """Azurite's queue endpoint, where Put Message is made at once but its answer waits until ``release()``."""

    def __init__(self, target: int) -> None:
        super().__init__(target)
        self.released = threading.Event()
        self._puts: set[socket.socket] = set()  # upstream sockets whose last request was a Put Message

    def release(self) -> None:
        self.released.set()

    def _forward(self, src: socket.socket, dst: socket.socket, data: bytes) -> None:
        if src.getpeername()[1] == self.target:  # an answer
            if src in self._puts:
                self.released.wait(PATIENCE)
        elif data.startswith(b"POST ") and b"/messages" in data.split(b"\r\n", 1)[0]:
            self._puts.add(dst)
        super()._forward(src, dst, data)


def _host(conn: str, table: str, claim: float, send: tuple[float, float, float]) -> AzureDispatcherHost:
    """A one-shard host; a failed send is retried only after 10 minutes (not within these tests)."""
    connect, read, whole = send
    settings = DelayedDeliverySettings(
        max_concurrency=1, error_queue=new_name("e"), retry_backoff=600, max_retry_backoff=600
    )
    config = AzureDelayedDeliveryConfig(
        table_name=table,
        container_name=table,
        connection_string=conn,
        lease_seconds=15,
        run_seconds=5.0,
        claim_timeout=claim,
        settings=settings,
        queue_connect_timeout=connect,
        queue_read_timeout=read,
        send_timeout=whole,
    )
    host = AzureDispatcherHost(config, heartbeat=False)
    host.setup_infrastructure()
    return host


def _watch_puts(host: AzureDispatcherHost, after_put: Callable[[], None] = lambda: None) -> list[dict[str, Any]]:
    """Record each put the host makes: its message's claim end, and whether it had ended (``ended``)."""
    puts: list[dict[str, Any]] = []
    place = host.transport.place

    def watched(message: DelayedMessage, visibility_timeout: int, **kw: Any) -> tuple[str, str]:
        entry: dict[str, Any] = {"id": message.message_id, "until": claimed_until(message), "ended": False}
        puts.append(entry)
        try:
            placed = place(message, visibility_timeout, **kw)
        finally:
            entry["ended"] = True
        after_put()
        return placed

    host.transport.place = watched  # type: ignore[method-assign]
    return puts


def _poll(what: str, done: Callable[[], bool]) -> None:
    deadline = time.monotonic() + PATIENCE
    while not done():
        assert time.monotonic() < deadline, f"gave up waiting: {what}"
        time.sleep(0.05)


def _cancel(operator: TableDelayedMessageStore, message_id: str) -> str:
    """What an operator's cancel answers: cancelled, not pending, in flight, or the refusal."""
    try:
        return "cancelled" if operator.remove(message_id) else "not pending"
    except MessagePlacedError as exc:
        return f"refused: {exc}"
    except MessageInFlightError:
        return "in flight"


_Outcome = RunSummary | BaseException


def _run_in_thread(host: AzureDispatcherHost, budget: float) -> tuple[threading.Thread, list[_Outcome]]:
    out: list[_Outcome] = []

    def run() -> None:
        try:
            out.append(host.run(budget))
        except BaseException as exc:  # handed to the test
            out.append(exc)

    thread = threading.Thread(target=run, name="host", daemon=True)
    thread.start()
    return thread, out


def test_a_put_slower_than_its_claim_ends_within_it_and_a_cancel_after_the_claim_is_never_true(
    azurite: Azurite, queues: QueueServiceClient, queue: str
) -> None:
    table = new_name()
    proxy = HeldAnswers(azurite.queue_port).start()
    try:
        proxied = azurite.connection_string.replace(f":{azurite.queue_port}/", f":{proxy.port}/")
        host = _host(proxied, table, claim=8.0, send=(1.0, 2.0, 3.0))
        operator = TableDelayedMessageStore.from_connection_string(azurite.connection_string, table)
        puts = _watch_puts(host)
        operator.store(DelayedMessage("m-slow", queue, b"x", datetime.now(UTC)))
        thread, out = _run_in_thread(host, 5.0)
        _poll("the host starts its put", lambda: bool(puts))
        until = puts[0]["until"]
        assert until is not None
        _poll("the put's claim runs out", lambda: datetime.now(UTC) > until)
        answer = _cancel(operator, "m-slow")  # the operator's cancel after the claim ran out
        ended_before_release = all(p["ended"] for p in puts)
        proxy.release()
        thread.join(PATIENCE)
        assert not thread.is_alive() and isinstance(out[0], RunSummary), out
    finally:
        proxy.close()
    arrived = [e.message_id for e in drain(queues, queue)]
    assert arrived == ["m-slow"], "the held put was made: the message is on its queue"
    assert answer != "cancelled", f"answered cancelled, then delivered: {arrived}"
    assert answer.startswith("refused: ") and "may already be on its way" in answer, answer
    assert ended_before_release, "a put hung past its claim (the client's timeouts did not bound it)"


class _Killed(BaseException):
    """The dispatcher's process dies here (nothing after it runs)."""


def test_a_dispatcher_killed_between_its_put_and_its_delete_never_gets_a_true_cancel(
    azurite: Azurite, queues: QueueServiceClient, queue: str
) -> None:
    endpoint = new_name("ep")
    table = azure_delays_table_name(endpoint)
    bound = (0.5, 1.0, 1.5)
    doomed = _host(azurite.connection_string, table, claim=4.0, send=bound)
    operator = TableDelayedMessageStore.from_connection_string(azurite.connection_string, table)

    def die() -> None:
        raise _Killed

    puts = _watch_puts(doomed, after_put=die)
    operator.store(DelayedMessage("m-dead", queue, b"y", datetime.now(UTC)))
    with pytest.raises(_Killed):
        doomed.run(5.0)
    until = puts[0]["until"]
    assert until is not None
    _poll("the dead dispatcher's claim runs out", lambda: datetime.now(UTC) > until)
    answers = [_cancel(operator, "m-dead")]
    arrived = [e.message_id for e in drain(queues, queue)]
    assert arrived == ["m-dead"], "the killed dispatcher's put was made"
    assert answers[0] != "cancelled", f"answered cancelled, then delivered: {arrived}"
    assert answers[0].startswith("refused: ") and "may already be on its way" in answers[0], answers
    where = ["--cloud", "azure", "--connection-string", azurite.connection_string, "--endpoint", endpoint]
    for command in (["cancel", "m-dead"], ["reschedule", "m-dead", "--delay", "1h"]):
        said = run(*command, *where)
        assert said.exit_code == 1 and "may already be on its way" in said.stderr, (command, said.output)
        assert "Traceback" not in said.output and len(said.stderr.strip().splitlines()) == 1, said.stderr
    survivor = _host(azurite.connection_string, table, claim=4.0, send=bound)
    assert survivor.run(3.0).dispatched == 1, "the next host sends it again (the one duplicate a crash may cause)"
    assert _cancel(operator, "m-dead") == "not pending", "and removes its row"
    assert [e.message_id for e in drain(queues, queue)] == ["m-dead"]


def test_a_refused_send_clears_its_claims_mark_and_a_send_of_unknown_outcome_keeps_it(
    azurite: Azurite, queue: str
) -> None:
    table = new_name()
    store = TableDelayedMessageStore.from_connection_string(azurite.connection_string, table, claim_timeout=30)
    store.setup_infrastructure()
    now = datetime.now(UTC)
    store.store_many([DelayedMessage(f"m-{n}", queue, b"z", now) for n in ("timeout", "refused")])
    fetched = {m.message_id: claim_of(m) or "" for m in store.fetch_due(now, 10)}
    assert store.increment_failure_count("m-timeout", fetched["m-timeout"])  # a timeout: it may have been put
    assert store.count_unsent_failure("m-refused", fetched["m-refused"])  # 403 or 503: nothing was put
    assert _cancel(store, "m-timeout").startswith("refused: ")
    assert _cancel(store, "m-refused") == "cancelled"
