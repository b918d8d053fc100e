"""``schedule next`` and ``schedule catch-up``: the interface scripts depend on, and one-line errors (exit 2)."""

from __future__ import annotations

import hashlib

import pytest

from tests.app.cli.conftest import ok_json, one_line_error, run

NEXT = ("schedule", "next")
CATCH_UP = ("schedule", "catch-up")


def test_next_lists_the_first_n_with_ids_jitter_local_times_and_dst_notes() -> None:
    doc = ok_json(
        *NEXT, "30 2 * * *", "--tz", "America/New_York", "--from", "2027-03-13T07:30:00Z", "--count", "3",
        "--id", "sched-42", "--jitter", "120",
    )  # fmt: skip
    assert list(doc) == ["fires"]
    fires = doc["fires"]
    assert [f["nominal"] for f in fires] == ["2027-03-13T07:30:00Z", "2027-03-14T07:30:00Z", "2027-03-15T06:30:00Z"]
    assert [set(f) for f in fires] == [{"nominal", "fire_at", "id", "local", "note"}] * 3
    assert fires[1]["id"] == "sched-42@2027-03-14T07:30:00Z"
    assert fires[1]["local"] == "2027-03-14T03:30:00-04:00"
    assert fires[1]["note"] == "02:30 does not exist on 2027-03-14: shifted to 03:30"
    assert fires[0]["note"] is None and fires[2]["note"] is None
    jitter = int.from_bytes(hashlib.sha256(fires[1]["id"].encode()).digest()[:8], "big") % 121
    assert fires[1]["fire_at"] == f"2027-03-14T07:{30 + jitter // 60:02d}:{jitter % 60:02d}Z"


def test_next_without_an_id_has_null_ids_and_until_bounds_the_list() -> None:
    fires = ok_json(*NEXT, "0 * * * *", "--from", "2027-01-01T00:00:00Z", "--count", "10", "--until",
                    "2027-01-01T03:00:00Z")["fires"]  # fmt: skip
    assert [f["nominal"] for f in fires] == ["2027-01-01T00:00:00Z", "2027-01-01T01:00:00Z", "2027-01-01T02:00:00Z"]
    assert {f["id"] for f in fires} == {None} and all(f["fire_at"] == f["nominal"] for f in fires)


@pytest.mark.parametrize(
    ("dst", "nominals"),
    [
        ("auto", ["2027-11-07T05:30:00Z", "2027-11-08T06:30:00Z"]),
        ("skip/both", ["2027-11-07T05:30:00Z", "2027-11-07T06:30:00Z"]),
        ("clamp/last", ["2027-11-07T06:30:00Z", "2027-11-08T06:30:00Z"]),
        ("kubernetes", ["2027-11-07T05:30:00Z", "2027-11-07T06:30:00Z"]),
        ("vixie", ["2027-11-07T05:30:00Z", "2027-11-08T06:30:00Z"]),
    ],
)
def test_next_takes_auto_gap_fold_and_presets(dst: str, nominals: list[str]) -> None:
    fires = ok_json(*NEXT, "30 1 * * *", "--tz", "America/New_York", "--from", "2027-11-07T00:00:00Z",
                    "--count", "2", "--dst", dst)["fires"]  # fmt: skip
    assert [f["nominal"] for f in fires] == nominals


def test_next_of_a_rate_starts_at_its_anchor_and_day_match_and() -> None:
    fires = ok_json(*NEXT, "rate(90 minutes)", "--from", "2027-01-01T10:00:00Z", "--count", "2")["fires"]
    assert [f["nominal"] for f in fires] == ["2027-01-01T10:00:00Z", "2027-01-01T11:30:00Z"]
    rare = ok_json(*NEXT, "0 0 13 * FRI", "--from", "2027-01-01T00:00:00Z", "--count", "1", "--day-match", "and")
    assert rare["fires"][0]["nominal"] == "2027-08-13T00:00:00Z"


def test_next_prints_a_table_naming_the_tz_database() -> None:
    result = run(*NEXT, "30 2 * * *", "--tz", "America/New_York", "--from", "2027-03-14T00:00:00Z", "--count", "1")
    assert result.exit_code == 0, result.output
    assert "shifted to 03:30" in result.stdout and "IANA 20" in result.stdout and "tzdata wheel" in result.stdout


def test_the_version_names_the_tz_database() -> None:
    result = run("--version")
    assert result.exit_code == 0 and "time zones: IANA 20" in result.stdout


def test_catch_up_json_shape_and_policies() -> None:
    base = (*CATCH_UP, "0 * * * *", "--last-fired", "2027-01-01T00:00:00Z", "--recovered", "2027-01-01T05:00:00Z")
    doc = ok_json(*base, "--policy", "all", "--limit", "2")
    assert list(doc) == ["fire_late", "missed", "next"]
    assert doc["fire_late"] == [{"nominal": "2027-01-01T04:00:00Z"}, {"nominal": "2027-01-01T05:00:00Z"}]
    assert doc["missed"] == [{"nominal": f"2027-01-01T0{h}:00:00Z"} for h in (1, 2, 3)]
    assert doc["next"] == {"nominal": "2027-01-01T06:00:00Z"}
    latest = ok_json(*base, "--policy", "latest", "--window", "2h")
    assert latest["fire_late"] == [{"nominal": "2027-01-01T05:00:00Z"}] and len(latest["missed"]) == 4
    windowed = ok_json(*base, "--policy", "all", "--window", "7200")  # R - t <= 2 h: 03:00, 04:00, 05:00
    assert [f["nominal"][11:13] for f in windowed["fire_late"]] == ["03", "04", "05"]
    skipped = ok_json(*base, "--policy", "skip")
    assert skipped["fire_late"] == [] and len(skipped["missed"]) == 5


def test_catch_up_table() -> None:
    result = run(*CATCH_UP, "*/5 * * * *", "--last-fired", "2027-01-01T00:00:00Z", "--recovered",
                 "2027-01-02T00:00:00Z", "--policy", "latest")  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "fire late" in result.stdout and "missed" in result.stdout and "more" in result.stdout


def _catch_up(last: str, recovered: str) -> tuple[str, ...]:
    return (*CATCH_UP, "0 * * * *", "--last-fired", f"2027-01-0{last}T00:00:00Z", "--recovered",
            f"2027-01-0{recovered}T00:00:00Z")  # fmt: skip


@pytest.mark.parametrize(
    ("args", "words"),
    [
        ((*NEXT, "0 0 30 2 *", "--from", "2027-01-01T00:00:00Z", "--count", "1"), "never fires"),
        ((*NEXT, "0 0 * * * *", "--from", "2027-01-01T00:00:00Z", "--count", "1"), "6 fields"),
        ((*NEXT, "0 25 * * *", "--from", "2027-01-01T00:00:00Z", "--count", "1"), "out of range"),
        ((*NEXT, "*/0 * * * *", "--from", "2027-01-01T00:00:00Z", "--count", "1"), "step 0"),
        ((*NEXT, "0 9-5 * * *", "--from", "2027-01-01T00:00:00Z", "--count", "1"), "reversed range"),
        ((*NEXT, "0 9 * * *", "--tz", "EST", "--from", "2027-01-01T00:00:00Z", "--count", "1"), "time zone"),
        ((*NEXT, "0 9 * * *", "--tz", "Mars/Base", "--from", "2027-01-01T00:00:00Z", "--count", "1"), "time zone"),
        ((*NEXT, "0 9 * * *", "--from", "2027-01-01T00:00:00", "--count", "1"), "naive"),
        ((*NEXT, "0 9 * * *", "--from", "soon", "--count", "1"), "cannot read --from"),
        ((*NEXT, "0 9 * * *", "--from", "2027-01-01T00:00:00Z", "--count", "0"), "--count"),
        ((*NEXT, "0 9 * * *", "--from", "2027-01-01T00:00:00Z", "--count", "1", "--dst", "sometimes"), "DST policy"),
        ((*NEXT, "0 9 * * *", "--from", "2027-01-01T00:00:00Z", "--count", "1", "--dst", "skip/twice"), "GAP/FOLD"),
        ((*NEXT, "0 9 * * *", "--from", "2027-01-01T00:00:00Z", "--count", "1", "--day-match", "xor"), "day match"),
        ((*NEXT, "0 9 * * *", "--from", "2027-01-01T00:00:00Z", "--count", "1", "--jitter", "5"), "schedule id"),
        ((*NEXT, "0 9 * * *", "--from", "2027-01-01T00:00:00Z", "--count", "1", "--id", "a b"), "schedule id"),
        ((*NEXT, "rate(5 minutes)", "--from", "2027-01-01T00:00:00.5Z", "--count", "1"), "whole second"),
        ((*_catch_up("2", "1"), "--policy", "all"), "before the last fired"),
        ((*_catch_up("1", "2"), "--policy", "some"), "catch-up policy"),
        ((*_catch_up("1", "2"), "--policy", "all", "--window", "forever"), "duration"),
        ((*_catch_up("1", "2"), "--policy", "all", "--limit", "0"), "limit"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args: tuple[str, ...], words: str) -> None:
    one_line_error(run(*args), words)
