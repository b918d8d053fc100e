"""Counts the HTTP requests leaving this process through ``requests`` (the Azure SDK's transport) while a block runs."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["counting_requests"]


@contextmanager
def counting_requests(classify: Callable[[Any], Hashable]) -> Iterator[Counter[Hashable]]:
    """Every request sent while the block runs, counted under ``classify(request)`` (its kind, its thread…)."""
    import requests

    counts: Counter[Hashable] = Counter()
    lock = threading.Lock()
    original = requests.Session.send

    def send(self: Any, request: Any, **kwargs: Any) -> Any:
        key = classify(request)
        with lock:
            counts[key] += 1
        return original(self, request, **kwargs)

    requests.Session.send = send  # type: ignore[method-assign]
    try:
        yield counts
    finally:
        requests.Session.send = original  # type: ignore[method-assign]
