"""Spark pipelines (extra ``spark``): timeout migration and delivery reports."""
