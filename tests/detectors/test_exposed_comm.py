"""exposed_comm: transfer not hidden by compute, never waiting; measured against the builder's truth."""

from __future__ import annotations

import statistics

import pytest

from forensics.base.findings import Severity
from forensics.base.frames import JobFrames
from forensics.detectors.exposed_comm import _LONE, _Exposure, _words
from forensics.facts.coverage import Coverage
from tests.frame_builders import MS, dp_job


def test_triggers_on_unoverlapped_dp_allreduce_with_the_true_fraction(run_detector):
    frames, truth = dp_job(n_ranks=8, steps=5, tx_ns=4 * MS, noise=0.01)
    found, _ = run_detector(frames)
    assert [f.metrics["pg_type"] for f in found] == ["DP"]
    f = found[0]
    assert f.ranks == tuple(range(8))
    per_rank = [statistics.median(truth.exposed_tx[(r, s)] / truth.step_ns[(r, s)] for s in range(5)) for r in range(8)]
    assert f.metrics["exposed_fraction"] == pytest.approx(statistics.median(per_rank), abs=0.01)


def test_triggers_with_a_straggler_but_counts_transfer_not_wait(run_detector):
    frames, truth = dp_job(n_ranks=8, steps=5, tx_ns=4 * MS, slow={2: 1.5})
    found, _ = run_detector(frames)
    (f,) = found
    # Exposed = the 4 ms transfer only; the ~10 ms waited for rank 2 is not exposure.
    assert f.metrics["exposed_ms_per_step"] == pytest.approx(4.0, abs=0.01)


def test_clean_when_the_allreduce_overlaps_backward(run_detector):
    frames, _ = dp_job(n_ranks=8, steps=5, tx_ns=4 * MS, overlap=True, noise=0.01)
    assert run_detector(frames) == ([], [])


def test_clean_a_straggler_does_not_make_its_victims_exposed(run_detector):
    # Overlapped job with a late rank: victims' all-reduce ends after their compute, but only because they
    # waited; the last arriver's transfer is hidden, so nothing is exposed.
    frames, _ = dp_job(n_ranks=8, steps=5, tx_ns=4 * MS, overlap=True, slow={5: 1.3}, noise=0.01)
    assert run_detector(frames) == ([], [])


def test_skipped_without_nccl_kernels_or_kernels(run_detector):
    frames, _ = dp_job(n_ranks=2, steps=2)
    compute_only = JobFrames({"kernels": frames["kernels"].filter(frames["kernels"]["class"] == "compute"),
                              "steps": frames["steps"]})
    _, skipped = run_detector(compute_only)
    assert "no NCCL" in skipped[0].reason
    _, skipped = run_detector(JobFrames({}))
    assert "kernels" in skipped[0].reason


def test_a_lone_rank_is_never_critical_and_names_the_ranks_without_data(run_detector, tmp_path):
    from tests.detectors.partial_inputs import simulate_with_traces_of

    # late_rank: rank 5's data loader stalls, the others wait for it in the all-reduce. With every
    # trace the wait is told apart from the transfer and nothing is exposed ...
    _, full = simulate_with_traces_of(tmp_path / "all", "late_rank", set(range(6)), ranks=6, steps=4)
    assert run_detector(full) == ([], [])
    # ... with rank 0's alone, its wait looks like transfer: reported, but never critical nor confident.
    _, lone = simulate_with_traces_of(tmp_path / "one", "late_rank", {0}, ranks=6, steps=4)
    (f,) = run_detector(lone)[0]
    assert f.ranks == (0,)
    assert f.severity.value == "warning" and f.confidence == "low"
    assert f.metrics["ranks_without_data"] == "1-5" and f.metrics["ranks_expected"] == 6
    assert "one rank's trace" in f.summary and "Rank(s) 1-5 (5 of 6) have no trace" in f.summary


def test_the_finding_names_the_one_process_group_its_collectives_ran_in(run_detector):
    frames, _ = dp_job(n_ranks=8, steps=5, tx_ns=4 * MS, noise=0.01)
    (f,) = run_detector(frames)[0]
    assert f.process_group == "1"  # the builder's data-parallel group


def _exposure(**kw):
    base = dict(g="DP", severity=Severity.WARNING, med_x=0.2, med_o=0.1, ranks=(0,), hosts=("n0",), n_steps=4,
                tx_ns_per_step=4e6, exposed_ns_per_step=3e6, wait_ns=3e6, gpu_ns=1.2e7, evidence=(),
                cov=Coverage(expected=tuple(range(6)), with_data=(0,), steps=4), sized=False, unsplit=False,
                transfer_basis=" BASIS.")
    return _Exposure(**{**base, **kw})


def test_words_are_read_from_the_record_alone():
    # A lone rank whose kernels could be split: the transfer is a guess, and the summary says so.
    title, summary, remedy = _words(_exposure())
    assert title == "DP collectives not overlapped with compute: 20.0% of the step"
    assert "3.0 ms of DP kernel time in total was waiting" in summary and " BASIS." in summary
    assert _LONE in summary and summary.endswith("(5 of 6) have no trace and are neither judged nor blamed.")
    assert "bucket_cap_mb" in remedy
    # Not split at all: the summary counts wait and transfer together, and the lone-rank caveat (about an
    # estimated transfer) would contradict it.
    _, summary, _ = _words(_exposure(unsplit=True))
    assert "cannot be split into waiting for peers and transfer" in summary and _LONE not in summary
    # Sizes known: no word on how the transfer was estimated; TP/EP/CP is exposed by design.
    title, summary, remedy = _words(_exposure(g="TP/EP/CP", sized=True, cov=Coverage((0, 1), (0, 1), 4)))
    assert title.startswith("TP/EP/CP collectives exposed by design") and " BASIS." not in summary
    assert "tp-comm-overlap" in remedy and "no trace" not in summary
