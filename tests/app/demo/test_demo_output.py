"""The demo prints only its own lines: no library warnings (azure-functions' auth-level notice), no log records."""

from __future__ import annotations

import contextlib
import logging
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from delayed_delivery.app.demo import cloud_azure
from delayed_delivery.app.demo.cloud_azure import TIMER_FUNCTION, registered_timer
from delayed_delivery.azure import function_host
from delayed_delivery.azure.app_files import function_app

ROOT = Path(__file__).resolve().parents[3]
NOTICE = "Auth level is not applied to non http function app. Ref: https://docs.microsoft.com/azure/azure-functions"
#: What a stray line looks like: a Python warning, a log record in logging's default formats, a traceback.
STRAY = re.compile(r"\w*Warning: |^(WARNING|ERROR|CRITICAL|INFO|DEBUG)[: ]|^Traceback|Auth level", re.MULTILINE)


class _Host:
    """Stands in for the dispatcher host: counts its runs."""

    def __init__(self) -> None:
        self.runs = 0

    def run(self) -> None:
        self.runs += 1


@contextlib.contextmanager
def _bare_root() -> Iterator[logging.Logger]:
    """The root logger as in a plain process: no handlers (pytest's own, added around the test call, put back)."""
    root = logging.getLogger()
    saved = list(root.handlers), list(root.filters)
    root.handlers.clear()
    try:
        yield root
    finally:
        root.handlers[:], root.filters[:] = saved
        function_host.use_host(None)


def test_registered_timer_is_the_apps_timer_and_runs_on_the_given_host() -> None:
    host = _Host()
    with _bare_root():
        timer = registered_timer(host)  # type: ignore[arg-type]
        assert timer.__name__ == TIMER_FUNCTION
        timer(None)
        assert host.runs == 1
        # the registry can still be read by the next reader (a harness, the Functions host)
        function_app.app.functions_bindings = None
        with cloud_azure._without_auth_level_notice():
            assert [f.get_function_name() for f in function_app.app.get_functions()] == [TIMER_FUNCTION]
        function_app.app.functions_bindings = None


def test_reading_the_registry_prints_no_auth_level_notice_and_leaves_logging_as_it_was(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with _bare_root() as root:
        registered_timer(_Host())  # type: ignore[arg-type]
        assert root.handlers == [] and root.filters == []  # no basicConfig() left behind, no filter
        assert "Auth level" not in capsys.readouterr().err
        # unguarded, the same read prints it: what the guard is for
        function_app.app.functions_bindings = None
        try:
            function_app.app.get_functions()
        finally:
            function_app.app.functions_bindings = None
    assert "Auth level" in capsys.readouterr().err


def test_only_that_notice_is_dropped(capsys: pytest.CaptureFixture[str]) -> None:
    with _bare_root() as root:
        with cloud_azure._without_auth_level_notice():
            logging.warning(NOTICE)
            logging.warning("another root warning")
            logging.getLogger("azure.core").warning("a library warning")
        assert root.handlers == [] and root.filters == []
    err = capsys.readouterr().err
    assert "Auth level" not in err
    assert "another root warning" in err and "a library warning" in err


@pytest.mark.moto
@pytest.mark.azurite
def test_the_demo_prints_only_its_own_lines() -> None:
    """The tiny demo as a user runs it, in its own process: stderr holds only its status lines."""
    command = [sys.executable, "-c", "from delayed_delivery.app.entry import main; main()"]
    args = ["demo", "--quick", "--messages", "9", "--year-seconds", "8"]
    run = subprocess.run(command + args, cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "lost (must be 0)" in run.stdout
    assert not STRAY.search(run.stdout + run.stderr), run.stdout + run.stderr
    status = [line for line in run.stderr.splitlines() if line.strip()]
    assert status and all(line.endswith("…") for line in status), run.stderr
