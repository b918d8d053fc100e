"""Crash injection on the S3 time-bucket tier against moto server: nothing lost, nothing early, duplicates counted."""

from __future__ import annotations

import json
from dataclasses import asdict, replace
from pathlib import Path
from unittest import mock

import pytest

from tests.reliability import bucketlab
from tests.reliability.bucketlab import (
    BIG_BODY,
    BURST,
    BURST_STEPS,
    EPISODES,
    PIECE_BYTES,
    POINTS,
    REPEATING_POINTS,
    BucketLab,
    Faults,
    LabResult,
    _merge_files,
    merged,
    piece_messages,
    soak,
    sound,
    table,
)

pytestmark = pytest.mark.moto


@pytest.mark.timeout(1800)
def test_the_tier_dying_at_every_step_loses_nothing_and_repeats_at_most_one_piece(moto_endpoint: str) -> None:
    # one shuffled cycle over the 30 points (15 steps, before and after the request): twelve of them on the burst path,
    # where bursts are planned and sent in pieces by dispatch workers that stop at their deadline and go on; and the
    # 8 faults that are not crashes (#31): refused (AccessDenied, KMS) and throttled (503) destinations, a release cap
    # under a burst, an operator's cancel and reschedule racing the workers, a plan expired half sent, a worker killed
    # deep in a big partition whose restart must read again more than one invocation can
    # (timeout: wall seconds before it stops injecting; at load 22 the 38 took 688 s, so 600 stopped it at 21 crashes)
    result = soak(moto_endpoint, crashes=len(POINTS) + len(EPISODES), seed=7, window=30, timeout=1500)
    assert result.injected_crashes == len(POINTS), result
    assert set(result.crashes_by_point) == set(POINTS), result.crashes_by_point
    assert result.faults == len(EPISODES) and set(result.faults_by_kind) == set(EPISODES), result.faults_by_kind
    assert result.certain_cancels_delivered == 0 and result.cancels_certain + result.cancels_uncertain >= 1
    assert result.held_written >= 1, "the capped burst was held, then released"
    _restarted_in_pieces(result)
    assert result.burst_crashes == 2 * len(BURST_STEPS)
    assert result.lost == 0, result.leftovers
    # every message arrived but those an operator cancelled (a cancel answered not certain may still arrive)
    cancelled = result.cancels_certain + result.cancels_uncertain
    assert result.messages - cancelled <= result.delivered <= result.messages and result.messages >= 2 * BURST
    assert result.early == 0
    assert result.error_queue == 0
    assert result.worker_continuations >= 1 and result.worker_runs > result.worker_continuations
    assert "no_crash" not in result.duplicates_by_point, result.duplicates_by_point
    assert sum(result.duplicates_by_point.values()) >= result.duplicates
    # a crash repeats at most what its process had in hand: the piece it had sent and not recorded (16 KiB of lines:
    # 15 burst lines, and any short regular lines before them), or a bucket the timer sends itself
    assert len(result.crash_in_hand) == len(result.per_crash) == len(POINTS) + 1  # the big-piece kill is a crash too
    assert result.crashes_over_hand == 0, list(
        zip(result.per_crash, result.crash_in_hand, result.crash_points, strict=True)
    )
    assert not result.stalls, result.stalls
    assert result.piece_messages == piece_messages() < PIECE_BYTES // 1_000


def _restarted_in_pieces(result: LabResult) -> None:
    """The big-piece restart (#31): reading again the lines before the killed partition's progress took several
    invocations, each of which got further, and the partition finished."""
    figures = f"{result.restart_runs} runs, {result.restart_cut_rereading} cut while reading again"
    assert result.faults_by_kind.get("restart_big_piece") == 1, result.faults_by_kind
    assert result.restart_cut_rereading >= 2 and result.restart_runs > result.restart_cut_rereading, figures
    assert result.restart_stalled == 0 and result.restarts_finished == 1, figures


def test_a_worker_killed_deep_in_a_big_partition_restarts_under_its_deadline(moto_endpoint: str) -> None:
    # #31, "a restart that cannot finish": one invocation sends KILL_AFTER pieces of a partition of big bodies and dies
    # sending the next, before recording it; reading again what it sent costs the next workers more than one
    # invocation, so they keep where they got to (seen snapshots) and each gets further until the partition is done
    result = soak(moto_endpoint, crashes=1, seed=11, window=20, timeout=600, first=["restart_big_piece"])
    _restarted_in_pieces(result)
    assert result.lines_reread >= 1 and result.injected_crashes == 0
    assert result.lost == 0 and result.early == 0 and result.error_queue == 0, result.leftovers
    assert "no_crash" not in result.duplicates_by_point, result.duplicates_by_point
    # the kill repeats at most the piece it had sent (fewer big bodies than the lab's bound of one piece)
    assert result.per_crash == [result.duplicates] and result.duplicates <= PIECE_BYTES // BIG_BODY + 1, result


def test_a_restart_that_replaces_a_snapshot_past_its_progress_gets_further(moto_endpoint: str) -> None:
    # the second kill dies at the partition's last record, after its done snapshot was written: the restarted worker
    # rightly ignores that snapshot (past its progress) and writes its own behind it. The lab judged that invocation
    # "without progress" (the snapshot's place went back); it counts where the next worker restores to (before: 1)
    first = ["restart_big_piece", "before_worker_send", "restart_big_piece"]
    result = soak(moto_endpoint, crashes=3, seed=1, window=20, timeout=600, first=first)
    figures = f"{result.restart_runs} runs, {result.restart_stalled} without progress"
    assert result.faults_by_kind.get("restart_big_piece") == 2 and result.restart_runs >= 2, figures
    assert result.restart_stalled == 0, figures
    assert result.lost == 0 and result.crashes_over_hand == 0, result


def test_a_plan_expired_after_a_restart_caught_up_repeats_nothing_and_stalls_nothing(moto_endpoint: str) -> None:
    # the lab now expires a plan once the killed partition's workers caught up with its progress (a whole snapshot
    # there). Before the worker read earlier plans' seen objects only until it kept a snapshot of its own, every
    # invocation of the new plan read them all again; at one deadline step an object that filled invocation after
    # invocation and none got further (seed 1 looped until its timeout)
    first = ["restart_big_piece", "plan_expiry", "restart_big_piece"]
    result = soak(moto_endpoint, crashes=3, seed=1, window=20, timeout=600, first=first)
    figures = f"{result.restart_runs} runs, {result.restart_stalled} without progress, {result.inherited} inherited"
    assert result.faults_by_kind.get("plan_expiry") == 1 and result.inherited > 0, figures
    assert result.restart_stalled == 0, figures
    assert result.lost == 0 and result.crashes_over_hand == 0, result


def test_the_lab_sees_an_early_dispatch_and_a_repeat(moto_endpoint: str) -> None:
    lab = BucketLab(moto_endpoint, seed=1)
    now_ms = int(lab.clock.now().timestamp() * 1000)
    lab.due_ms.update({"a": now_ms + 5_000, "b": now_ms + 5_000})
    lab.send_mark.update({"a": 0, "b": 0})
    request = {"Entries": [{"Id": "0", "MessageBody": "a", "DelaySeconds": 4}, {"Id": "1", "MessageBody": "b"}]}
    lab.dispatched(request, {"Successful": [{"Id": "0"}]})  # "b" was refused: not a dispatch
    assert lab.result.early == 1 and lab.sent_ok["b"] == 0
    lab.crash_log.append(REPEATING_POINTS[0])
    lab.dispatched(request, {"Successful": [{"Id": "0"}]})
    assert lab.result.duplicates_by_point == {REPEATING_POINTS[0]: 1}


def test_a_repeat_is_put_down_to_the_death_of_the_process_that_sent_it(moto_endpoint: str) -> None:
    lab = BucketLab(moto_endpoint, seed=1)
    now_ms = int(lab.clock.now().timestamp() * 1000)
    lab.due_ms["a"], lab.send_mark["a"] = now_ms, 0
    request = {"Entries": [{"Id": "0", "MessageBody": "a"}]}
    lab.dispatched(request, {"Successful": [{"Id": "0"}]})
    lab.crash_log += ["after_worker_send", "before_ingest_write"]  # the sender died, then an unrelated crash
    lab.dispatched(request, {"Successful": [{"Id": "0"}]})
    assert lab.result.duplicates_by_crash == {0: 1}
    assert lab.result.duplicates_by_point == {"after_worker_send": 1}
    lab.dispatched(request, {"Successful": [{"Id": "0"}]})  # again, with no crash since: a bug the lab names
    assert lab.result.duplicates_by_point["no_crash"] == 1


def test_an_armed_point_of_the_burst_path_brings_a_burst(moto_endpoint: str) -> None:
    lab = BucketLab(moto_endpoint, seed=1)
    lab.faults = Faults("after_worker_enqueue", 0)
    lab.send_round()  # the first round: no burst due by the rounds, but the armed point needs one
    assert lab.result.bursts == 1 and lab.bursts_pending() == 1
    lab.faults = Faults("after_ingest_write", 0)
    lab.send_round()
    assert lab.result.bursts == 1


def test_soaks_side_by_side_merge_into_one_result() -> None:
    one = LabResult(1, injected_crashes=2, lost=0, duplicates=15, per_crash=[0, 15], duplicates_by_crash={1: 15})
    two = LabResult(2, injected_crashes=3, duplicates=9, per_crash=[9, 0, 0], duplicates_by_crash={0: 9, -1: 1})
    both = merged([one, two])
    assert both.injected_crashes == 5 and both.duplicates == 24
    assert both.per_crash == [0, 15, 9, 0, 0]
    assert both.duplicates_by_crash == {1: 15, 2: 9, -1: 1}
    assert (both.duplicates_per_crash_median, both.duplicates_per_crash_max, both.crashes_with_duplicates) == (0, 15, 2)
    assert both.duplicates_per_crash_median_when_any == 12


def test_a_merged_result_names_the_point_and_seed_of_its_worst_crashes(tmp_path: Path) -> None:
    # each crash's point is kept beside its duplicates, so a crash over the bound can be reproduced (seed, index);
    # a JSON written before points were kept merges with them unknown
    old = LabResult(61, injected_crashes=2, per_crash=[16, 0], duplicates_by_crash={0: 16})
    new = LabResult(71, injected_crashes=3, per_crash=[0, 15, 3], duplicates_by_crash={1: 15, 2: 3},
                    crash_points=["before_plan_write", "after_worker_seen", "restart_big_piece"],
                    crash_ticks=[5, 9, 40])  # fmt: skip
    new.fault_log.append({"kind": "plan_expiry", "tick": 7, "after_crashes": 1})
    both = merged([old, new])
    assert both.crash_points == ["unknown", "unknown", "before_plan_write", "after_worker_seen", "restart_big_piece"]
    assert [(c["seed"], c["crash"], c["point"], c["tick"], c["duplicates"]) for c in both.worst_crashes] == [
        (61, 0, "unknown", -1, 16),
        (71, 1, "after_worker_seen", 9, 15),
        (71, 2, "restart_big_piece", 40, 3),
    ]
    assert both.fault_log == [{"seed": 71, "kind": "plan_expiry", "tick": 7, "after_crashes": 1}]
    assert merged([new]).worst_crashes[0]["point"] == "after_worker_seen"
    # --merge of a JSON without the new fields (as the soaks before wrote) and one with them
    old_json = {k: v for k, v in asdict(old).items() if k not in ("crash_points", "crash_ticks", "fault_log",
                                                                  "worst_crashes")}  # fmt: skip
    (tmp_path / "old.json").write_text(json.dumps({"crashes_asked": 2, "seeds": [61], "runs": [old_json]}))
    (tmp_path / "new.json").write_text(json.dumps({"crashes_asked": 3, "seeds": [71], "runs": [asdict(new)]}))
    out = tmp_path / "both.json"
    with pytest.raises(SystemExit):  # 16 is over the bound of one piece: not sound
        _merge_files([tmp_path / "old.json", tmp_path / "new.json"], out)
    written = json.loads(out.read_text())
    assert written["worst_crashes"][1] == {"seed": 71, "crash": 1, "point": "after_worker_seen", "tick": 9,
                                           "duplicates": 15, "in_hand": -1}  # fmt: skip


def test_each_crash_is_judged_by_the_messages_it_had_in_hand() -> None:
    # a piece is cut at 16 KiB of lines: 15 burst lines and a short regular one are 16 messages in hand, so 16 repeats
    # are within it; 17 with 16 in hand is not. A crash recorded before (-1) is judged by the old fixed bound (15)
    run = LabResult(71, injected_crashes=4, per_crash=[16, 0, 17, 15], duplicates_by_crash={0: 16, 2: 17, 3: 15},
                    crash_points=["after_worker_seen", "before_ingest_write", "before_worker_seen", "unknown"],
                    crash_ticks=[3, 4, 5, 6], crash_in_hand=[16, 0, 16, -1])  # fmt: skip
    result = merged([run])
    assert (result.crashes_over_hand, result.crashes_over_fixed_bound) == (1, 2)
    assert result.worst_crashes[0] == {"seed": 71, "crash": 2, "point": "before_worker_seen", "tick": 5,
                                       "duplicates": 17, "in_hand": 16}  # fmt: skip
    assert not sound(result, 0)
    assert sound(merged([replace(run, per_crash=[16, 0, 16, 15], duplicates_by_crash={0: 16, 2: 16, 3: 15})]), 0)
    assert "| crashes that repeated more than they had in hand" in table(result, 4)


def test_a_stall_is_a_finding_and_the_soak_still_counts_its_losses(moto_endpoint: str) -> None:
    # before, a point not reached in QUIET_TICKS raised LabStalled out of the soak, and the command threw away every
    # job's final figures (seed 71, 2026-11-28: seeds 72-74 ran to their end uncounted). Now the stall is recorded
    # (seed, target, tick, what waited), the next target is armed, and after MAX_STALLS the soak settles and counts
    with mock.patch.object(bucketlab, "QUIET_TICKS", 1):
        result = soak(moto_endpoint, crashes=1_000, seed=3, window=10, timeout=600)
    assert len(result.stalls) == bucketlab.MAX_STALLS, result.stalls
    assert all({"seed", "target", "tick", "unsent", "oldest_unsent"} <= set(s) for s in result.stalls)
    assert result.lost == 0 and result.early == 0 and result.error_queue == 0, result.leftovers
    assert not sound(result, 0)
    assert "(seed 3, tick" in table(result, 1_000)


def test_a_message_an_operator_moves_and_sends_itself_is_seen_by_the_lab(moto_endpoint: str) -> None:
    # a reschedule within SQS's 900 s sends the moved message straight to its queue (Relocator._place). The lab's
    # operator used the plain client, so that send was never seen: the message stayed "unsent", its burst pending for
    # ever, and with two such bursts (seed 71 moved 3) no burst was sent again: "release_cap not reached in 600 ticks"
    lab = BucketLab(moto_endpoint, seed=1)
    lab.send_burst()
    for _ in range(6):  # its ingest records into S3 (up to 10 records a poll)
        lab.ingest_once()
    assert lab.operator("operator_reschedule")
    assert lab.result.reschedules_moved == 1, lab.result
    moved = [m for m in lab.bursts_on_their_way[0] if lab.sent_ok[m]]
    assert len(moved) == 1, moved  # the operator's send, seen (before: none of the burst marked sent)
    assert lab.result.early == 0 and lab.bursts_pending() == 1  # the rest of the burst is still on its way
