"""Number checks written once: a whole number that is no bool, a real number that is no bool and no NaN."""

from __future__ import annotations

from typing import TypeGuard

__all__ = ["is_number", "is_whole"]


def is_whole(value: object, low: int = 0, high: int | None = None) -> TypeGuard[int]:
    """Whether ``value`` is an int (``True`` is not) from ``low`` to ``high`` (both included; ``None``: no bound)."""
    return isinstance(value, int) and not isinstance(value, bool) and low <= value and (high is None or value <= high)


def is_number(value: object, low: float = 0.0) -> TypeGuard[int | float]:
    """Whether ``value`` is an int or a float (a bool is not) of at least ``low``; NaN never is."""
    return isinstance(value, int | float) and not isinstance(value, bool) and value >= low  # NaN >= low is False
