"""Entry point for ``func start`` in this folder: the function app itself is ``delayed_delivery.azure.app_files``.

One source of truth: the module below ships in the package, and ``delayed-delivery azure package`` copies it
to the root of the folder it builds. This file makes ``import function_app`` (and ``functions.azure.function_app``)
that very module, with its state, so a prepared host set through either name is the one the timer uses.
"""

from __future__ import annotations

import importlib
import sys

sys.modules[__name__] = importlib.import_module("delayed_delivery.azure.app_files.function_app")
