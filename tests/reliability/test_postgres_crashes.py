"""SIGKILL of core dispatcher processes on the PostgreSQL store: nothing is ever lost."""

from __future__ import annotations

import pytest

from tests.reliability.pglab import process_kill_soak

pytestmark = pytest.mark.postgres


def test_sigkilled_dispatchers_on_postgres_lose_nothing(postgres_conninfo: str) -> None:
    result, killed_while_working = process_kill_soak(postgres_conninfo, messages=400, kills=10, seed=4)
    assert result.process_kills == 10
    assert killed_while_working >= 5, "the kills must land on processes that were dispatching"
    assert result.lost == 0
    assert result.delivered == 400
