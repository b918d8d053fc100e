"""The pattern of every Lambda entry point in ``functions/aws``: build the handler on the first call, then reuse it.

Importing an entry point reads no environment and creates no client; the first invocation of a function instance
reads ``os.environ`` and builds the in-package handler (clients, Powertools), later ones reuse it.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["BuiltOnFirstCall", "invocation_deadline"]


def invocation_deadline(context: Any) -> float | None:
    """The end of this invocation as a ``time.monotonic`` value, from the Lambda context (``None`` without one)."""
    remaining = getattr(context, "get_remaining_time_in_millis", None)
    try:
        return time.monotonic() + float(remaining()) / 1000 if callable(remaining) else None
    except (TypeError, ValueError):
        return None


class BuiltOnFirstCall:
    """A Lambda handler that builds the real one from the environment on its first call and reuses it after."""

    def __init__(self, build: Callable[[Mapping[str, str]], Callable[[Any, Any], dict[str, Any]]]) -> None:
        self._build = build
        self._built: Callable[[Any, Any], dict[str, Any]] | None = None
        self._lock = threading.Lock()

    def __call__(self, event: Any, context: Any) -> dict[str, Any]:
        """Handle one invocation (building the handler first, on the first one)."""
        built = self._built
        if built is None:
            with self._lock:  # local event sources may invoke from several threads at once
                if self._built is None:
                    self._built = self._build(os.environ)
                built = self._built
        return built(event, context)

    @property
    def built(self) -> bool:
        """Whether the handler has been built (by a first call)."""
        return self._built is not None

    def reset(self) -> None:
        """Forget the built handler, so the next call reads the environment again (tests change it between runs)."""
        with self._lock:
            self._built = None
