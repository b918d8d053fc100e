"""The demo: the cloud-free one on SQLite, and the one through both clouds on local emulators."""
