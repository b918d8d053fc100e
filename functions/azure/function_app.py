"""Entry point for ``func start`` in this folder: the app ``delayed-delivery azure package`` publishes.

The app is defined once, in ``delayed_delivery.azure.function_host.create_app``; the published folder's
``function_app.py`` (``delayed_delivery/azure/app_files``) is the same two lines.
"""

from __future__ import annotations

from delayed_delivery.azure.function_host import create_app

app = create_app()
