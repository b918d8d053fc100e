"""Run concurrent callers of one client with their requests interleaved in an order a seed decides.

Each caller runs in its own thread, but only one request is in flight at a time, and which waiting caller goes next
is drawn from ``random.Random(seed)`` once every live caller is waiting for its turn or done. So every interleaving
of whole requests is reachable, a seed always gives the same one (whatever the machine's load), and no two requests
ever overlap at the emulator: a request is as atomic as the service documents it, even where an emulator applies it
without a lock (moto server's DynamoDB ``UpdateItem``, docs/testing.md).
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["Interleaved", "run_interleaved"]

#: Longest wait for a caller to reach its next request or finish (a deadline against a hang, not a timing claim).
STEP_DEADLINE_S = 120.0


class _Turns:
    """Whose turn it is: callers wait in ``request``; ``schedule`` lets one of them go at a time."""

    def __init__(self, callers: int, seed: int) -> None:
        self.rng = random.Random(seed)
        self.cond = threading.Condition()
        self.live = set(range(callers))
        self.waiting: set[int] = set()
        self.turn: int | None = None
        self.local = threading.local()
        self.order: list[int] = []

    def request(self, call: Callable[[], Any]) -> Any:
        """Wait for this caller's turn, make the request, hand the turn back."""
        me: int = self.local.index
        with self.cond:
            self.waiting.add(me)
            self.cond.notify_all()
            if not self.cond.wait_for(lambda: self.turn == me, STEP_DEADLINE_S):
                raise TimeoutError(f"caller {me} never got its turn")
        try:
            return call()
        finally:
            with self.cond:
                self.waiting.discard(me)
                self.turn = None
                self.cond.notify_all()

    def done(self, index: int) -> None:
        """Caller ``index`` has finished (or raised)."""
        with self.cond:
            self.live.discard(index)
            self.cond.notify_all()

    def schedule(self) -> None:
        """Give turns until every caller is done, each to a caller drawn from the seeded generator."""
        while True:
            with self.cond:
                settled = self.cond.wait_for(lambda: self.turn is None and self.waiting == self.live, STEP_DEADLINE_S)
                if not settled:
                    raise TimeoutError(f"callers {sorted(self.live - self.waiting)} neither asked nor finished")
                if not self.live:
                    return
                self.turn = self.rng.choice(sorted(self.waiting))
                self.order.append(self.turn)
                self.cond.notify_all()


class Interleaved:
    """A client proxy: each method call is one request made in its caller's turn."""

    def __init__(self, client: Any, turns: _Turns) -> None:
        self._client = client
        self._turns = turns

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._client, name)
        if not callable(method):
            return method

        def call(*args: Any, **kwargs: Any) -> Any:
            return self._turns.request(lambda: method(*args, **kwargs))

        return call


def run_interleaved(client: Any, callers: Sequence[Callable[[Any], None]], seed: int) -> list[int]:
    """Run each caller with its own proxy of ``client``, requests interleaved by ``seed``; returns the order of turns
    (caller indexes). Raises the first caller's exception, if any."""
    turns = _Turns(len(callers), seed)
    errors: list[BaseException] = []

    def run(index: int, caller: Callable[[Any], None]) -> None:
        turns.local.index = index
        try:
            caller(Interleaved(client, turns))
        except BaseException as exc:  # reported to the test below, not lost in the thread
            errors.append(exc)
        finally:
            turns.done(index)

    threads = [threading.Thread(target=run, args=(i, c), daemon=True) for i, c in enumerate(callers)]
    for t in threads:
        t.start()
    try:
        turns.schedule()
    finally:
        for t in threads:
            t.join(STEP_DEADLINE_S)
    if errors:
        raise errors[0]
    return turns.order
