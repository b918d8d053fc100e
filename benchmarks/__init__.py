"""Benchmarks: each module exposes ``run(smoke: bool) -> list[Row]``; ``python -m benchmarks`` runs them all."""
