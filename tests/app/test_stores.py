"""``--store`` URLs: the application opens the adapter a URL names; the core knows nothing of PostgreSQL."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from delayed_delivery.app.stores import open_store
from delayed_delivery.errors import ConfigurationError
from delayed_delivery.sqlite_store import SqliteDelayedMessageStore


def test_a_sqlite_url_opens_the_embedded_store_with_its_tables(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'delays.db'}")
    assert isinstance(store, SqliteDelayedMessageStore)
    assert store.next_due() is None  # the table exists (setup ran) and is empty
    store.close()


@pytest.mark.parametrize("url", ["mysql://db/x", "sqlite://", "delays.db"])
def test_an_unknown_or_incomplete_url_is_a_configuration_error(url: str) -> None:
    with pytest.raises(ConfigurationError, match="sqlite"):
        open_store(url)


def test_a_postgres_url_without_the_driver_names_the_extra_to_install() -> None:
    """In a fresh interpreter where psycopg cannot be imported (as without the ``postgres`` extra)."""
    script = (
        "import sys; sys.modules['psycopg'] = None\n"
        "from delayed_delivery.app.stores import open_store\n"
        "from delayed_delivery.errors import ConfigurationError\n"
        "try:\n    open_store('postgresql://user:secret@db/x')\n"
        "except ConfigurationError as exc:\n    print(exc)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True)
    assert "pip install 'delayed-delivery[postgres]'" in done.stdout
    assert "secret" not in done.stdout


def test_the_core_does_not_import_the_postgres_adapter() -> None:
    """Importing the package and opening a SQLite store loads no ``delayed_delivery.postgres`` module."""
    script = (
        "import sys, tempfile, os\n"
        "from delayed_delivery.app.stores import open_store\n"
        "open_store('sqlite:///' + os.path.join(tempfile.mkdtemp(), 'd.db'))\n"
        "print(sorted(m for m in sys.modules if m.startswith('delayed_delivery.postgres')))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.strip() == "[]"
