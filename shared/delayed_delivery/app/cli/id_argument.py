"""Commands whose argument is a message id: an id that looks like an option gets a hint instead of a bare error."""

from __future__ import annotations

from typing import Any

from typer.core import TyperCommand

__all__ = ["TakesAnId"]


class TakesAnId(TyperCommand):
    """A command whose argument is a message id: an id that looks like an option (``-abc``) gets the hint to put
    ``--`` before it, instead of click's bare "No such option"."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        """Parse as usual; an unknown option that is no typo of a known one says how to pass it as the id."""
        given = list(args)  # the parser consumes ``args``
        try:
            return super().parse_args(ctx, args)
        except Exception as exc:  # click's NoSuchOption (typer vendors its own click from 0.2x on: by name)
            name = getattr(exc, "option_name", None)
            if type(exc).__name__ != "NoSuchOption" or not isinstance(name, str) or getattr(exc, "possibilities", None):
                raise
            token = next((a for a in given if a.split("=", 1)[0] == name), None) or next(
                (a for a in given if a.startswith(name) and not a.startswith("--")), name
            )
            exc.message = (  # type: ignore[attr-defined]
                f"{getattr(exc, 'message', exc)}. If {token!r} is a message id, put -- before it: "
                f"delayed-delivery {ctx.info_name} [OPTIONS] -- {token}"
            )
            raise
