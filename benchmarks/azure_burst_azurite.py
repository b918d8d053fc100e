"""A burst on Azurite: N rows of 1 KiB due at one instant over 4 queues, placed ahead or sent at the due second.

The real ``AzureDispatcherHost`` (one process, default settings but the lead) runs one timer run that spans the due
time; a consumer thread drains the queues. When a message became visible is read from its delivery header: the
put's time plus its visibility timeout (rounded up), or, for the dispatcher's sends (no send time in the header), when
the consumer saw it: an upper bound that includes the consumer's lag on a busy machine.

* placed ahead: the rows are due ``N / 20 + 30`` seconds after they are stored (time for the placer at Azurite's
  speed on a busy machine), with ``DELAYED_DELIVERY_PLACE_AHEAD`` covering it;
* at the due second (lead 0, as before #34): the rows are due when the run starts.

Per case: due → last visible (s), p50 / p99 of visible − due, lost (never seen), duplicates (seen twice), early
(visible before due: must be 0), this process's peak RSS; beside them the raw Put Message rate measured in the same run
(16 threads, the SDK straight), i.e. the ceiling the due-second path is bound by.

Run: ``python -m benchmarks.azure_burst_azurite [--messages 2000]``. Starts its own Azurite unless
``AZURITE_CONNECTION_STRING`` is set. Prints a table and writes ``benchmarks/results/azure_burst_azurite.json``.
"""

from __future__ import annotations

import argparse
import math
import resource
import statistics
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from typing import Any

from azure.storage.queue import QueueServiceClient

from benchmarks.azure_dispatch import _name, azurite
from benchmarks.common import Row, print_table, write_json
from delayed_delivery.azure.config import AzureDelayedDeliveryConfig
from delayed_delivery.azure.runner import AzureDispatcherHost
from delayed_delivery.azure.storage_queue import decode_envelope, encode_envelope
from delayed_delivery.delivery import DELIVERY_HEADER, decode_delivery
from delayed_delivery.model import DelayedMessage
from delayed_delivery.settings import DelayedDeliverySettings

NAME = "azure_burst_azurite"
BODY = b"x" * 1024
QUEUES = 4


def _raw_rate(service: QueueServiceClient, n: int) -> float:
    queue = _name("raw")
    service.create_queue(queue)
    client = service.get_queue_client(queue)
    text = encode_envelope(DelayedMessage("raw", queue, BODY, datetime.now(UTC)))
    start = time.perf_counter()
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda _: client.send_message(text), range(n)))
    return n / (time.perf_counter() - start)


def visible_at(due: float, sent: float, now: Callable[[], float] = time.time) -> float:
    """When a message became visible: its put plus the visibility timeout (whole seconds), or (no send time: the
    dispatcher's sends) ``now()``, when the consumer saw it, an upper bound."""
    if not sent:
        return now()
    return sent + math.ceil(due - sent) if sent < due else sent


def drain_queues(
    service: QueueServiceClient,
    names: list[str],
    seen: list[tuple[str, float]],
    stop: threading.Event,
    now: Callable[[], float] = time.time,
) -> None:
    """Drain the queues until ``stop``: each message's id and when it became visible (``visible_at``)."""
    clients = [service.get_queue_client(n) for n in names]
    while not stop.is_set():
        got = 0
        for client in clients:
            for m in client.receive_messages(messages_per_page=32, max_messages=32, visibility_timeout=600):
                envelope = decode_envelope(m.content)
                info = decode_delivery(envelope.headers.get(DELIVERY_HEADER))
                due, sent = (info.due_ms or 0) / 1000, (info.sent_ms or 0) / 1000
                seen.append((envelope.message_id, visible_at(due, sent, now)))
                client.delete_message(m)
                got += 1
        if not got:
            stop.wait(0.2)


def burst(conn: str, messages: int, lead: float) -> dict[str, Any]:
    """One burst; the figures of the module docstring."""
    service = QueueServiceClient.from_connection_string(conn)
    names = [_name("q") for _ in range(QUEUES)]
    for n in names:
        service.create_queue(n)
    table = _name("burst")
    ahead = messages / 20 + 30 if lead else 0.0
    config = AzureDelayedDeliveryConfig(
        table_name=table,
        container_name=table,
        connection_string=conn,
        run_seconds=ahead + messages / 20 + 60,
        place_ahead=max(lead, ahead + 60) if lead else 0.0,
        settings=DelayedDeliverySettings(max_concurrency=16),
    )
    host = AzureDispatcherHost(config, heartbeat=False)
    host.setup_infrastructure()
    due = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=ahead)
    rows = [DelayedMessage(f"m-{i}", names[i % QUEUES], BODY, due) for i in range(messages)]
    for start in range(0, messages, 500):
        host.store.store_many(rows[start : start + 500])
    seen: list[tuple[str, float]] = []
    stop = threading.Event()
    consumer = threading.Thread(target=drain_queues, args=(service, names, seen, stop), daemon=True)
    consumer.start()
    runner = threading.Thread(target=host.run)
    runner.start()
    deadline = time.monotonic() + ahead + 900
    while len({m for m, _ in seen}) < messages and time.monotonic() < deadline:
        time.sleep(0.5)
    time.sleep(5)  # late duplicates, if any
    stop.set()
    consumer.join()
    runner.join()
    first: dict[str, float] = {}
    for mid, at in seen:
        first.setdefault(mid, at)
    counts = Counter(mid for mid, _ in seen)
    late = sorted(at - due.timestamp() for at in first.values())
    return {
        "lead": "placed ahead" if lead else "at the due second",
        "messages": messages,
        "last_visible_s": late[-1] if late else float("inf"),
        "p50_s": statistics.median(late) if late else float("inf"),
        "p99_s": late[int(0.99 * (len(late) - 1))] if late else float("inf"),
        "lost": messages - len(first),
        "duplicates": sum(n - 1 for n in counts.values()),
        "early": sum(1 for x in late if x < 0),
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "raw_puts_per_s": _raw_rate(service, min(messages, 1000)),
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=2000)
    args = parser.parse_args(argv)
    results = []
    with azurite() as conn:
        for lead in (3600.0, 0.0):
            results.append(burst(conn, args.messages, lead))
    rows = [
        Row(NAME, f"{r['lead']}: {key}", unit, (float(r[key]),), notes=f"{r['messages']} due at once, 4 queues")
        for r in results
        for key, unit in (
            ("last_visible_s", "s"),
            ("p99_s", "s"),
            ("lost", "msgs"),
            ("duplicates", "msgs"),
            ("early", "msgs"),
            ("peak_rss_mib", "MiB"),
            ("raw_puts_per_s", "msg/s"),
        )
    ]
    print_table(rows, "A burst on Azurite")
    write_json(NAME, rows, extra={"results": results})
    return {"results": results}


if __name__ == "__main__":
    main()
