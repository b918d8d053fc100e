"""The shell and Python blocks of the README and docs/, each with the marker that says how it is checked.

Every ```bash block carries one marker comment on the line before it:

* ``<!-- runnable -->``: run as written, in order with the document's other runnable blocks, in one shell session
  per document (exports and ``cd`` carry on, as in a terminal), by ``test_documented_commands.py``;
* ``<!-- runnable: background -->``: a command that keeps running in its own terminal (``local up``): started in the
  background, and the session goes on once it says it is ready;
* ``<!-- runnable: install -->``: the ``pip install`` line; the test installs the wheel it built with the extras
  this line names, into a fresh virtual environment outside the checkout;
* ``<!-- cloud -->``: needs a real AWS or Azure account; each command's flags are checked against its ``--help``;
* ``<!-- checkout -->``: works in a source checkout (``make``, ``.venv/bin/…``, ``pytest``): the make targets and
  paths must exist and each command's flags parse.

```python blocks marked ``<!-- runnable -->`` run in the same session (with the session's environment).
A new document or command is covered by adding its block with a marker: nothing to register here.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MARKERS = ("runnable", "runnable: background", "runnable: install", "cloud", "checkout")
SHELLS = ("bash", "sh", "shell", "console")

_FENCE = re.compile(
    r"^(?P<indent>[ \t]*)```(?P<lang>[A-Za-z0-9_+-]*)[ \t]*\n(?P<code>.*?)^(?P=indent)```[ \t]*$", re.S | re.M
)
_REDIRECT = re.compile(r"\s\d*(?:>>?|<)(?:&\d+|\s*[^\s;&|]+)")
#: A command written inline in the text: `delayed-delivery …` with at least one option.
_INLINE = re.compile(r"`(delayed-delivery [^`]*?--[^`]*)`")
_MARKER = re.compile(r"<!--\s*(?P<marker>[a-z][a-z :-]*?)\s*-->\s*$")
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


@dataclass(frozen=True, slots=True)
class Block:
    """One fenced block: where it is, its language, its marker (or ``None``) and its text."""

    doc: str
    line: int
    lang: str
    marker: str | None
    code: str

    @property
    def place(self) -> str:
        """``path:line`` of the fence, for messages."""
        return f"{self.doc}:{self.line}"

    @property
    def shell(self) -> bool:
        """Whether this is a shell block."""
        return self.lang in SHELLS

    def commands(self) -> list[list[str]]:
        """Each command of a shell block as argv (continuations joined, comments and ``VAR=value`` prefixes
        dropped, split at ``&&``, ``||``, ``;``, ``|`` and ``&``)."""
        text = _REDIRECT.sub(" ", re.sub(r"\\\n", " ", self.code))
        found: list[list[str]] = []
        for line in text.splitlines():
            lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|")
            lexer.whitespace_split = True
            lexer.commenters = "#"
            argv: list[str] = []
            for token in [*lexer, ";"]:
                if token and set(token) <= set(";&|"):
                    while argv and _ASSIGNMENT.match(argv[0]):
                        argv.pop(0)
                    if argv:
                        found.append(argv)
                    argv = []
                else:
                    argv.append(token)
        return found


def documents() -> list[Path]:
    """The README and every page under docs/."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def blocks(paths: list[Path] | None = None) -> list[Block]:
    """Every fenced block of the documents, in order."""
    found: list[Block] = []
    for path in paths or documents():
        text = path.read_text(encoding="utf-8")
        for match in _FENCE.finditer(text):
            before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
            marker = _MARKER.search(before)
            line = text[: match.start()].count("\n") + 1
            indent = len(match.group("indent"))
            code = "\n".join(row[indent:] for row in match.group("code").split("\n"))
            found.append(
                Block(
                    str(path.relative_to(ROOT)),
                    line,
                    match.group("lang").lower(),
                    marker.group("marker") if marker else None,
                    code,
                )
            )
    return found


def inline_commands(paths: list[Path] | None = None) -> list[tuple[str, list[str]]]:
    """Commands written inline in the text (with an option), as (``path:line``, argv); not ones with placeholders
    (``…``, ``<name>``) or alternatives (``a | b``, ``a / b``)."""
    found: list[tuple[str, list[str]]] = []
    for path in paths or documents():
        text = path.read_text(encoding="utf-8")
        for match in _INLINE.finditer(text):
            command = " ".join(match.group(1).split())
            if any(mark in command for mark in ("…", "<", "|", " / ", "[")):
                continue
            line = text[: match.start()].count("\n") + 1
            block = Block(str(path.relative_to(ROOT)), line, "bash", None, command)
            found.extend((block.place, argv) for argv in block.commands())
    return found


def install_extras(block: Block) -> list[str]:
    """The extras a ``runnable: install`` block's ``pip install "delayed-delivery[...]"`` names."""
    for argv in block.commands():
        for arg in argv:
            match = re.fullmatch(r"delayed-delivery\[([a-z,]+)\]", arg)
            if argv[:2] == ["pip", "install"] and match:
                return match.group(1).split(",")
    raise AssertionError(f'{block.place}: no pip install "delayed-delivery[...]" line')
