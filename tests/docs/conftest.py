"""The pip user's environment: the wheel built from this checkout, installed into fresh virtual environments outside it.

Built once per session with uv (its cache makes an install of the locked versions take seconds). Versions are held
to ``uv.lock`` (``uv export`` as constraints), as a clone a year from now would get them.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.docs.blocks import ROOT

#: Extras whose install is slow from the registry (PySpark is built from source each time): their documents run in
#: the checkout's environment, which has every extra (see test_documented_commands.py).
SLOW_EXTRAS = {"spark", "infra", "dev"}


def uv() -> list[str]:
    """How to run uv here: a module of this Python or of python3, or a program on PATH."""
    for python in (sys.executable, shutil.which("python3")):
        if python and subprocess.run([python, "-m", "uv", "--version"], capture_output=True).returncode == 0:
            return [python, "-m", "uv"]
    found = shutil.which("uv")
    if found is None:
        pytest.fail("uv is needed to build the wheel (scripts/bootstrap.sh installs it)")
    return [found]


def _run(argv: list[str], cwd: Path | None = None) -> None:
    done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"{' '.join(argv)}\n{done.stdout}\n{done.stderr}"


@pytest.fixture(scope="session")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The project's wheel, built from a copy of what it is made of (the checkout gets no build folders)."""
    source = tmp_path_factory.mktemp("wheel-source")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    shutil.copytree(ROOT / "shared", source / "shared", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    dist = tmp_path_factory.mktemp("dist")
    _run([*uv(), "build", "--wheel", "--out-dir", str(dist), "--quiet", str(source)])
    [built] = dist.glob("delayed_delivery-*.whl")
    return built


@pytest.fixture(scope="session")
def constraints(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The locked versions of every dependency, as pip constraints."""
    path = tmp_path_factory.mktemp("lock") / "constraints.txt"
    _run([*uv(), "export", "--frozen", "--all-extras", "--no-hashes", "--no-emit-project", "--quiet",
          "--project", str(ROOT), "--output-file", str(path)])  # fmt: skip
    return path


@pytest.fixture(scope="session")
def user_venv(wheel: Path, constraints: Path, tmp_path_factory: pytest.TempPathFactory) -> Callable[[list[str]], Path]:
    """``make(extras)``: a fresh virtual environment outside the checkout with the wheel and those extras."""
    made: dict[tuple[str, ...], Path] = {}

    def make(extras: list[str]) -> Path:
        key = tuple(sorted(extras))
        if key not in made:
            venv = tmp_path_factory.mktemp("venv-" + ("-".join(key) or "bare"))
            _run([*uv(), "venv", "--quiet", "--python", sys.executable, str(venv)])
            spec = f"{wheel}[{','.join(key)}]" if key else str(wheel)
            _run([*uv(), "pip", "install", "--quiet", "--python", str(venv / "bin" / "python"),
                  "--constraint", str(constraints), spec])  # fmt: skip
            made[key] = venv
        return made[key]

    return make
