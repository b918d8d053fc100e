"""How the command line prints: user data is never markup, ``--json`` is one document, tables keep their width.

Every command prints through this module. Its consoles read no Rich markup and no ``:emoji:`` codes, so an id such
as ``job[/x]42`` comes back as sent; styles are applied to our own labels only (``Text`` spans). Control characters
in data are shown as escapes (``\\x1b``), so a stored id cannot drive the terminal. ``--json`` output is written
with ``json.dumps`` (no highlighting, no wrapping), and progress goes to stderr, so stdout holds exactly one
document. A table printed into a pipe or a file is as wide as it needs to be instead of wrapped at 80 columns.
"""

from __future__ import annotations

import json
import re
import sys
from datetime import datetime
from typing import IO, Any

import typer
from rich.console import Console, RenderableType
from rich.measure import Measurement
from rich.text import Text

from delayed_delivery.redact import redact

__all__ = [
    "emit_json",
    "err",
    "fail",
    "instant",
    "one_line",
    "out",
    "plain_console",
    "print_table",
    "say",
    "styled",
    "visible",
    "warn",
]


def plain_console(*, stderr: bool = False, file: IO[str] | None = None) -> Console:
    """A console that reads no markup, no emoji codes and highlights nothing: what it is given is what it prints."""
    return Console(stderr=stderr, file=file, markup=False, emoji=False, highlight=False)


#: Standard output and standard error (bound to ``sys.stdout`` / ``sys.stderr`` when printing, not at import).
out = plain_console()
err = plain_console(stderr=True)

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")  # tab and newline stay
_LINE_BREAKS = re.compile(r"\s*[\r\n]+\s*")


def visible(text: str) -> str:
    """``text`` with control characters written as ``\\xNN`` escapes (tab and newline kept)."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def one_line(message: str) -> str:
    """``message`` on one line (line breaks and the spaces around them become one space), secrets masked."""
    return _LINE_BREAKS.sub(" ", redact(message).strip())


def styled(label: str, style: str, text: str | Text = "") -> Text:
    """``label`` in ``style``, then a space and ``text`` as it is (data: never read as markup)."""
    if not text:
        return Text(label, style=style)
    return Text.assemble((label, style), " ", text if isinstance(text, Text) else visible(text))


def say(text: str | Text, *, stderr: bool = False) -> None:
    """Print one line (or lines) of text unwrapped: ``str`` is data, printed as it is."""
    console = err if stderr else out
    console.print(text if isinstance(text, Text) else visible(text), soft_wrap=True)


def fail(message: str, code: int = 2) -> typer.Exit:
    """Print ``message`` as one ``error:`` line on stderr (secrets masked); returns the exit to raise."""
    err.print(styled("error:", "red", one_line(message)), soft_wrap=True)
    return typer.Exit(code=code)


def warn(message: str, label: str = "warning:") -> None:
    """One ``warning:`` line on stderr."""
    err.print(styled(label, "yellow", one_line(message)), soft_wrap=True)


def emit_json(document: Any, file: IO[str] | None = None) -> None:
    """``document`` as one indented JSON document on stdout (or ``file``), nothing else."""
    target = file if file is not None else sys.stdout
    target.write(json.dumps(document, indent=2, ensure_ascii=False) + "\n")
    target.flush()


def print_table(table: RenderableType, console: Console | None = None) -> None:
    """Print ``table``; into a pipe or file as wide as its content (a terminal keeps its own width)."""
    console = console if console is not None else out
    if console.is_terminal:
        console.print(table)
        return
    needed = Measurement.get(console, console.options.update_width(100_000), table).maximum
    wide = Console(file=console.file, width=max(console.width, needed), markup=False, emoji=False, highlight=False)
    wide.print(table)


def instant(moment: datetime | None) -> str:
    """A due time for people: ISO-8601 to the second (``--json`` keeps the full value)."""
    return "-" if moment is None else moment.isoformat(timespec="seconds")
