"""Run the documents' runnable blocks as a user would type them: ``python session.py PLAN RESULTS``.

Standard library only: ``test_documented_commands.py`` starts it inside a private network namespace
(``unshare --user --map-root-user --net``), so the emulators the documents start on their fixed ports (moto 5000,
Azurite 10000-10002) are the only ones there, whatever else runs on the machine.

One shell session per document, in order: each block runs in a fresh ``bash`` with exactly the environment the plan
gives (``env -i``: PATH and HOME) plus what the document's earlier blocks exported, in the folder they left it in.
A background block (``delayed-delivery local up``) keeps running for the later documents; moto's state is reset
between documents (each one starts from empty emulators, as after a fresh ``local up``). A session stops at its
first failing block. Results: per document, per block, the exit status, the output and the time taken.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shlex
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

#: A cap against a hung command, not a speed check: docs/pipelines.md:29 (`migrate run` and `report`, a JVM each)
#: was killed at 301 s here at load 21; make test with the LocalStack lane beside it gives such loads.
STEP_TIMEOUT = 900.0
READY_TIMEOUT = 180.0
MOTO_RESET = "http://127.0.0.1:5000/moto-api/reset"


def loopback_up() -> None:
    """Bring ``lo`` up (a new network namespace starts with it down); nothing to do when it is up already."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        request = struct.pack("16sH", b"lo", 0)
        flags = struct.unpack("16sH", fcntl.ioctl(s.fileno(), 0x8913, request)[:18])[1]  # SIOCGIFFLAGS
        if not flags & 0x1:
            fcntl.ioctl(s.fileno(), 0x8914, struct.pack("16sH", b"lo", flags | 0x1))  # SIOCSIFFLAGS, IFF_UP


def _script(state: Path, code: str) -> str:
    """A block as a bash script: the session's environment and folder before, saved again after."""
    env_file, cwd_file = shlex.quote(str(state / "env.sh")), shlex.quote(str(state / "cwd"))
    return (
        "set -eE -o pipefail\n"
        "trap 'echo \"documented command failed (exit $?): $BASH_COMMAND\" >&2' ERR\n"
        f". {env_file}\n"
        f'cd "$(cat {cwd_file})"\n'
        f"{code}\n"
        f"export -p > {env_file}\n"
        f"pwd > {cwd_file}\n"
    )


def _run(argv: list[str], env: dict[str, str], stdin: str | None = None) -> dict[str, Any]:
    started = time.monotonic()
    process = subprocess.Popen(
        argv,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = process.communicate(stdin or "", timeout=STEP_TIMEOUT)
        code = process.returncode
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        out, err = process.communicate()
        code, err = -9, err + f"\n(killed after {STEP_TIMEOUT:.0f} s)"
    return {"rc": code, "out": out, "err": err, "seconds": round(time.monotonic() - started, 1)}


class Background:
    """The documents' long-running commands, kept until the end of the run."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.running: dict[str, tuple[subprocess.Popen[bytes], Path, str]] = {}

    def start(self, code: str, state: Path, env: dict[str, str], place: str) -> dict[str, Any]:
        """Start ``code`` unless it already runs; wait until it says ``Ctrl-C`` (ready), exits or times out."""
        command = " ".join(" ".join(line.split("#", 1)[0].split()) for line in code.splitlines()).strip()
        if command in self.running:
            return {"rc": 0, "out": "(already running from an earlier document)", "err": "", "seconds": 0.0}
        log = self.folder / f"background-{len(self.running)}.log"
        started = time.monotonic()
        with log.open("wb") as sink:
            process = subprocess.Popen(
                # SIGTERM (local up's Ctrl-C) when this runner dies, say killed by the test's timeout: no emulators left
                ["setpriv", "--pdeathsig", "TERM", "bash", "-c", _script(state, f"exec {code}")],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=sink,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.running[command] = (process, log, place)
        while time.monotonic() - started < READY_TIMEOUT:
            text = log.read_text(errors="replace")
            if "Ctrl-C" in text:
                return {"rc": 0, "out": text, "err": "", "seconds": round(time.monotonic() - started, 1)}
            if process.poll() is not None:
                return {"rc": process.returncode, "out": text, "err": "exited before it was ready", "seconds": 0.0}
            time.sleep(0.2)
        return {"rc": -1, "out": log.read_text(errors="replace"), "err": "not ready in time", "seconds": READY_TIMEOUT}

    def stop(self) -> list[dict[str, Any]]:
        """SIGTERM each (as Ctrl-C in its terminal would end it), then SIGKILL what is left."""
        stopped = []
        for process, log, place in self.running.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait(10)
            stopped.append({"place": place, "rc": process.returncode, "out": log.read_text(errors="replace")})
        return stopped


def _reset_moto() -> None:
    with contextlib.suppress(OSError):
        urllib.request.urlopen(urllib.request.Request(MOTO_RESET, method="POST", data=b""), timeout=10).close()


def _session(session: dict[str, Any], work: Path, background: Background, steps: list[dict[str, Any]]) -> None:
    """One document's blocks in order, until one fails."""
    folder = work / session["doc"].replace("/", "_").removesuffix(".md")
    state = folder / ".session"
    state.mkdir(parents=True)
    (state / "env.sh").write_text("")
    (state / "cwd").write_text(str(folder))
    env = dict(session["env"])
    for step in session["steps"]:
        if step["kind"] == "background":
            result = background.start(step["code"], state, env, step["place"])
        elif step["kind"] == "python":
            reader = f'. {shlex.quote(str(state / "env.sh"))}; cd "$(cat {shlex.quote(str(state / "cwd"))})"'
            result = _run(["bash", "-c", f"{reader}; exec python3 -"], env, step["code"])
        else:
            result = _run(["bash", "-c", _script(state, step["code"])], env)
        steps.append({"place": step["place"], "kind": step["kind"], **result})
        if result["rc"] != 0:
            return


def run_plan(plan: dict[str, Any]) -> dict[str, Any]:
    """Every session of the plan; the results as ``{doc: [step, …]}`` plus the background commands' ends.

    Sessions that use no emulator (``alone``: the Spark pipelines) run beside the others, in a thread of their own.
    """
    work = Path(plan["work"])
    background = Background(work)
    results: dict[str, Any] = {"documents": {}, "background": []}
    beside: list[threading.Thread] = []
    try:
        shared = 0
        for session in plan["sessions"]:
            steps: list[dict[str, Any]] = []
            results["documents"][session["doc"]] = steps
            if session.get("alone"):
                thread = threading.Thread(target=_session, args=(session, work, background, steps), daemon=True)
                thread.start()
                beside.append(thread)
                continue
            if shared:
                _reset_moto()
            shared += 1
            _session(session, work, background, steps)
        for thread in beside:
            thread.join()
    finally:
        results["background"] = background.stop()
    return results


def main() -> None:
    """``session.py PLAN RESULTS``: read the plan, run it, write the results (JSON files)."""
    plan_path, results_path = sys.argv[1], sys.argv[2]
    plan = json.loads(Path(plan_path).read_text())
    if plan.get("namespace"):
        loopback_up()
    Path(results_path).write_text(json.dumps(run_plan(plan)))


if __name__ == "__main__":
    main()
