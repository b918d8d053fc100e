"""The ``delayed-delivery`` console script: a one-line hint, not a traceback, when the cli extra is missing."""

from __future__ import annotations

import sys

__all__ = ["CLI_HINT", "main"]

#: What to install for the command line (typer and rich are the ``cli`` extra).
CLI_HINT = 'the delayed-delivery command needs the cli extra: pip install "delayed-delivery[cli]"'


def main() -> None:
    """Run the CLI; exit 2 with ``CLI_HINT`` when typer or rich is not installed."""
    try:
        import rich  # noqa: F401
        import typer  # noqa: F401
    except ModuleNotFoundError as exc:
        if exc.name not in ("typer", "rich"):
            raise
        print(f"error: {CLI_HINT}", file=sys.stderr)
        sys.exit(2)
    from delayed_delivery.app.cli import main as cli_main

    cli_main()
