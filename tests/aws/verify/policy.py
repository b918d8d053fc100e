"""Does ``infra/aws/verify-policy.json`` allow a request? (Allow statements and ``*`` patterns; no conditions.)"""

from __future__ import annotations

import fnmatch
import inspect
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

POLICY = Path(__file__).resolve().parents[3] / "infra" / "aws" / "verify-policy.json"
#: S3 operations -> the IAM action that allows them (the others are <service>:<Operation>).
S3_ACTIONS = {
    "HeadBucket": "s3:ListBucket",
    "GetPublicAccessBlock": "s3:GetBucketPublicAccessBlock",
    "GetBucketEncryption": "s3:GetEncryptionConfiguration",
    "GetBucketLifecycleConfiguration": "s3:GetLifecycleConfiguration",
    "GetBucketPolicy": "s3:GetBucketPolicy",
}
#: What only a run in an account calls (CloudFormation, Lambda, EventBridge, CloudWatch, IAM), by IAM action.
CLOUD_ACTIONS = (
    "cloudformation:DescribeStacks",
    "cloudformation:ListStackResources",
    "lambda:GetFunctionConfiguration",
    "lambda:GetFunctionConcurrency",
    "lambda:ListEventSourceMappings",
    "lambda:UpdateEventSourceMapping",
    "events:DescribeRule",
    "events:ListTargetsByRule",
    "cloudwatch:DescribeAlarms",
    "cloudwatch:GetMetricData",
    "iam:SimulatePrincipalPolicy",
)


@dataclass(frozen=True, slots=True)
class Call:
    """One request verify itself made: its IAM action and the resource's ARN."""

    action: str
    resource: str


def allowed(call: Call) -> bool:
    """True when an Allow statement names the action and a resource pattern matching the ARN."""
    for statement in json.loads(POLICY.read_text())["Statement"]:
        actions = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
        resources = statement["Resource"] if isinstance(statement["Resource"], list) else [statement["Resource"]]
        if (
            statement["Effect"] == "Allow"
            and call.action in actions
            and any(fnmatch.fnmatchcase(call.resource, pattern) for pattern in resources)
        ):
            return True
    return False


#: What only an emulator run does: the functions run here, the probe endpoint made (and deleted), queues listed.
_LOCAL_FILE = "app/local_functions.py"
_LOCAL_STEPS = {"_local_probe", "delete_probe_queue", "_listed_endpoints"}


def recorder(calls: list[Call]) -> Any:
    """A botocore hook (before-parameter-build) recording the requests verify's own code makes."""

    def record(model: Any, params: dict[str, Any], **_: Any) -> None:
        stack = inspect.stack(0)
        if any(f.filename.replace("\\", "/").endswith(_LOCAL_FILE) or f.function in _LOCAL_STEPS for f in stack):
            return
        service, operation = model.service_model.endpoint_prefix, model.name
        if service == "s3":
            calls.append(Call(S3_ACTIONS.get(operation, f"s3:{operation}"), f"arn:aws:s3:::{params.get('Bucket')}"))
        elif service == "sqs":
            name = str(params.get("QueueUrl") or params.get("QueueName") or "").rsplit("/", 1)[-1]
            action = f"sqs:{operation.removesuffix('Batch')}"  # a batch needs the single action's permission
            calls.append(Call(action, f"arn:aws:sqs:us-east-1:123456789012:{name}"))
        elif service == "dynamodb":
            table = params.get("TableName")
            calls.append(Call(f"dynamodb:{operation}", f"arn:aws:dynamodb:us-east-1:123456789012:table/{table}"))
        else:
            calls.append(Call(f"{service}:{operation}", "*"))

    return record
