"""Thin Azure Functions entry points."""
