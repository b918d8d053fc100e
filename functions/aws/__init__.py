"""Thin AWS Lambda entry points."""
