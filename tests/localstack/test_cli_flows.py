"""The README's AWS commands and the compressed ``aws verify --full`` of docs/verify.md, as written, on LocalStack.

Each documented block runs in bash with ``--local`` (moto server at 127.0.0.1:5000) replaced by
``--endpoint-url <LocalStack>``; DynamoDB is moto server through ``AWS_ENDPOINT_URL_DYNAMODB`` (set by the fixture).
"""

from __future__ import annotations

import json
import os
import subprocess
from typing import Any

import pytest

from tests.docs.blocks import ROOT, Block, blocks

pytestmark = pytest.mark.moto

BIN = ROOT / ".venv" / "bin"


def _aws_blocks(document: str) -> list[Block]:
    """The runnable shell blocks of ``document`` that use AWS (``aws …`` or ``--cloud aws``)."""
    found = [b for b in blocks([ROOT / document]) if b.marker == "runnable" and b.shell]
    return [b for b in found if any("aws" in argv for argv in b.commands())]


def _run(block: Block, endpoint: str, *, replace: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    code = block.code
    for old, new in (replace or {}).items():
        code = code.replace(old, new)
    code = code.replace("--local", f"--endpoint-url {endpoint}")
    env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}"}
    return subprocess.run(
        ["bash", "-c", f"set -euo pipefail\n{code}"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def _last_json(text: str) -> dict[str, Any]:
    """The last JSON document in ``text`` (``aws create`` prints one before verify's)."""
    decoder, at, found = json.JSONDecoder(), 0, None
    while (start := text.find("{", at)) >= 0:
        found, at = decoder.raw_decode(text, start)
    assert isinstance(found, dict), text[-2000:]
    return found


def test_the_readme_aws_flow_runs_on_localstack(moto_endpoint: str) -> None:
    ran = _aws_blocks("README.md")
    assert len(ran) >= 2, [b.place for b in ran]  # create/send/pending/cancel, then the tier
    outputs = []
    for block in ran:
        done = _run(block, moto_endpoint)
        assert done.returncode == 0, (block.place, done.stdout[-2000:], done.stderr[-2000:])
        outputs.append(done.stdout)
    text = "\n".join(outputs)
    assert "order-42" in text  # pending listed it before the cancel
    assert "delayed-delivery-buckets" in text or "1" in text


def test_aws_verify_full_compressed_passes_on_localstack(moto_endpoint: str) -> None:
    [*_, block] = _aws_blocks("docs/verify.md")
    assert "aws verify --local --full" in block.code and "export DELAYED_DELIVERY_MAX_NATIVE_DELAY=2" in block.code
    done = _run(block, moto_endpoint, replace={"aws verify --local --full": "aws verify --local --full --json"})
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])
    document = _last_json(done.stdout)
    statuses = {(c["check"], c["subject"]): c["status"] for c in document["checks"]}
    failed = [k for k, v in statuses.items() if v == "fail"]
    assert document["ok"] and not failed, failed
    probes = [k for k, v in statuses.items() if k[0].startswith("probe-") and v == "pass"]
    assert {k[0] for k in probes} >= {"probe-native", "probe-delay-fifo", "probe-tier", "probe-cancel"}, statuses
