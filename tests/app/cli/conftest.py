"""Helpers for the CLI tests: run a command, and check the one-line error contract."""

from __future__ import annotations

import json
from typing import Any

from typer.testing import CliRunner, Result

from delayed_delivery.app.cli import app

runner = CliRunner()


def run(*args: str) -> Result:
    """Invoke ``delayed-delivery ARGS``."""
    return runner.invoke(app, list(args))


def ok_json(*args: str) -> Any:
    """Invoke with ``--json``; assert exit 0 and return the parsed output."""
    result = run(*args, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def one_line_error(result: Result, *needles: str) -> str:
    """Assert exit code 2, a single ``error:`` line on stderr containing ``needles``, no traceback."""
    assert result.exit_code == 2, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.output
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]
