"""What importing a piece of the AWS adapter loads: a consumer parsing one message pays for the receive helper only."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

#: The receive helper's budget of ``delayed_delivery`` modules (issue #22: 41 with an eager ``aws/__init__``).
RECEIVE_MODULE_BUDGET = 25


def _loaded_by(statement: str, package: str = "delayed_delivery") -> list[str]:
    """The modules of ``package`` a fresh interpreter holds after running ``statement``."""
    code = (
        "import json, sys\n"
        f"{statement}\n"
        f"print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] == {package!r})))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    loaded: list[str] = json.loads(done.stdout)
    return loaded


def test_the_receive_helper_loads_at_most_25_package_modules() -> None:
    loaded = _loaded_by("import delayed_delivery.aws.receive")
    assert "delayed_delivery.aws.receive" in loaded
    assert len(loaded) <= RECEIVE_MODULE_BUDGET, f"{len(loaded)} modules: {loaded}"
    heavy = [m for m in loaded if m.startswith(("delayed_delivery.aws.requeue", "delayed_delivery.aws.tier"))]
    assert not heavy, f"the receive helper pulls in the requeue step or the tier: {heavy}"
    assert "delayed_delivery.aws.sender" not in loaded
    assert _loaded_by("import delayed_delivery.aws.receive", "aws_lambda_powertools") == []  # the consumer's to load


def test_importing_the_aws_package_loads_none_of_its_modules() -> None:
    loaded = _loaded_by("import delayed_delivery.aws")
    assert [m for m in loaded if m.startswith("delayed_delivery.aws.")] == []


@pytest.mark.parametrize(
    "name",
    [
        "BatchSendResult",
        "DelayedSend",
        "EndpointCheck",
        "EndpointQueues",
        "FifoRequeuer",
        "HopOutcome",
        "RecordResult",
        "SendReceipt",
        "SqsDelayedSender",
        "SqsTransport",
        "check_endpoint",
        "ensure_endpoint",
        "send_delayed",
    ],
)
def test_every_public_aws_name_still_imports(name: str) -> None:
    import delayed_delivery.aws as aws

    assert name in aws.__all__
    assert name in dir(aws)
    value = getattr(aws, name)
    assert getattr(value, "__name__", name) == name


def test_a_wildcard_import_and_an_unknown_name() -> None:
    scope: dict[str, object] = {}
    exec("from delayed_delivery.aws import *", scope)
    import delayed_delivery.aws as aws

    assert set(aws.__all__) <= set(scope)
    with pytest.raises(AttributeError, match="no attribute 'SqsDelayedSenderr'"):
        aws.SqsDelayedSenderr  # noqa: B018


def test_the_command_line_loads_no_azure_storage_sdk_until_an_azure_command_runs() -> None:
    """Every ``delayed-delivery`` process pays for what the CLI imports: the storage SDKs are seconds of it (#26)."""
    started = "import sys; sys.argv = ['delayed-delivery', '--help']\nfrom delayed_delivery.app.cli import app"
    storage = ("azure.storage.", "azure.data.", "azure.functions")  # not the namespaces an extras check finds
    assert [m for m in _loaded_by(started, "azure") if m.startswith(storage)] == []
    assert "delayed_delivery.app.cli.verify_azure" in _loaded_by(started)  # azure verify is registered all the same
    ran = f"{started}\nfrom delayed_delivery.azure.verify import verify_azure"
    assert [m for m in _loaded_by(ran, "azure") if m.startswith(storage)]  # the check above can fail
