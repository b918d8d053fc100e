"""The routes' results carry what the CLI needs as typed fields: the tier route has the protocol's signatures, the
other routes refuse the tier's reschedule options themselves, ``missing`` and ``warning`` say what the CLI prints."""

from __future__ import annotations

import inspect
from dataclasses import FrozenInstanceError
from datetime import UTC, datetime
from pathlib import Path

import pytest

import delayed_delivery.app.cli.ops as ops
from delayed_delivery.app.routes import (
    AzureTableRoute,
    CancelRequest,
    CancelResult,
    Capability,
    OperatorRoute,
    RecordReceipt,
    RescheduleRequest,
    RescheduleResult,
    SqsOperatorRoute,
    StoreOperatorRoute,
    UsageError,
    check_request,
)
from delayed_delivery.app.routes.buckets import BucketCancelResult, BucketRescheduleResult, BucketTierRoute
from tests.app.cli.conftest import one_line_error, run

DUE = datetime(2031, 1, 1, tzinfo=UTC)
RECEIPT = RecordReceipt("orders", "records", DUE, "note")
TIER_ONLY = "--due, --scan-limit and --keep-record need the time-bucket tier (--cloud aws --bucket-name)"


@pytest.mark.parametrize("method", ["send", "pending", "cancel", "reschedule"])
def test_the_tier_route_has_the_protocol_signature(method: str) -> None:
    def shape(fn: object) -> list[tuple[str, object, object]]:
        params = list(inspect.signature(fn).parameters.values())  # type: ignore[arg-type]
        return [(p.name, p.kind, p.default) for p in params]

    assert shape(getattr(BucketTierRoute, method)) == shape(getattr(OperatorRoute, method))


@pytest.mark.parametrize(
    "option", [{"current_due": DUE}, {"scan_limit": 5}, {"keep_record": True}], ids=["due", "scan", "keep"]
)
def test_a_route_without_the_tier_refuses_its_options_before_anything_else(option: dict[str, object]) -> None:
    route = StoreOperatorRoute(None)  # no URL: the check opens nothing (it would say "give a route")
    with pytest.raises(UsageError) as refused:
        check_request(route, RescheduleRequest("m", DUE, to="orders", **option))  # type: ignore[arg-type]
    assert str(refused.value) == TIER_ONLY


@pytest.mark.parametrize(
    ("route", "request_", "refused"),
    [
        (StoreOperatorRoute(None), CancelRequest("m", to="orders"), "--to and --due are for --cloud aws"),
        (StoreOperatorRoute(None), CancelRequest("m", due=DUE), "--to and --due are for --cloud aws"),
        (StoreOperatorRoute(None), RescheduleRequest("m", DUE, to="orders"), "--to and --due are for --cloud aws"),
        (StoreOperatorRoute(None), CancelRequest("m"), None),
        (StoreOperatorRoute(None), RescheduleRequest("m", DUE), None),
    ],
)
def test_each_route_declares_what_it_takes_and_one_check_refuses_the_rest(
    route: OperatorRoute, request_: CancelRequest | RescheduleRequest, refused: str | None
) -> None:
    if refused is None:
        check_request(route, request_)
        return
    with pytest.raises(UsageError, match=refused):
        check_request(route, request_)


def test_the_capabilities_of_every_route() -> None:
    assert StoreOperatorRoute.capabilities == AzureTableRoute.capabilities == frozenset()
    assert SqsOperatorRoute.capabilities == {Capability.HOP_CYCLE}
    assert BucketTierRoute.capabilities == {Capability.HOP_CYCLE, Capability.TIER_SEARCH}
    tier_request = RescheduleRequest("m", DUE, to="orders", current_due=DUE, scan_limit=3, keep_record=True)
    assert tier_request.needs() == (Capability.TIER_SEARCH, Capability.HOP_CYCLE)
    for sqs_route in (SqsOperatorRoute, BucketTierRoute):
        check_request(sqs_route, CancelRequest("m", to="orders", due=DUE))  # type: ignore[arg-type]
    check_request(BucketTierRoute, tier_request)  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="time-bucket tier"):
        check_request(SqsOperatorRoute, tier_request)  # type: ignore[arg-type]


def test_the_cli_refuses_tier_options_on_a_store_in_one_line(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path / 'd.db'}"
    one_line_error(run("reschedule", "m", "--delay", "1h", "--store", store, "--keep-record"), TIER_ONLY)
    one_line_error(
        run("reschedule", "m", "--delay", "1h", "--store", store, "--due", "2031-01-01T00:00:00Z"), TIER_ONLY
    )
    progress_only = run("reschedule", "m", "--delay", "1h", "--store", store)  # the progress callback is no option
    assert progress_only.exit_code == 2 and "no pending message 'm'" in progress_only.stderr


def test_missing_says_whether_any_such_message_is_pending() -> None:
    assert RescheduleResult("m", "store", DUE, moved=False).missing
    assert not RescheduleResult("m", "store", DUE, moved=True).missing
    assert not RescheduleResult("m", "aws", DUE, moved=False, record=RECEIPT).missing  # moves at its next hop
    gone = BucketRescheduleResult("m", "aws", DUE, moved=False, record=RECEIPT, found=False, tier_only=True)
    maybe_hopping = BucketRescheduleResult("m", "aws", DUE, moved=False, record=RECEIPT, found=False, tier_only=False)
    moved = BucketRescheduleResult("m", "aws", DUE, moved=True, record=RECEIPT, found=True, tier_only=True)
    assert gone.missing and not maybe_hopping.missing and not moved.missing


def test_a_cancel_carries_its_warning_and_only_the_tier_prints_the_key() -> None:
    plain = CancelResult("m", "aws", False, RECEIPT, certain=False)
    tier = BucketCancelResult("m", "aws", False, RECEIPT, False, "late")
    assert plain.warning is None and "warning" not in plain.as_dict()
    assert tier.warning == "late" and tier.as_dict()["warning"] == "late"
    assert BucketCancelResult("m", "aws", False, RECEIPT, True).as_dict()["warning"] is None


def test_the_cli_probes_no_result_for_attributes() -> None:
    source = inspect.getsource(ops)
    assert "getattr(" not in source and "hasattr(" not in source


def test_the_results_are_frozen() -> None:
    with pytest.raises(FrozenInstanceError):
        RescheduleResult("m", "store", DUE, moved=True).moved = False  # type: ignore[misc]
    with pytest.raises(FrozenInstanceError):
        BucketCancelResult("m", "aws", False, RECEIPT).warning = "x"  # type: ignore[misc]
