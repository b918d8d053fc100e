"""Writes grouped into entity-group transactions within Azure's limits: 100 operations and 4 MiB, one partition."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

__all__ = ["MAX_GROUP_BYTES", "MAX_GROUP_OPS", "chunks", "entity_size"]

#: At most this many operations in one transaction (Azure's limit: 100, all in one partition).
MAX_GROUP_OPS = 100
#: At most this many bytes (a bound, ``entity_size``) in one transaction (Azure's limit: 4 MiB a request).
MAX_GROUP_BYTES = 3 * 1024 * 1024

_T = TypeVar("_T")


def chunks(items: Sequence[_T], cost: Callable[[_T], tuple[int, int]]) -> Iterator[list[_T]]:
    """``items`` in order, in runs of at most ``MAX_GROUP_OPS`` operations and ``MAX_GROUP_BYTES`` bytes by
    ``cost(item) = (operations, bytes)``; an item over either alone is a run of its own."""
    run: list[_T] = []
    ops = size = 0
    for item in items:
        k, b = cost(item)
        if run and (ops + k > MAX_GROUP_OPS or size + b > MAX_GROUP_BYTES):
            yield run
            run, ops, size = [], 0, 0
        run.append(item)
        ops, size = ops + k, size + b
    if run:
        yield run


def entity_size(entity: dict[str, Any]) -> int:
    """A bound on the entity's bytes in a request: every character escaped (6 bytes), bytes in base64, plus the
    operation's headers."""
    total = 512
    for key, value in entity.items():
        total += 2 * len(key) + 64
        if isinstance(value, str):
            total += 6 * len(value)
        elif isinstance(value, bytes):
            total += 2 * len(value)
    return total
