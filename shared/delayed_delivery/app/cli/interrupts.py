"""SIGTERM handled as Ctrl-C for a command that must clean up what it made (``aws verify``, ``azure verify``)."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType

__all__ = ["sigterm_as_ctrl_c"]


def _interrupt(_signum: int, _frame: FrameType | None) -> None:
    raise KeyboardInterrupt


@contextlib.contextmanager
def sigterm_as_ctrl_c() -> Iterator[None]:
    """Inside the block SIGTERM raises ``KeyboardInterrupt``, so ``finally`` clean-ups run; restored after."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
