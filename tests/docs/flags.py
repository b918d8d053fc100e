"""Whether a documented command line parses: its subcommands exist and it uses only flags its ``--help`` lists."""

from __future__ import annotations

import functools
import re
import subprocess
from pathlib import Path
from typing import Any

from tests.docs.blocks import ROOT

#: Programs of the cloud and build tool chains the docs name that this machine need not have (checked by name only).
EXTERNAL = {"func", "az", "aws", "zip", "curl", "jq", "sam", "kubectl"}
#: Shell built-ins and everyday programs whose lines are not checked further.
PLAIN = set(
    [
        "cd",
        "export",
        "unset",
        "eval",
        "echo",
        "printf",
        "cat",
        "ls",
        "mkdir",
        "rm",
        "cp",
        "sleep",
        "kill",
        "wait",
        "test",
        "source",
        ".",
        "python",
        "python3",
        "pip",
        "uv",
        "npm",
        "node",
        "git",
        "head",
        "tail",
        "tee",
        "true",
    ]
)


def problems(argv: list[str], *, strict: bool = False) -> list[str]:
    """What is wrong with one command line (empty: it parses). ``strict``: a required option must be on the line
    (in a block, a document may have exported it before)."""
    program = Path(argv[0]).name or argv[0]
    if program == "delayed-delivery":
        return _our_cli(argv[1:], strict)
    if program in ("python", "python3") and argv[1:3] == ["-m", "delayed_delivery.pipelines"]:
        return _pipelines(argv[3:])
    if program == "npx" and argv[1:2] == ["cdk"]:
        return _cdk(argv[2:])
    if program == "make":
        return _make(argv[1:])
    if program == "spark-submit":
        script = next((a for a in argv[1:] if a.endswith(".py")), None)
        return [] if script is None else _pipelines(argv[argv.index(script) + 1 :])
    if program in EXTERNAL or program in PLAIN:
        return []
    if argv[0].startswith((".venv/", "./")) and not (ROOT / argv[0]).exists():
        return [f"{argv[0]} does not exist in a checkout"]
    return [] if argv[0].startswith(".venv/") else [f"unknown program {argv[0]!r} (add it to tests/docs/flags.py)"]


def _flags(args: list[str]) -> list[str]:
    options = args[: args.index("--")] if "--" in args else args  # after `--` an argument may start with `-`
    return [a.split("=", 1)[0] for a in options if a.startswith("-") and a != "-"]


@functools.cache
def _command() -> Any:
    from delayed_delivery.app.cli import build_command

    return build_command()


def _our_cli(args: list[str], strict: bool) -> list[str]:
    """Walk the click command tree to the subcommand, then check every flag against that command's options."""
    command, path, rest = _command(), ["delayed-delivery"], list(args)
    while getattr(command, "commands", None) and rest and not rest[0].startswith("-"):
        name = rest.pop(0)
        if name not in command.commands:
            return [f"{' '.join(path)} has no command {name!r}"]
        command, path = command.commands[name], [*path, name]
    known = {"--help"} | {o for p in command.params for o in (*p.opts, *p.secondary_opts)}
    eager = {"--help"} | ({"--version"} & known)  # options that answer without a command
    if getattr(command, "commands", None) and not eager & set(rest):
        return [f"{' '.join(path)} needs a command"]
    unknown = [f"{' '.join(path)} has no option {flag}" for flag in _flags(rest) if flag not in known]
    if unknown or eager & set(rest):
        return unknown
    try:
        context = command.make_context(path[-1], list(rest))  # types, choices, counts: as the command will
    except Exception as exc:
        if type(exc).__name__ == "MissingParameter" and not strict:
            return []  # a required value may come from the environment the document set up
        return [f"{' '.join(args)}: {exc.format_message() if hasattr(exc, 'format_message') else exc}"]
    return [f"{' '.join(args)}: unexpected {context.args}"] if context.args else []


def _pipelines(args: list[str]) -> list[str]:
    """``python -m delayed_delivery.pipelines …`` (argparse): parse it for real, without running anything."""
    from delayed_delivery.pipelines.cli import build_parser

    parser = build_parser()
    parser.exit_on_error = False
    try:
        parser.parse_args(args)
    except SystemExit:
        return [f"python -m delayed_delivery.pipelines {' '.join(args)}: argparse refuses it"]
    except Exception as exc:
        return [f"python -m delayed_delivery.pipelines {' '.join(args)}: {exc}"]
    return []


@functools.cache
def _cdk_help(subcommand: str) -> str:
    cdk = ROOT / "node_modules" / ".bin" / "cdk"
    done = subprocess.run(
        [str(cdk), subcommand, "--help"], capture_output=True, text=True, cwd=ROOT, timeout=120, check=False
    )
    return done.stdout + done.stderr


def _cdk(args: list[str]) -> list[str]:
    subcommand = args[0] if args and not args[0].startswith("-") else ""
    flags = _flags(args)
    if not flags:  # nothing to look up: the CLI takes seconds to print its help
        return []
    help_text = _cdk_help(subcommand)
    return [f"cdk {subcommand} has no option {flag}" for flag in flags if flag not in help_text]


def _make(args: list[str]) -> list[str]:
    targets = set(re.findall(r"^([a-z][a-z-]*):", (ROOT / "Makefile").read_text(), re.M))
    return [f"the Makefile has no target {a!r}" for a in args if "=" not in a and a not in targets]
