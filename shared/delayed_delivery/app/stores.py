"""Open a delayed-message store from a URL: ``sqlite:///path/to.db`` or ``postgresql://…``."""

from __future__ import annotations

from urllib.parse import urlparse

from delayed_delivery.errors import ConfigurationError
from delayed_delivery.ports import DelayedMessageStore
from delayed_delivery.redact import redact
from delayed_delivery.sqlite_store import SqliteDelayedMessageStore

__all__ = ["open_store"]


def open_store(url: str, *, setup: bool = True, connect_timeout: float | None = None) -> DelayedMessageStore:
    """Return the store a URL names, creating its tables when ``setup`` is true.

    ``connect_timeout``: seconds a PostgreSQL connection may take (default: the store's own).
    """
    parsed = urlparse(url)
    store: DelayedMessageStore
    if parsed.scheme == "sqlite":
        # SQLAlchemy's convention: sqlite:///relative/file.db, sqlite:////absolute/file.db
        path = url[len("sqlite:///") :] if url.startswith("sqlite:///") else ""
        if not path:
            raise ConfigurationError("sqlite store URL needs a file: sqlite:///relative.db or sqlite:////abs/path.db")
        store = SqliteDelayedMessageStore(path)
    elif parsed.scheme in ("postgres", "postgresql"):
        try:
            from delayed_delivery.postgres.store import PostgresDelayedMessageStore
        except ImportError as exc:
            raise ConfigurationError(
                "PostgreSQL support needs the postgres extra: pip install 'delayed-delivery[postgres]'"
            ) from exc
        if connect_timeout is None:
            store = PostgresDelayedMessageStore(url)
        else:
            store = PostgresDelayedMessageStore(url, connect_timeout=connect_timeout)
    else:
        raise ConfigurationError(
            f"unknown store URL {redact(url)!r}: use sqlite:///file.db (relative), sqlite:////abs/file.db or "
            "postgresql://…"
        )
    if setup:
        setup_infrastructure = getattr(store, "setup_infrastructure", None)
        if callable(setup_infrastructure):
            setup_infrastructure()
    return store
