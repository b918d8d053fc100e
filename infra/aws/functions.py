"""``powertools_function``: the one way this app defines a Lambda: its own role and log group, the Powertools layer,
X-Ray active, configured by environment, with the deliberate cdk-nag findings acknowledged. ``settings_env``: the
variables a function reads its settings from, named by the package's own rule."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, is_dataclass
from typing import Any

from aws_cdk import Acknowledgment, Duration, RemovalPolicy, Validations
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from constructs import Construct

from delayed_delivery.aws.config import DEFAULT_NAMESPACE, NAMESPACE_ENV, SERVICE_ENV
from delayed_delivery.envsettings import env_name

__all__ = ["METRICS_NAMESPACE", "PowertoolsFunction", "powertools_function", "setting_env", "settings_env"]

#: CloudWatch namespace of the functions' EMF metrics (the one the functions use when none is set).
METRICS_NAMESPACE = DEFAULT_NAMESPACE


def setting_env(owner: type[Any], setting: str) -> str:
    """The variable the functions read ``setting`` of the settings class ``owner`` from (it must be one of its)."""
    if not is_dataclass(owner) or setting not in {f.name for f in fields(owner)}:
        raise ValueError(f"{owner.__name__} has no setting {setting!r}")
    return env_name(setting)


def settings_env(settings: Any, *names: str) -> dict[str, str]:
    """``names`` of a settings object as the environment variables the functions read them from."""
    return {setting_env(type(settings), name): str(getattr(settings, name)) for name in names}


@dataclass(frozen=True, slots=True)
class PowertoolsFunction:
    """A function with the role and log group made for it alone."""

    function: lambda_.Function
    role: iam.Role
    log_group: logs.LogGroup


def _acknowledge(function: lambda_.Function, role: iam.Role) -> None:
    """The findings every function of the app has, acknowledged with their reasons."""
    Validations.of(function).acknowledge(
        Acknowledgment(
            id="AwsSolutions-L1",
            reason="The runtime is pinned (default python3.13) to one the pinned public Powertools layer is "
            "published for; raise the runtime and the layer version together.",
        )
    )
    Validations.of(role).acknowledge(
        Acknowledgment(
            id="AwsSolutions-IAM5[Resource::*]",
            reason="X-Ray PutTraceSegments/PutTelemetryRecords have no resource-level permissions, so "
            "Tracing.ACTIVE needs Resource '*'; every other statement names its own resources.",
        )
    )


def powertools_function(
    scope: Construct,
    construct_id: str,
    *,
    handler: str,
    code: lambda_.Code,
    service: str,
    description: str,
    role_description: str,
    layers: Sequence[lambda_.ILayerVersion] = (),
    runtime: lambda_.Runtime = lambda_.Runtime.PYTHON_3_13,
    timeout: Duration | None = None,
    memory_size: int = 256,
    reserved_concurrent_executions: int | None = None,
    environment: Mapping[str, str] | None = None,
    log_retention: logs.RetentionDays = logs.RetentionDays.ONE_MONTH,
) -> PowertoolsFunction:
    """A traced Powertools function ``construct_id`` in ``scope`` (with ``Logs`` and ``Role`` beside it)."""
    log_group = logs.LogGroup(scope, "Logs", retention=log_retention, removal_policy=RemovalPolicy.DESTROY)
    role = iam.Role(
        scope, "Role", assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"), description=role_description
    )
    role.add_to_policy(
        iam.PolicyStatement(actions=["logs:CreateLogStream", "logs:PutLogEvents"], resources=[log_group.log_group_arn])
    )
    function = lambda_.Function(
        scope,
        construct_id,
        runtime=runtime,
        handler=handler,
        code=code,
        layers=list(layers),
        role=role,
        timeout=timeout or Duration.seconds(30),
        memory_size=memory_size,
        reserved_concurrent_executions=reserved_concurrent_executions,
        tracing=lambda_.Tracing.ACTIVE,
        log_group=log_group,
        description=description,
        environment={
            SERVICE_ENV: service,
            NAMESPACE_ENV: METRICS_NAMESPACE,
            "POWERTOOLS_LOG_LEVEL": "INFO",
            **(environment or {}),
        },
    )
    _acknowledge(function, role)
    return PowertoolsFunction(function, role, log_group)
