"""hang: the Flight Recorder vote over per-group counters, on frames built here (simulated dumps:
test_flight_recorder)."""

from __future__ import annotations

import polars as pl

from forensics.base import frames as fr
from forensics.base.frames import JobFrames
from forensics.detectors import run_detectors
from forensics.facts import hang
from forensics.facts.context import JobContext

# rank -> {group: (last_enqueued, last_completed)}; groups: "0" = all four ranks, "1" = {0, 1}, "2" = {2, 3},
# "9" = a pipeline group {0, 2}
MEMBERS = {"0": [0, 1, 2, 3], "1": [0, 1], "2": [2, 3], "9": [0, 2]}
DESC = {"0": "default_pg", "1": "TENSOR_MODEL_PARALLEL_GROUP", "2": "TENSOR_MODEL_PARALLEL_GROUP",
        "9": "PIPELINE_MODEL_PARALLEL_GROUP"}


def _frames(counters: dict[int, dict[str, tuple[int, int]]],
            watchdog: list[tuple[int, int, int, int]] = ()) -> JobFrames:
    rows = [{"rank": r, "pg_id": i, "pg_name": g, "pg_desc": DESC[g], "pg_ranks": MEMBERS[g], "last_enqueued": e,
             "last_completed": c, "last_started": -1, "origin": "pg_status", "source": f"fr/rank_{r}"}
            for r, groups in counters.items() for i, (g, (e, c)) in enumerate(sorted(groups.items()))]
    dumps = [{"rank": r, "source": f"fr/rank_{r}", "format": "pickle", "version": "2.9", "entries": 0}
             for r in counters]
    out = {"fr_pg_status": fr.conform("fr_pg_status", pl.DataFrame(rows)),
           "fr_dumps": fr.conform("fr_dumps", pl.DataFrame(dumps))}
    if watchdog:
        out["collective_timeouts"] = fr.conform("collective_timeouts", pl.DataFrame(
            [{"rank": r, "pg": pg, "kind": "pg_status", "seq": e + 1, "last_enqueued": e, "last_completed": c}
             for r, pg, e, c in watchdog]))
    return JobFrames(out)


def _run(frames: JobFrames):
    return run_detectors(JobContext(frames), only=["hang_verdict"])


def _blocked(stuck: dict[int, dict[str, tuple[int, int]]]) -> dict[int, dict[str, tuple[int, int]]]:
    """Everyone blocked in the next collective of groups 0-2; the pipeline's stages apart by design."""
    base = {r: {"0": (10, 9), "1" if r < 2 else "2": (20, 19)} for r in range(4)}
    base[0]["9"], base[2]["9"] = (30, 30), (26, 26)
    for r, groups in stuck.items():
        base[r].update(groups)
    return base


def test_triggers_on_a_rank_stuck_on_the_device():
    findings, _ = _run(_frames(_blocked({3: {"0": (10, 7), "2": (20, 16)}})))
    (f,) = findings
    assert f.key == "stuck_device" and f.ranks == (3,) and f.metrics["votes"] == "3:2"
    assert {e["rank"] for e in f.evidence if e["role"] == "victim"} == {0, 1, 2}


def test_triggers_on_a_rank_stuck_on_the_host_with_nothing_pending():
    findings, _ = _run(_frames(_blocked({1: {"0": (9, 9), "1": (19, 19)}})))
    (f,) = findings
    assert f.key == "stuck_host" and f.ranks == (1,) and "nothing of its own pending" in f.summary


def test_triggers_with_the_watchdog_counters_agreeing_or_not():
    stuck = _blocked({1: {"0": (9, 9), "1": (19, 19)}})
    agree = [(r, 0, *stuck[r]["0"]) for r in range(4)] + [(0, 1, 20, 19), (1, 1, 19, 19)]
    (f,) = _run(_frames(stuck, agree))[0]
    assert f.metrics["watchdog_agrees"] is True and "same verdict" in f.summary
    other = [(r, 0, 10, 9) for r in (0, 1, 3)] + [(2, 0, 9, 9), (2, 2, 19, 19), (3, 2, 20, 19)]
    (f,) = _run(_frames(stuck, other))[0]
    assert f.metrics["watchdog_agrees"] is False and f.metrics["watchdog_culprits"] == "2"


def test_the_watchdog_lines_alone_vote_the_same_way():
    lines = pl.DataFrame({"rank": [0, 1, 2, 3, 0, 1], "pg": [0, 0, 0, 0, 1, 1],
                          "last_enqueued": [10, 9, 10, 10, 20, 19],
                          "last_completed": [9, 9, 9, 9, 19, 19], "kind": ["pg_status"] * 6})
    v = hang.vote(hang.counters_from_watchdog(fr.conform("collective_timeouts", lines)))
    assert v.culprit_ranks("host") == [1] and v.culprit_ranks("device") == []


def test_clean_when_everyone_waits_in_the_same_collective_and_the_pipeline_is_merely_behind():
    findings, _ = _run(_frames(_blocked({})))
    assert findings == []


def test_clean_when_a_rank_is_behind_in_one_group_because_it_waits_in_another():
    # rank 2 is behind in the default group, but it has work pending in group 2: a victim, not a culprit
    findings, _ = _run(_frames(_blocked({2: {"0": (9, 9)}})))
    assert findings == []


def test_undecided_when_a_members_dump_is_missing():
    counters = _blocked({1: {"0": (9, 9), "1": (19, 19)}})
    del counters[1]
    findings, _ = _run(_frames(counters))
    (f,) = findings
    assert f.key == "undecided" and f.metrics["missing_ranks"] == "1" and not f.ranks


def test_skipped_without_dumps():
    _, skipped = _run(JobFrames({}))
    assert skipped and "fr_pg_status" in skipped[0].reason


def test_skipped_when_the_dumps_hold_no_counters():
    dumps = fr.conform("fr_dumps", pl.DataFrame([{"rank": 0, "source": "x", "version": "1.0", "entries": 0}]))
    _, skipped = _run(JobFrames({"fr_dumps": dumps}))
    assert skipped and "no per-group counters" in skipped[0].reason


def _entries(rows: list[tuple[int, str, int, str, int, str, str]]) -> tuple[pl.DataFrame, pl.DataFrame]:
    """fr_entries and fr_signatures from (rank, group, collective_seq, op, input elements, dtype, state)."""
    shapes = sorted({(n, dt) for *_, n, dt, _ in rows})
    sigs = fr.conform("fr_signatures", pl.DataFrame([
        {"sig": i, "in_sizes": [[n]], "in_dtypes": [dt], "in_numel": n} for i, (n, dt) in enumerate(shapes)]))
    entries = fr.conform("fr_entries", pl.DataFrame([
        {"rank": r, "source": f"fr/rank_{r}", "pg_name": g, "pg_desc": DESC[g], "record_id": i, "collective_seq": q,
         "op": op, "is_p2p": False, "sig": shapes.index((n, dt)), "state": st}
        for i, (r, g, q, op, n, dt, st) in enumerate(rows)]))
    return entries, sigs


def test_each_mismatch_class_as_fr_trace_names_it():
    agree = [(r, "0", 10, "all_reduce", 64, "BFloat16", "completed") for r in range(3)]
    odd = {"collective_type": (3, "0", 10, "all_gather", 64, "BFloat16", "completed"),
           "size": (3, "0", 10, "all_reduce", 32, "BFloat16", "completed"),
           "dtype": (3, "0", 10, "all_reduce", 64, "Float", "completed"),
           "state": (3, "0", 10, "all_reduce", 64, "BFloat16", "scheduled")}
    for kind, row in odd.items():
        mm = hang.mismatches(*_entries([*agree, row]))
        assert mm.select("kind", "ranks", "seq").rows() == [(kind, [3], 10)], kind
        assert mm["value"][0] != mm["majority"][0]
    assert hang.mismatches(*_entries([*agree, (3, "0", 10, "all_reduce", 64, "BFloat16", "completed")])).height == 0


def test_a_state_mismatch_names_the_rank_that_did_not_complete_even_on_a_tie():
    # two members: one completed the collective, the other's entry is still scheduled
    mm = hang.mismatches(*_entries([(0, "1", 20, "all_reduce", 8, "Float", "completed"),
                                   (1, "1", 20, "all_reduce", 8, "Float", "scheduled")]))
    assert mm.select("kind", "ranks", "value", "majority").rows() == [("state", [1], "scheduled", "completed")]


def test_a_state_mismatch_is_its_own_finding_beside_the_verdict():
    frames = _frames(_blocked({3: {"0": (10, 7), "2": (20, 16)}}))
    entries, sigs = _entries([(r, "0", 8, "all_reduce", 64, "BFloat16", "scheduled" if r == 3 else "completed")
                              for r in range(4)])
    findings, _ = _run(JobFrames({**{n: frames[n] for n in frames.present}, "fr_entries": entries,
                                  "fr_signatures": sigs}))
    by_key = {f.key: f for f in findings}
    assert set(by_key) == {"stuck_device", "mismatch_state"}
    state = by_key["mismatch_state"]
    assert state.ranks == (3,) and state.severity.value == "warning" and "COLLECTIVE_STATE_MISMATCH" in state.summary


def test_the_blocked_collective_names_who_never_joined_it_and_how_long_the_others_waited():
    frames = _frames(_blocked({1: {"0": (9, 9), "1": (19, 19)}}))
    entries, sigs = _entries([(r, "0", 10, "all_reduce", 64, "BFloat16", "scheduled") for r in (0, 2, 3)])
    entries = entries.with_columns(pl.lit(1_000, pl.Int64).alias("created_ns"), pl.lit(600_000_000_000, pl.Int64)
                                   .alias("timeout_ns"))
    verdict = hang.vote(hang.counters_from_dumps(frames["fr_pg_status"]))
    b = hang.blocked_collectives(verdict, entries, 5_000, sigs).filter(pl.col("pg_name") == "0").row(0, named=True)
    assert (b["seq"], b["waiting"], b["never_joined"], b["op"]) == (10, [0, 2, 3], [1], "all_reduce")
    assert b["in_sizes"] == [[64]] and b["waited_ns"] == 4_000


def test_findings_name_the_process_groups_they_are_about():
    """The culprit's groups (the ones it is voted stuck in), the undecided groups: typed ``process_group``."""
    (f,) = _run(_frames(_blocked({3: {"0": (10, 7), "2": (20, 16)}})))[0]
    assert f.process_group == "0,2" and "process group 0,2" in f.scope
    counters = _blocked({1: {"0": (9, 9), "1": (19, 19)}})
    del counters[1]
    (u,) = _run(_frames(counters))[0]
    assert u.key == "undecided" and u.process_group == "0,1"
