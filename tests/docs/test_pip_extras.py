"""With only ``delayed-delivery[cli]`` installed (from the wheel, outside the checkout), every command that needs
another extra says which in one line and exits 2; the ones that need none work."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

#: A command that needs an extra, and the extras its one line must name.
NEEDS = [
    (["demo", "--quick"], "aws, azure and local extras", "cli,aws,azure,local"),
    (["aws", "create", "--local", "--queue", "orders"], "aws extra", "cli,aws"),
    (["aws", "--help"], "aws extra", "cli,aws"),
    (["azure", "setup", "--local", "--endpoint", "shop"], "azure extra", "cli,azure"),
    (["report", "--logs", "logs/"], "spark extra", "cli,spark"),
    (["migrate", "run", "--source", "export/", "--target", "sqlite:d.db"], "spark extra", "cli,spark"),
    (["send", "--cloud", "aws", "--local", "--to", "orders", "--delay", "1h", "--body", "x"], "aws extra", "cli,aws"),
    (["pending", "--cloud", "azure", "--local", "--endpoint", "shop"], "azure extra", "cli,azure"),
    (["local", "up", "--for", "1"], "local extra", "cli,local"),
]


@pytest.fixture(scope="module")
def cli_only(user_venv: Callable[[list[str]], Path], tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Any]:
    venv = user_venv(["cli"])
    folder = tmp_path_factory.mktemp("cli-only")
    env = {"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "HOME": str(folder)}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        command = [str(venv / "bin" / "delayed-delivery"), *args]
        return subprocess.run(command, env=env, cwd=folder, capture_output=True, text=True, timeout=120)

    return run


@pytest.mark.parametrize(("args", "names", "extras"), NEEDS, ids=lambda v: " ".join(v) if isinstance(v, list) else "")
def test_a_command_needing_another_extra_says_which(
    cli_only: Callable[..., subprocess.CompletedProcess[str]], args: list[str], names: str, extras: str
) -> None:
    done = cli_only(*args)
    assert done.returncode == 2, (done.stdout, done.stderr)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    assert names in lines[0] and f'pip install "delayed-delivery[{extras}]"' in lines[0], lines[0]
    assert "Traceback" not in done.stderr + done.stdout


def test_what_needs_no_extra_works(cli_only: Callable[..., subprocess.CompletedProcess[str]]) -> None:
    core = cli_only("demo", "--core", "--quick", "--json", "--messages", "20")
    assert core.returncode in (0, 1), core.stderr  # 1: the demo's own verdict (a loaded machine)
    assert json.loads(core.stdout)["sent"] >= 20
    cost = cli_only("cost", "--delay", "40d", "--json")
    assert cost.returncode == 0 and json.loads(cost.stdout)["messages"] == 1_000_000, cost.stderr
    sent = cli_only("send", "--store", "sqlite:///d.db", "--to", "orders", "--delay", "1h", "--body", "x", "--json")
    assert sent.returncode == 0 and json.loads(sent.stdout)["route"] == "store", sent.stderr
    listed = cli_only("--help")
    assert listed.returncode == 0
    for group in ("aws", "azure", "report", "migrate", "local"):
        assert group in listed.stdout, listed.stdout
