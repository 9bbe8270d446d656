"""straggler: right rank, right class, victims only in evidence; quiet on clean jobs."""

from __future__ import annotations

import pytest

from forensics.base.findings import Severity
from forensics.base.frames import JobFrames
from forensics.detectors import run_detectors
from forensics.detectors.straggler import _Job, _Straggler, _words
from forensics.facts.context import JobContext
from forensics.facts.coverage import Coverage
from tests.frame_builders import MS, dp_job, pp_job


def _stragglers(frames):
    findings, skipped = run_detectors(JobContext(frames), only=["straggler"])
    return findings, skipped


def test_triggers_on_a_10pct_compute_straggler_among_64_ranks_from_5_steps():
    frames, _ = dp_job(n_ranks=64, steps=5, noise=0.02, slow={37: 1.10}, seed=3)
    found, _ = _stragglers(frames)
    assert [(f.ranks, f.metrics["class"], f.hosts) for f in found] == [((37,), "compute", ("node4",))]
    f = found[0]
    assert f.severity.value in ("warning", "critical")
    # Victims are named in the evidence, never as culprits.
    victims = {e["rank"] for e in f.evidence if e["role"] == "victim"}
    assert victims and 37 not in victims
    assert f.gpu_seconds_lost and f.gpu_seconds_lost > 0


def test_triggers_host_class_for_a_launch_starved_rank():
    frames, truth = dp_job(n_ranks=16, steps=5, noise=0.01, host_delay={12: 4 * MS})
    found, _ = _stragglers(frames)
    assert [(f.ranks, f.metrics["class"]) for f in found] == [((12,), "host")]
    # Each step (after the first, where no earlier kernel marks the GPU idle) the others waited 4 ms on rank 12,
    # minus the compute noise: the saving per step is the lateness over the next-latest rank.
    assert found[0].metrics["saving_per_step_ms"] == pytest.approx(4.0, rel=0.1)


def test_triggers_a_node_finding_when_two_ranks_of_a_node_are_slow():
    frames, _ = dp_job(n_ranks=24, steps=5, noise=0.01, slow={16: 1.2, 19: 1.2})
    found, _ = _stragglers(frames)
    assert len(found) == 1
    assert found[0].ranks == (16, 19) and found[0].hosts == ("node2",) and found[0].metrics["node"] is True


def test_triggers_stage_class_for_a_slow_pipeline_stage():
    frames, _ = pp_job(p=4, m=8, stage_scale={1: 1.3})
    found, _ = _stragglers(frames)
    assert [(f.ranks, f.metrics["class"]) for f in found] == [((1,), "stage")]
    assert found[0].gpu_seconds_lost is None  # counted once, by pipeline_bubble


@pytest.mark.parametrize("seed", range(4))
def test_clean_jobs_have_no_straggler(seed):
    frames, _ = dp_job(n_ranks=32, steps=5, noise=0.03, seed=seed)
    found, skipped = _stragglers(frames)
    assert found == [] and skipped == []


def test_clean_balanced_pipeline_has_no_straggler():
    frames, _ = pp_job(p=4, m=8)
    assert _stragglers(frames) == ([], [])


def test_skipped_without_kernels_or_peers():
    _, skipped = _stragglers(JobFrames({}))
    assert [s.detector for s in skipped] == ["straggler"] and "kernels" in skipped[0].reason
    one, _ = dp_job(n_ranks=1, steps=2)
    _, skipped = _stragglers(one)
    assert "only one rank" in skipped[0].reason


def test_triggers_without_profiler_steps_on_the_whole_trace():
    # Nsight-style capture: kernels and launches, no ProfilerStep ranges; one window per rank.
    frames, _ = dp_job(n_ranks=8, steps=4, noise=0.01, slow={6: 1.2})
    no_steps = JobFrames({k: frames[k] for k in ("kernels", "cpu_ops", "ranks", "process_groups")})
    found, _ = _stragglers(no_steps)
    assert [(f.ranks, f.metrics["class"]) for f in found] == [((6,), "compute")]


def test_clean_a_slow_link_is_not_a_straggler():
    # A slow NIC slows every member of the groups through it together: nobody arrives last because of it
    # (the slow_link detector names the node).
    from tests.frame_builders import link_job

    assert _stragglers(link_job(slow_node=2, factor=3.0)) == ([], [])


def test_with_half_the_traces_the_straggler_is_found_with_less_confidence_and_the_missing_ranks_named():
    from tests.detectors.partial_inputs import only_ranks

    frames, _ = dp_job(n_ranks=16, steps=5, noise=0.01, slow={12: 1.2}, seed=1)
    (full,) = _stragglers(frames)[0]
    assert full.ranks == (12,) and full.confidence == "high" and full.metrics["ranks_without_data"] == ""
    assert "no trace" not in full.summary
    (half,) = _stragglers(only_ranks(frames, set(range(8, 16))))[0]
    assert half.ranks == (12,) and half.metrics["class"] == "compute"
    assert half.confidence == "medium"
    assert (half.metrics["ranks_expected"], half.metrics["ranks_with_data"], half.metrics["ranks_without_data"]) == (
        16, 8, "0-7")
    assert "Rank(s) 0-7 (8 of 16) have no trace" in half.summary
    # Victims are ranks with data only.
    assert {e["rank"] for e in half.evidence if e["role"] == "victim"} <= set(range(8, 16))


def test_a_straggler_on_a_quarter_of_the_traces_has_low_confidence():
    from tests.detectors.partial_inputs import only_ranks

    frames, _ = dp_job(n_ranks=16, steps=5, noise=0.01, slow={12: 1.2}, seed=1)
    found, _ = _stragglers(only_ranks(frames, {10, 11, 12, 13}))
    assert [(f.ranks, f.confidence) for f in found] == [((12,), "low")]


def _straggler(**kw):
    job = _Job(host_of={2: "n1", 3: "n1"}, step_med=1e8, n_steps=5, n_ranks=8,
               cov=Coverage(expected=tuple(range(8)), with_data=tuple(range(8)), steps=5), gpu_of={})
    base = dict(cls="compute", ranks=(2,), host="n1", severity=Severity.WARNING, compute_ns=12e6, peer_compute_ns=10e6,
                host_excess_ns=1e6, rho=0.83, z=9.0, last_share=0.9, p_value=1e-6, arrived_last=7, saving_ns=2e6,
                frac=0.125, gpu_ns=7e7, victims=(0, 1, 4, 5, 6), evidence=(), job=job)
    return _Straggler(**{**base, **kw})


def test_words_are_read_from_the_record_alone():
    title, summary, remedy = _words(_straggler())
    assert title == "Straggler rank 2: slow GPU compute"
    assert summary == ("rank 2 made 5 other rank(s) wait: arrived last at 7 collective(s); compute 12.0 ms vs peers "
                       "10.0 ms per step, host-bound idle 1.0 ms above peers. Removing it would save about 12.5% of "
                       "the step.")
    assert "DCGM" in remedy
    # Two culprits on one host are a node; the class names the label and the remedy.
    title, summary, remedy = _words(_straggler(ranks=(2, 3), cls="host"))
    assert title == "Straggler node n1 (ranks 2, 3): host-bound (GPU starved by the CPU)"
    assert summary.startswith("node n1 (ranks 2, 3) made 5 other rank(s) wait") and "data-loader" in remedy
