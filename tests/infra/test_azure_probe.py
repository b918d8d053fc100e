"""The verify probe queue in the Bicep (no bicep CLI here: checked as text, as test_azure_bicep.py does): on by
default, created with the destination queues, allowed as a destination, sendable by the identity, named in an
output; off, none of it."""

from __future__ import annotations

import json
import re

import pytest

from delayed_delivery.azure.verify import PROBE_QUEUE
from tests.infra.test_azure_bicep import block, code, params, source

pytestmark = pytest.mark.infra


def test_the_probe_queue_is_on_by_default_with_the_name_verify_uses() -> None:
    main = code(source("main.bicep"))
    assert params(source("main.bicep"))["deployVerifyProbe"] and "param deployVerifyProbe bool = true" in main
    assert f"param verifyProbeQueue string = '{PROBE_QUEUE}'" in main
    assert "var probeQueues = deployVerifyProbe ? [verifyProbeQueue] : []" in main, "off: no probe queue anywhere"
    assert "output probeQueue string = deployVerifyProbe ? verifyProbeQueue : ''" in main


def test_the_probe_queue_is_created_allowed_and_sendable_like_a_destination() -> None:
    main = code(source("main.bicep"))
    assert "destinationQueues: createdQueues" in block(main, main.index("module storage "))
    assert "senderQueues: union(createdQueues, [errorQueueName])" in block(main, main.index("module roles "))
    allow = re.search(r"var destinationAllowList = (.*)", main)
    assert allow and allow.group(1).endswith(", probeQueues)"), "allowed whatever allowedDestinations says"
    # the example consumer keeps reading the first of the user's queues, never the probe
    assert "param exampleConsumerQueue string = join(take(destinationQueues, 1), '')" in main


def test_the_parameters_file_leaves_the_probe_on() -> None:
    values = json.loads(source("main.parameters.json"))["parameters"]
    assert values.get("deployVerifyProbe", {"value": True})["value"] is True
