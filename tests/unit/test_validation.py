"""The number checks every module shares: whole numbers that are no bool, real numbers that are no bool or NaN."""

from __future__ import annotations

import math

import pytest

from delayed_delivery.validation import is_number, is_whole


@pytest.mark.parametrize(
    ("value", "low", "high", "expected"),
    [
        (0, 0, None, True),
        (10**30, 0, None, True),
        (-1, 0, None, False),
        (True, 0, None, False),
        (False, 0, None, False),
        (1.0, 0, None, False),
        ("1", 0, None, False),
        (None, 0, None, False),
        (5, 1, 5, True),
        (6, 1, 5, False),
        (0, 1, 5, False),
    ],
)
def test_is_whole(value: object, low: int, high: int | None, expected: bool) -> None:
    assert is_whole(value, low, high) is expected


@pytest.mark.parametrize(
    ("value", "low", "expected"),
    [
        (0, 0.0, True),
        (0.5, 0.0, True),
        (math.inf, 0.0, True),
        (-0.1, 0.0, False),
        (math.nan, 0.0, False),
        (math.nan, -math.inf, False),
        (True, 0.0, False),
        ("1", 0.0, False),
        (1, 2.0, False),
    ],
)
def test_is_number(value: object, low: float, expected: bool) -> None:
    assert is_number(value, low) is expected
