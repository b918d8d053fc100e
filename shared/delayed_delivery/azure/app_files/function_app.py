"""The published function app's entry file: ``packaging`` copies it to the root of the folder it builds.

The app is defined once, in ``delayed_delivery.azure.function_host.create_app``: the dispatcher's timer every
minute, plus the example consumer and the pending census when the app settings ask for them.
``functions/azure/function_app.py`` (for ``func start`` there) is the same two lines.
"""

from __future__ import annotations

from delayed_delivery.azure.function_host import create_app

app = create_app()
