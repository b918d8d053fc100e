"""Test configuration shared by every suite."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import settings

# Fake cloud credentials so no SDK ever looks for real ones (or for instance metadata).
os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
os.environ.setdefault("AWS_EC2_METADATA_DISABLED", "true")
os.environ.setdefault("POWERTOOLS_TRACE_DISABLED", "true")
os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")

# Property tests assert behaviour, never speed: no per-example deadline, so a loaded machine cannot fail them.
settings.register_profile("suite", deadline=None)
settings.load_profile("suite")

# Service fixtures live one file per service; each starts its emulator on a free loopback port.
pytest_plugins = [
    "tests.fixtures.localstack",
    "tests.fixtures.moto",
    "tests.fixtures.azurite",
    "tests.fixtures.postgres",
    "tests.fixtures.spark",
]


@pytest.fixture(autouse=True)
def _restore_product_logger() -> Iterator[None]:
    """CLI commands configure the ``delayed_delivery`` logger for their process; undo that after each test."""
    logger = logging.getLogger("delayed_delivery")
    saved = (list(logger.handlers), logger.level, logger.propagate)
    yield
    logger.handlers[:], logger.level, logger.propagate = saved


@pytest.fixture(autouse=True)
def _fresh_powertools_metrics() -> None:
    """Powertools keeps one metric set for every ``Metrics`` in a process: start each test with it empty."""
    if "aws_lambda_powertools.metrics" in sys.modules:
        from aws_lambda_powertools.metrics import Metrics

        Metrics().clear_metrics()


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadfile`` with every Spark file on one worker, the longest scopes first (tests/fixtures/scheduling)."""
    if config.getvalue("dist") != "loadfile":
        return None
    from tests.fixtures.scheduling import SparkTogether

    return SparkTogether(config, log)
