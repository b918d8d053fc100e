"""Reusable pytest contract suites and local cloud tooling (``testing.aws``).

The contract suites import pytest; they load on first use, so ``delayed_delivery.testing.aws`` works without it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .store_contract import MultiProcessStoreContract, StoreContract

__all__ = ["MultiProcessStoreContract", "StoreContract"]


def __getattr__(name: str) -> Any:
    """``StoreContract`` and ``MultiProcessStoreContract``, imported (with pytest) when first asked for."""
    if name in __all__:
        from . import store_contract

        return getattr(store_contract, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
