"""Reusable pytest contract suites: subclass them to prove a custom store behaves like the built-in ones."""

from __future__ import annotations

from .store_contract import MultiProcessStoreContract, StoreContract

__all__ = ["MultiProcessStoreContract", "StoreContract"]
