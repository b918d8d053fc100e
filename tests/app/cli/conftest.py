"""Helpers for the CLI tests: run a command, and check the one-line error contract."""

from __future__ import annotations

import json
from functools import cache
from typing import Any
from unittest import mock

import typer.main
import typer.testing
from typer.testing import CliRunner, Result

from delayed_delivery.app.cli import app

runner = CliRunner()


@cache
def _command() -> Any:
    """The click command of ``app``, built once: typer rebuilds it (reading every command's signature) per invoke."""
    return typer.main.get_command(app)


def run(*args: str) -> Result:
    """Invoke ``delayed-delivery ARGS`` (on the command built once; the invocation itself is the runner's)."""
    with mock.patch.object(
        typer.testing, "_get_command", lambda given: _command() if given is app else typer.main.get_command(given)
    ):
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
