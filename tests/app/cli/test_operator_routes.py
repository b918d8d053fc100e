"""One operator-route interface: the store, Azure and SQS routes share ``OperatorRoute``'s signatures and results."""

from __future__ import annotations

import inspect
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from delayed_delivery.app.routes import (
    AzureTableRoute,
    CancelRequest,
    CancelResult,
    OperatorRoute,
    PendingReport,
    RescheduleRequest,
    RescheduleResult,
    SendResult,
    SqsOperatorRoute,
    StoreOperatorRoute,
    UsageError,
    check_pending,
    check_request,
    open_route,
)
from delayed_delivery.planning import SqsRoute

ROUTES = [StoreOperatorRoute, AzureTableRoute, SqsOperatorRoute]


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("method", ["send", "pending", "cancel", "reschedule"])
def test_every_route_has_the_protocol_signature(route: type, method: str) -> None:
    def shape(fn: object) -> list[tuple[str, object, object]]:
        params = list(inspect.signature(fn).parameters.values())  # type: ignore[arg-type]
        return [(p.name, p.kind, p.default) for p in params]

    assert shape(getattr(route, method)) == shape(getattr(OperatorRoute, method))
    assert inspect.signature(getattr(route, method)).return_annotation == (
        inspect.signature(getattr(OperatorRoute, method)).return_annotation
    )


def test_the_core_enum_keeps_its_name() -> None:
    assert SqsRoute.FIFO.value == "fifo" and SqsOperatorRoute.__name__ != SqsRoute.__name__


def test_store_route_returns_the_result_dataclasses(tmp_path: Path) -> None:
    route: OperatorRoute = open_route(None, f"sqlite:///{tmp_path / 'r.db'}")
    due = datetime(2031, 1, 1, tzinfo=UTC)
    sent = route.send("orders", b"x", due, headers={"k": "v"}, message_id="m1")
    assert sent == SendResult("m1", "store", "orders", due)
    report = route.pending(86_400)
    assert isinstance(report, PendingReport) and report.pending == 1 and report.next_due == due
    assert report.as_dict() == {
        "pending": 1,
        "next_due": due.isoformat(),
        "oldest_overdue_seconds": 0.0,
        "backlog": [{"bucket": due.isoformat(), "count": 1}],
    }
    later = due + timedelta(days=1)
    assert route.reschedule(RescheduleRequest("m1", later)) == RescheduleResult("m1", "store", later, moved=True)
    assert route.cancel(CancelRequest("m1")) == CancelResult("m1", "store", cancelled=True)
    assert route.cancel(CancelRequest("m1")).as_dict() == {"message_id": "m1", "cancelled": False, "route": "store"}
    with pytest.raises(UsageError, match="--cloud aws"):
        check_request(route, CancelRequest("m1", to="orders"))
    with pytest.raises(UsageError, match="--queue is for --cloud aws"):
        check_pending(route, "orders")


def test_store_route_without_a_url_says_how_to_choose_one() -> None:
    route = StoreOperatorRoute(None)  # nothing is opened until it is used
    with pytest.raises(UsageError, match="give a route"):
        route.pending(3600)
