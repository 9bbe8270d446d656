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


def test_findings_name_the_process_groups_they_are_about():
    """The culprit's groups (the ones it is voted stuck in), the undecided groups: typed ``process_group``."""
    (f,) = _run(_frames(_blocked({3: {"0": (10, 7), "2": (20, 16)}})))[0]
    assert f.process_group == "0,2" and "process group 0,2" in f.scope
    counters = _blocked({1: {"0": (9, 9), "1": (19, 19)}})
    del counters[1]
    (u,) = _run(_frames(counters))[0]
    assert u.key == "undecided" and u.process_group == "0,1"
