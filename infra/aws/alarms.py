"""One way to build the stacks' alarms and the product's own EMF metrics (namespace ``DelayedDelivery``).

Every construct that alarms (the endpoint, the time-bucket tier, the schedule timer) lists its alarms as ``Alert``
values and hands them to ``add_alarms``; every custom metric is ``product_metric(name, service)``, so
``tests/infra/test_metric_names.py`` finds each name and checks that the package emits it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from aws_cdk import Duration
from aws_cdk import aws_cloudwatch as cloudwatch
from constructs import Construct

from infra.aws.functions import METRICS_NAMESPACE

__all__ = ["Alert", "add_alarms", "product_metric"]


def product_metric(
    name: str, service: str, statistic: str = "Sum", period: Duration | None = None
) -> cloudwatch.Metric:
    """One of the functions' own EMF metrics (dimension ``service``), over one minute unless ``period`` says."""
    return cloudwatch.Metric(
        namespace=METRICS_NAMESPACE,
        metric_name=name,
        dimensions_map={"service": service},
        statistic=statistic,
        period=period or Duration.minutes(1),
    )


@dataclass(frozen=True)
class Alert:
    """One alarm: fires when ``metric`` is at or over ``threshold`` (over it, with ``strictly``) ``periods`` times."""

    construct_id: str
    description: str
    metric: cloudwatch.IMetric
    threshold: float = 1
    periods: int = 1
    strictly: bool = False


def add_alarms(
    scope: Construct, alerts: Iterable[Alert], actions: Sequence[cloudwatch.IAlarmAction]
) -> list[cloudwatch.Alarm]:
    """The alarms of ``alerts`` under ``scope``, missing data treated as fine, each with every one of ``actions``."""
    alarms = []
    for alert in alerts:
        alarm = cloudwatch.Alarm(
            scope,
            alert.construct_id,
            alarm_description=alert.description,
            metric=alert.metric,
            threshold=alert.threshold,
            evaluation_periods=alert.periods,
            comparison_operator=(
                cloudwatch.ComparisonOperator.GREATER_THAN_THRESHOLD
                if alert.strictly
                else cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD
            ),
            treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
        )
        for action in actions:
            alarm.add_alarm_action(action)
        alarms.append(alarm)
    return alarms
