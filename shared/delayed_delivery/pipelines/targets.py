"""Migration targets behind one small protocol, chosen by a target URL.

A target is built on each executor from a picklable ``TargetSpec`` and receives batches of
``DelayedMessage`` values whose ids are the legacy ids, so writing the same batch again replaces
rather than duplicates. URL forms:

``sqlite:PATH[?table=NAME]``
    The embedded SQLite store (``SqliteDelayedMessageStore``), one transaction per batch. A message
    already due is stored with its past due time; the dispatcher's next fetch (``due_at <= now``)
    delivers it at once. Undo: removes the ids a run wrote (those already delivered are gone).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable
from urllib.parse import parse_qsl

from ..errors import ConfigurationError
from ..model import DelayedMessage
from ..sqlite_store import SqliteDelayedMessageStore

__all__ = ["TARGET_FACTORIES", "MigrationTarget", "SqliteTarget", "TargetSpec"]


@runtime_checkable
class MigrationTarget(Protocol):
    """Where migrated messages are written."""

    #: Whether ``undo`` can take back what was written.
    can_undo: bool

    def prepare(self) -> None:
        """Create tables or queues if missing; safe to call from every executor."""
        ...

    def write(self, messages: Sequence[DelayedMessage]) -> None:
        """Write one batch; writing the same ids again overwrites them."""
        ...

    def undo(self, message_ids: Sequence[str]) -> int:
        """Remove what was written under these ids; the number actually removed."""
        ...

    def close(self) -> None:
        """Release connections."""
        ...


@dataclass(frozen=True, slots=True)
class TargetSpec:
    """A parsed target URL: ``scheme:location?key=value``; picklable, so executors build their own target."""

    scheme: str
    location: str
    options: tuple[tuple[str, str], ...] = ()

    @classmethod
    def parse(cls, url: str) -> TargetSpec:
        """Parse ``scheme:location[?k=v&…]``; raise ConfigurationError for an unknown scheme."""
        scheme, sep, rest = url.partition(":")
        if not sep or scheme not in TARGET_FACTORIES:
            raise ConfigurationError(
                f"unknown target {url!r}: use one of "
                + ", ".join(f"{name}:…" for name in sorted(TARGET_FACTORIES))
                + " (see docs/pipelines.md)"
            )
        location, _, query = rest.partition("?")
        if not location:
            raise ConfigurationError(f"target {url!r} has no location after {scheme}:")
        return cls(scheme, location, tuple(sorted(parse_qsl(query, keep_blank_values=True))))

    def option(self, key: str, default: str | None = None) -> str | None:
        """One ``?key=value`` option."""
        return dict(self.options).get(key, default)

    @property
    def url(self) -> str:
        """The URL again, options sorted (stable, used in the run fingerprint)."""
        query = "&".join(f"{k}={v}" for k, v in self.options)
        return f"{self.scheme}:{self.location}" + (f"?{query}" if query else "")

    def build(self) -> MigrationTarget:
        """Construct the target this spec names."""
        return TARGET_FACTORIES[self.scheme](self)


class SqliteTarget:
    """The embedded SQLite store: one ``store_many`` transaction per batch; undo removes by id."""

    can_undo = True

    def __init__(self, path: str, table: str = "delayed_messages") -> None:
        self.store = SqliteDelayedMessageStore(path, table=table, busy_timeout=120.0)

    def prepare(self) -> None:
        """Create the table if missing."""
        self.store.setup_infrastructure()

    def write(self, messages: Sequence[DelayedMessage]) -> None:
        """INSERT OR REPLACE the batch in one transaction."""
        if messages:
            self.store.store_many(messages)

    def undo(self, message_ids: Sequence[str]) -> int:
        """Delete the ids; count those that were still there."""
        return sum(1 for removed in self.store.remove_many(message_ids) if removed) if message_ids else 0

    def close(self) -> None:
        """Close the connections."""
        self.store.close()


def _sqlite(spec: TargetSpec) -> MigrationTarget:
    return SqliteTarget(spec.location, table=spec.option("table") or "delayed_messages")


#: Target URL scheme → factory. Adapters that need an SDK import it inside their factory.
TARGET_FACTORIES: dict[str, Callable[[TargetSpec], MigrationTarget]] = {"sqlite": _sqlite}
