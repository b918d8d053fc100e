"""Every shell command in the README and docs/ runs as written (or, needing a real cloud, parses).

Each ```bash block carries a marker (``tests/docs/blocks.py``). The runnable ones run in a plain environment (``env
-i`` with PATH and HOME), one shell session per document, from the wheel installed into a fresh virtual environment
outside the checkout with the extras the README's install line names; the emulators are the ones the README's
``delayed-delivery local up`` starts, on their fixed ports, inside a private network namespace so that nothing else
on the machine can hold those ports. Azurite is the checkout's, found on PATH as ``azurite`` (as after ``npm install
-g azurite``; installing it with npm is tested in tests/test_local_emulators_azurite.py). A document whose install
line names an extra that is slow to install (``spark``) runs in the checkout's environment instead.

The cloud and checkout blocks, and every command of the runnable ones, are parsed: subcommands exist, flags are
the command's own (``tests/docs/flags.py``).
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.docs.blocks import MARKERS, ROOT, Block, blocks, inline_commands, install_extras
from tests.docs.conftest import SLOW_EXTRAS
from tests.docs.flags import problems
from tests.fixtures.services import unavailable

SESSION = Path(__file__).with_name("session.py")
FIXED_PORTS = (5000, 10000, 10001, 10002)

#: What a document's session must have printed, besides every command succeeding.
EXPECTED: dict[str, tuple[str, ...]] = {
    "README.md": (
        "order-42  → orders at ",  # send
        "cancel of order-42 accepted",
        # aws tier took the 2-year message into S3, and order-42 (40 days: auto picks the tier at 1,000 a minute)
        "ingested 2, objects 2",
        '"dispatched": 1',  # azure dispatch delivered the rescheduled message
        "1 ['orders']",  # the core example
    ),
    # the report's Markdown on stdout, unwrapped: a table row longer than 80 columns stays one line
    "docs/pipelines.md": (
        "| band | messages | mean_delay_s | mean_hops | measured_requests_per_message |",
        "written to report",
    ),
}


def _shell_blocks() -> list[Block]:
    return [b for b in blocks() if b.shell]


def _runnable_docs() -> list[str]:
    found = [b.doc for b in blocks() if b.marker and b.marker.startswith("runnable")]
    return list(dict.fromkeys(found))


def test_every_shell_block_says_how_it_is_checked() -> None:
    unmarked = [f"{b.place} ({b.marker or 'no marker'})" for b in _shell_blocks() if b.marker not in MARKERS]
    assert not unmarked, f"mark each shell block with one of {MARKERS}: {unmarked}"
    bare = [b.place for b in blocks() if b.lang == "" and b.code.lstrip().startswith("delayed-delivery ")]
    assert not bare, f"commands in blocks without a language escape every check: {bare}"


def test_the_readme_has_a_runnable_local_quick_start() -> None:
    readme = [b for b in blocks() if b.doc == "README.md"]
    kinds = {b.marker for b in readme}
    assert {"runnable: install", "runnable: background", "runnable"} <= kinds, kinds
    assert sum(b.lang == "python" and b.marker == "runnable" for b in readme) >= 3


@pytest.mark.parametrize("block", _shell_blocks(), ids=lambda b: b.place)
def test_every_documented_command_parses(block: Block) -> None:
    commands = block.commands()
    assert commands, f"{block.place}: no command in the block"
    found = [p for argv in commands for p in problems(argv)]
    assert not found, f"{block.place}: {found}"


@pytest.mark.parametrize(("place", "argv"), inline_commands(), ids=lambda v: v if isinstance(v, str) else "")
def test_every_command_written_inline_parses(place: str, argv: list[str]) -> None:
    found = problems(argv, strict=True)
    assert not found, f"{place}: {found}"


def _namespace_works() -> bool:
    unshare = shutil.which("unshare")
    if unshare is None:
        return False
    probe = subprocess.run([unshare, "--user", "--map-root-user", "--net", "true"], capture_output=True)
    return probe.returncode == 0


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _plan(work: Path, env: dict[str, str], checkout_env: dict[str, str]) -> dict[str, Any]:
    sessions = []
    for doc in _runnable_docs():
        mine = [b for b in blocks() if b.doc == doc and b.marker and b.marker.startswith("runnable")]
        extras = {e for b in mine if b.marker == "runnable: install" for e in install_extras(b)}
        steps = [
            {"place": b.place, "code": b.code, "kind": "background" if b.marker == "runnable: background" else b.lang}
            for b in mine
            if b.marker != "runnable: install"
        ]
        slow = bool(extras & SLOW_EXTRAS)  # the Spark pipelines: no emulator, so they run beside the others
        sessions.append({"doc": doc, "steps": steps, "env": checkout_env if slow else env, "alone": slow})
    return {"work": str(work), "sessions": sessions}


@pytest.fixture(scope="session")
def documented_sessions(
    user_venv: Callable[[list[str]], Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Any]]:
    """Run every document's runnable blocks once; the results by document."""
    readme_install = [b for b in blocks() if b.doc == "README.md" and b.marker == "runnable: install"]
    venv = user_venv(install_extras(readme_install[0]))
    tools = tmp_path_factory.mktemp("tools")
    azurite = ROOT / "node_modules" / ".bin" / "azurite"
    if not azurite.exists():
        unavailable(f"{azurite} is missing (run scripts/bootstrap.sh)")
    (tools / "azurite").symlink_to(azurite)
    home = tmp_path_factory.mktemp("home")
    system = "/usr/local/bin:/usr/bin:/bin"
    env = {"PATH": f"{venv / 'bin'}:{tools}:{system}", "HOME": str(home)}
    checkout_env = {"PATH": f"{ROOT / '.venv' / 'bin'}:{tools}:{system}", "HOME": str(home)}
    work = tmp_path_factory.mktemp("work")
    plan = _plan(work, env, checkout_env)
    plan_file, results_file = work / "plan.json", work / "results.json"
    namespace = _namespace_works()
    plan_file.write_text(json.dumps({**plan, "namespace": namespace}))
    command = [sys.executable, str(SESSION), str(plan_file), str(results_file)]
    if namespace:
        command = ["unshare", "--user", "--map-root-user", "--net", *command]
        subprocess.run(command, timeout=3600, check=True)
    else:  # no private namespace here: the fixed ports must be free, and one run at a time takes them
        with (Path("/tmp") / "delayed-delivery-docs-ports.lock").open("w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            busy = [p for p in FIXED_PORTS if not _free(p)]
            if busy:
                unavailable(f"ports {busy} are taken and no network namespace is available (unshare)")
            subprocess.run(command, timeout=3600, check=True, env=os.environ)
    yield json.loads(results_file.read_text())


def _report(steps: list[dict[str, Any]]) -> str:
    return "\n\n".join(
        f"{s['place']} ({s['kind']}) exit {s['rc']} in {s['seconds']} s\n--- stdout\n{s['out'][-3000:]}\n"
        f"--- stderr\n{s['err'][-3000:]}"
        for s in steps
    )


#: The first test to use ``documented_sessions`` runs all of it (wheel, venv, every document): ~9 min at load 11.
SESSIONS_TIMEOUT = 1800


@pytest.mark.moto
@pytest.mark.azurite
@pytest.mark.timeout(SESSIONS_TIMEOUT)
@pytest.mark.parametrize("doc", _runnable_docs())
def test_documented_commands_run_as_written(documented_sessions: dict[str, Any], doc: str) -> None:
    steps = documented_sessions["documents"][doc]
    expected = [b.place for b in blocks() if b.doc == doc and b.marker in ("runnable", "runnable: background")]
    failed = [s for s in steps if s["rc"] != 0]
    assert not failed, _report(failed)
    assert [s["place"] for s in steps] == expected, _report(steps)
    printed = "".join(s["out"] + s["err"] for s in steps)
    missing = [text for text in EXPECTED.get(doc, ()) if text not in printed]
    assert not missing, f"{doc}: not printed: {missing}\n{_report(steps)}"


@pytest.mark.moto
@pytest.mark.azurite
@pytest.mark.timeout(SESSIONS_TIMEOUT)
def test_local_up_stops_cleanly_at_the_end(documented_sessions: dict[str, Any]) -> None:
    ends = documented_sessions["background"]
    assert ends, "the README starts the emulators with `delayed-delivery local up`"
    for end in ends:
        assert end["rc"] == 0, end
        assert "Traceback" not in end["out"], end["out"]
        for export in ("AWS_DEFAULT_REGION", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL=",
                       "DELAYED_DELIVERY_STORAGE_CONNECTION_STRING"):  # fmt: skip
            assert f"export {export}" in end["out"], (export, end["out"])
