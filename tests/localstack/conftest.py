"""The LocalStack lane's own tests: collected only with ``--aws-emulator=localstack`` (``make test-localstack``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fixtures.localstack import LOCALSTACK, aws_emulator


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """On moto (``make test``) these files are not collected: the README and verify flows run there in tests/docs."""
    if aws_emulator(config) != LOCALSTACK and collection_path.suffix == ".py":
        return True
    return None
