"""busy_wait: U_any high while NCCL spins; W*T equals the injected wait; who was waited for."""

from __future__ import annotations

import pytest

from forensics.context import JobContext
from forensics.detectors import run_detectors
from forensics.frames import JobFrames
from tests.frame_builders import MS, dp_job


def _run(frames):
    return run_detectors(JobContext(frames), only=["busy_wait"])


def test_triggers_on_victims_of_a_late_rank_and_names_it():
    frames, truth = dp_job(n_ranks=8, steps=5, compute_ns=20 * MS, tx_ns=2 * MS, host_delay={3: 10 * MS})
    found, _ = _run(frames)
    (f,) = found
    assert f.ranks == (0, 1, 2, 4, 5, 6, 7)
    assert f.metrics["waited_for"] == "3"
    # Builder truth: victims wait 10 ms of a 32.1 ms step (20 compute + 10 wait + 2 transfer + 0.1 gap).
    w_true = truth.wait[(0, 2)] / truth.step_ns[(0, 2)]
    assert f.metrics["wait_fraction"] == pytest.approx(w_true, rel=0.02)
    assert f.metrics["U_any"] == pytest.approx(32.0 / 32.1, abs=1e-3)
    assert f.metrics["U_compute"] == pytest.approx(20.0 / 32.1, abs=1e-3)
    # Spinning NCCL kernels hold 16 of 132 SMs: U_SM = (20 + 12 * 16/132) / 32.1
    assert f.metrics["U_SM"] == pytest.approx((20 + 12 * 16 / 132) / 32.1, abs=1e-3)
    assert all(e["waited_for"] == 3 for e in f.evidence)


def test_clean_without_late_ranks():
    frames, _ = dp_job(n_ranks=8, steps=5, noise=0.02)
    assert _run(frames) == ([], [])


def test_clean_when_the_wait_is_hidden_under_compute():
    frames, _ = dp_job(n_ranks=8, steps=5, overlap=True, host_delay={3: 3 * MS})
    assert _run(frames) == ([], [])


def test_skipped_without_nccl_kernels():
    frames, _ = dp_job(n_ranks=2, steps=2)
    compute_only = JobFrames({"kernels": frames["kernels"].filter(frames["kernels"]["class"] == "compute"),
                              "steps": frames["steps"]})
    _, skipped = _run(compute_only)
    assert [s.detector for s in skipped] == ["busy_wait"] and "no NCCL" in skipped[0].reason


def _with_sm_active(frames, pct_by_rank: dict[int, float], every_ns: int = MS):
    """The same job plus Nsight Systems GPU metrics: constant SM Active per rank over the whole run."""
    import polars as pl

    from forensics.frames import conform

    steps = frames["steps"]
    lo, hi = int(steps["start_ns"].min()) - every_ns, int(steps["end_ns"].max()) + 2 * every_ns
    rows = [dict(rank=r, host=f"node{r // 8}", source=f"r{r}.sqlite", device=r % 8, timestamp_ns=t, sm_active=pct)
            for r, pct in pct_by_rank.items() for t in range(lo, hi, every_ns)]
    gm = conform("gpu_metrics", pl.DataFrame(rows))
    return JobFrames({**{name: frames[name] for name in frames.present}, "gpu_metrics": gm})


def test_triggers_with_measured_sm_active_and_says_so():
    frames, _ = dp_job(n_ranks=8, steps=5, compute_ns=20 * MS, tx_ns=2 * MS, host_delay={3: 10 * MS})
    found, _ = _run(_with_sm_active(frames, {r: 37.0 for r in range(8)}))
    (f,) = found
    assert f.metrics["U_SM_source"] == "sm_active"
    assert f.metrics["U_SM"] == pytest.approx(0.37)
    assert "measured SM Active 37%" in f.summary
    assert all(e["U_SM_source"] == "sm_active" for e in f.evidence)


def test_triggers_without_gpu_metrics_uses_the_blocks_estimate():
    frames, _ = dp_job(n_ranks=8, steps=5, compute_ns=20 * MS, tx_ns=2 * MS, host_delay={3: 10 * MS})
    (f,) = _run(frames)[0]
    assert f.metrics["U_SM_source"] == "blocks_estimate"
    assert "SM-weighted estimate" in f.summary


def test_triggers_on_a_hang_and_names_the_rank_that_never_arrived(tmp_path):
    """The simulator's collective_timeout: rank 2 never launches the hung all-reduce, the others spin in it
    until the watchdog. Their wait is for rank 2 although no matched instance has rank 2 arriving last."""
    from forensics.analyze import load
    from forensics.simulate import simulate

    truth = simulate("collective_timeout", tmp_path / "run", ranks=4, steps=2, params={"rank": "2"},
                     truth_path=tmp_path / "truth.json")
    (culprit,) = {r for f in truth["faults"] for r in f["ranks"]}
    assert culprit == 2
    _, frames = load(tmp_path / "run", workers=1)
    found, _ = _run(frames)
    (f,) = found
    assert 2 not in f.ranks
    assert f.metrics["waited_for"].split(",")[0] == "2"
