"""The function-app files (``function_app.py``, ``host.json``, ...) that ``packaging`` copies to a folder's root."""
