"""The permissions docs/verify.md gives (infra/aws/verify-policy.json, infra/azure/verify-role.json): valid, least
(no action on every resource that has resource-level permissions), and covering what only a run in an account calls
(a run on moto checks the rest: test_verify_local.py)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from tests.aws.verify.policy import CLOUD_ACTIONS, POLICY, Call, allowed

ROOT = Path(__file__).resolve().parents[3]
ADAPTER = ROOT / "shared" / "delayed_delivery" / "aws" / "verify"


def _snake(action: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", action.split(":", 1)[1]).lower()


def test_the_cloud_only_calls_are_allowed_and_made_by_the_adapter() -> None:
    source = "\n".join(p.read_text() for p in ADAPTER.glob("*.py"))
    for action in CLOUD_ACTIONS:
        assert _snake(action) in source, f"{action}: no longer called, remove it from the policy"
        resource = {
            "cloudformation": "arn:aws:cloudformation:eu-west-1:111122223333:stack/DelayedDelivery/abc",
            "events": "arn:aws:events:eu-west-1:111122223333:rule/DelayedDelivery-TimeBucketsEveryMinute-X",
            "iam": "arn:aws:iam::111122223333:role/DelayedDelivery-VerifyProbeEndpointRole-X",
            "lambda": "arn:aws:lambda:eu-west-1:111122223333:event-source-mapping:uuid"
            if action.endswith("EventSourceMapping")
            else "*",
        }.get(action.split(":")[0], "*")
        assert allowed(Call(action, resource)), action


def test_the_policy_refuses_what_verify_never_needs() -> None:
    for call in (
        Call("sqs:SendMessage", "arn:aws:sqs:eu-west-1:111122223333:orders"),
        Call("sqs:ReceiveMessage", "arn:aws:sqs:eu-west-1:111122223333:orders-delay.fifo"),
        Call("sqs:DeleteQueue", "arn:aws:sqs:eu-west-1:111122223333:orders"),
        Call("s3:GetObject", "arn:aws:s3:::my-tier-bucket/delayed-delivery/buckets/x"),
        Call("dynamodb:DeleteTable", "arn:aws:dynamodb:eu-west-1:111122223333:table/delayed-delivery-cancellations"),
        Call("iam:PassRole", "arn:aws:iam::111122223333:role/DelayedDelivery-X"),
    ):
        assert not allowed(call), call
    statements = json.loads(POLICY.read_text())["Statement"]
    assert all(s["Effect"] == "Allow" and "*" not in s["Action"] for s in statements)


def test_the_azure_role_is_a_valid_custom_role_with_data_actions_only_on_storage() -> None:
    role = json.loads((ROOT / "infra" / "azure" / "verify-role.json").read_text())
    assert role["IsCustom"] is True and role["AssignableScopes"]
    actions = role["Actions"] + role["DataActions"]
    assert all(a.startswith("Microsoft.Storage/storageAccounts/") and "*" not in a for a in actions), actions
    assert not any(a.endswith(("/tables/delete", "/containers/delete", "/storageAccounts/delete")) for a in actions)
