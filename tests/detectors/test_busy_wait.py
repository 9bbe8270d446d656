"""busy_wait: U_any high while NCCL spins; W*T equals the injected wait; who was waited for."""

from __future__ import annotations

import re

import pytest

from forensics.base.frames import JobFrames
from forensics.detectors.busy_wait import _Blame, _BusyWait, _words
from forensics.facts.coverage import Coverage
from tests.detectors.partial_inputs import only_ranks, simulate_with_traces_of
from tests.frame_builders import MS, dp_job


def _ranks_in(text: str) -> set[int]:
    """Ranks written as ``3``, ``0-2, 4-7`` (the finding's notation), expanded independently."""
    out: set[int] = set()
    for part in text.split(","):
        lo, _, hi = part.strip().partition("-")
        out |= set(range(int(lo), int(hi or lo) + 1))
    return out


def _culprits_in_text(f) -> set[int]:
    m = re.search(r"mostly for rank\(s\) ([\d, -]+) \(", f.summary)
    return _ranks_in(m.group(1)) if m else set()


def test_triggers_on_victims_of_a_late_rank_and_names_it(run_detector):
    frames, truth = dp_job(n_ranks=8, steps=5, compute_ns=20 * MS, tx_ns=2 * MS, host_delay={3: 10 * MS})
    found, _ = run_detector(frames)
    (f,) = found
    # Culprits, not victims: the rank waited for is named; the 7 that waited are evidence and metrics.
    assert f.ranks == (3,) and f.hosts == ("node0",)
    assert f.gpus == ()  # no NCCL logs, no bus ids: nothing to name
    assert f.metrics["waited_for"] == "3"
    assert {e["rank"] for e in f.evidence if e["role"] == "victim"} == {0, 1, 2, 4, 5, 6, 7}
    assert _ranks_in(str(f.metrics["ranks_waiting"])) == {0, 1, 2, 4, 5, 6, 7}
    # The text names the same culprit as the evidence.
    assert _culprits_in_text(f) == {e["rank"] for e in f.evidence if e["role"] == "culprit"} == {3}
    assert "finding" not in f.summary + f.remediation  # points at no other finding
    # Builder truth: victims wait 10 ms of a 32.1 ms step (20 compute + 10 wait + 2 transfer + 0.1 gap).
    w_true = truth.wait[(0, 2)] / truth.step_ns[(0, 2)]
    assert f.metrics["wait_fraction"] == pytest.approx(w_true, rel=0.02)
    assert f.metrics["U_any"] == pytest.approx(32.0 / 32.1, abs=1e-3)
    assert f.metrics["U_compute"] == pytest.approx(20.0 / 32.1, abs=1e-3)
    # Spinning NCCL kernels hold 16 of 132 SMs: U_SM = (20 + 12 * 16/132) / 32.1
    assert f.metrics["U_SM"] == pytest.approx((20 + 12 * 16 / 132) / 32.1, abs=1e-3)
    assert all(e["waited_for"] == 3 for e in f.evidence if e["role"] == "victim")
    assert f.confidence == "high" and f.metrics["ranks_without_data"] == ""


def test_two_late_ranks_are_both_named_and_only_them(run_detector):
    frames, _ = dp_job(n_ranks=8, steps=6, compute_ns=20 * MS, tx_ns=2 * MS, noise=0.01,
                       host_delay={2: 12 * MS, 6: 12 * MS}, seed=1)
    (f,) = run_detector(frames)[0]
    # Both stall by the same amount: whichever is later arrives last; each carries a share of the wait.
    assert set(f.ranks) == {2, 6} == _culprits_in_text(f)
    assert {e["rank"] for e in f.evidence if e["role"] == "culprit"} == {2, 6}


def test_clean_without_late_ranks(run_detector):
    frames, _ = dp_job(n_ranks=8, steps=5, noise=0.02)
    assert run_detector(frames) == ([], [])


def test_clean_when_the_wait_is_hidden_under_compute(run_detector):
    frames, _ = dp_job(n_ranks=8, steps=5, overlap=True, host_delay={3: 3 * MS})
    assert run_detector(frames) == ([], [])


def test_clean_with_half_the_traces_of_a_clean_job(run_detector):
    frames, _ = dp_job(n_ranks=8, steps=5, noise=0.02)
    assert run_detector(only_ranks(frames, {0, 1, 2, 3})) == ([], [])


def test_skipped_without_nccl_kernels(run_detector):
    frames, _ = dp_job(n_ranks=2, steps=2)
    compute_only = JobFrames({"kernels": frames["kernels"].filter(frames["kernels"]["class"] == "compute"),
                              "steps": frames["steps"]})
    _, skipped = run_detector(compute_only)
    assert [s.detector for s in skipped] == ["busy_wait"] and "no NCCL" in skipped[0].reason


def _with_sm_active(frames, pct_by_rank: dict[int, float], every_ns: int = MS):
    """The same job plus Nsight Systems GPU metrics: constant SM Active per rank over the whole run."""
    import polars as pl

    from forensics.base.frames import conform

    steps = frames["steps"]
    lo, hi = int(steps["start_ns"].min()) - every_ns, int(steps["end_ns"].max()) + 2 * every_ns
    rows = [dict(rank=r, host=f"node{r // 8}", source=f"r{r}.sqlite", device=r % 8, timestamp_ns=t, sm_active=pct)
            for r, pct in pct_by_rank.items() for t in range(lo, hi, every_ns)]
    gm = conform("gpu_metrics", pl.DataFrame(rows))
    return JobFrames({**{name: frames[name] for name in frames.present}, "gpu_metrics": gm})


def test_triggers_with_measured_sm_active_and_says_so(run_detector):
    frames, _ = dp_job(n_ranks=8, steps=5, compute_ns=20 * MS, tx_ns=2 * MS, host_delay={3: 10 * MS})
    found, _ = run_detector(_with_sm_active(frames, {r: 37.0 for r in range(8)}))
    (f,) = found
    assert f.metrics["U_SM_source"] == "sm_active"
    assert f.metrics["U_SM"] == pytest.approx(0.37)
    assert "measured SM Active 37%" in f.summary
    assert all(e["U_SM_source"] == "sm_active" for e in f.evidence if e["role"] == "victim")


def test_triggers_without_gpu_metrics_uses_the_blocks_estimate(run_detector):
    frames, _ = dp_job(n_ranks=8, steps=5, compute_ns=20 * MS, tx_ns=2 * MS, host_delay={3: 10 * MS})
    (f,) = run_detector(frames)[0]
    assert f.metrics["U_SM_source"] == "blocks_estimate"
    assert "SM-weighted estimate" in f.summary


HANG = dict(ranks=4, steps=2, params={"rank": "2"})  # collective_timeout: rank 2 never reaches an all-reduce


def test_triggers_on_a_hang_and_names_the_rank_that_never_arrived(run_detector, tmp_path):
    """The simulator's collective_timeout: rank 2 never launches the hung all-reduce, the others spin in it
    until the watchdog. Their wait is for rank 2 although no matched instance has rank 2 arriving last."""
    truth, frames = simulate_with_traces_of(tmp_path, "collective_timeout", {0, 1, 2, 3}, **HANG)
    (fault,) = truth["faults"]
    assert fault["ranks"] == [2]
    found, _ = run_detector(frames)
    (f,) = found
    assert f.ranks == tuple(fault["ranks"]) and list(f.hosts) == fault["hosts"] and list(f.gpus) == fault["gpus"]
    # Every rank has data, but the trace holds one step (the hung one): medium, not high.
    assert f.severity.value == "critical" and f.metrics["steps"] == 1 and f.confidence == "medium"
    assert {e["rank"] for e in f.evidence if e["role"] == "victim"} == {0, 1, 3}
    assert f.metrics["waited_for"] == "2" and "never reached" in f.summary


def test_a_lone_rank_of_a_multi_rank_job_is_never_critical_and_blames_no_absent_rank(run_detector, tmp_path):
    # The same hang with rank 0's trace only: it spun for the watchdog's timeout, but nothing can be
    # placed on ranks 1-3, which have no data, and one rank cannot split its collectives into wait and
    # transfer.
    _, frames = simulate_with_traces_of(tmp_path, "collective_timeout", {0}, **HANG)
    (f,) = run_detector(frames)[0]
    assert f.severity.value == "info" and f.confidence == "low"
    assert f.ranks == () and f.hosts == () and f.gpus == ()
    assert f.metrics["ranks_without_data"] == "1-3" and f.metrics["ranks_expected"] == 4
    assert [e["ranks"] for e in f.evidence if e["role"] == "no_data"] == ["1-3"]
    assert "Rank(s) 1-3 (3 of 4) have no trace" in f.summary


def test_the_culprit_without_a_trace_is_not_blamed_and_not_critical(run_detector, tmp_path):
    # Every trace but the hung rank's: the others still spin, the wait is for rank 2, which has no data.
    _, frames = simulate_with_traces_of(tmp_path, "collective_timeout", {0, 1, 3}, **HANG)
    (f,) = run_detector(frames)[0]
    assert f.ranks == () and f.severity.value == "warning" and f.confidence == "medium"
    assert f.metrics["waited_for_without_data"] == "2" and f.metrics["ranks_without_data"] == "2"
    assert _culprits_in_text(f) == set()


def _busy(blame, **kw):
    base = dict(victims=(0, 1, 2), u_any=0.95, u_compute=0.5, u_sm=0.55, w=0.3, sm_source="blocks_estimate",
                wait_ns=3e8, blame=blame, cov=Coverage(expected=(0, 1, 2, 3), with_data=(0, 1, 2, 3), steps=4),
                sized=True, transfer_basis=" BASIS.")
    return _BusyWait(**{**base, **kw})


def test_words_are_read_from_the_record_alone():
    late = _Blame(culprits=[3], share=0.8, never=False, absent=[], absent_share=0.0, rows=[])
    title, summary, remedy = _words(_busy(late), min_share=0.2)
    assert title == "GPU utilization inflated by NCCL busy-waiting on 3 rank(s)"
    assert summary.startswith("Rank(s) 0-2 look 95% busy (what nvidia-smi shows), but compute runs only 50% of the "
                              "step (SM-weighted estimate 55%); 30% of the step is NCCL kernels spinning while waiting,"
                              " mostly for rank(s) 3 (80% of the wait), which arrived last")
    assert "rank(s) 3 arrive late" in remedy
    assert " BASIS." not in summary  # sizes known: nothing to say about how transfer was estimated
    # No culprit holds min_share of the wait, U_SM from both sources, sizes unknown.
    spread = _Blame(culprits=[], share=0.0, never=False, absent=[], absent_share=0.1, rows=[])
    _, summary, remedy = _words(_busy(spread, sm_source="mixed", sized=False), min_share=0.2)
    assert "(SM Active or estimate 55%)" in summary and "none of which accounts for 20% of it" in summary
    assert " BASIS." in summary and "none of them dominates" in remedy and "mostly for" not in summary
