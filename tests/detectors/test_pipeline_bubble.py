"""pipeline_bubble: f_B against (p-1)/(m+p-1), stage imbalance at the right stage, structural bubbles."""

from __future__ import annotations

import pytest

from forensics.context import JobContext
from forensics.detectors import run_detectors
from forensics.detectors.pipeline_bubble import stage_table
from tests.frame_builders import dp_job, pp_job


def _run(frames, **overrides):
    return run_detectors(JobContext(frames), only=["pipeline_bubble"], overrides={"pipeline_bubble": overrides} if overrides else None)


def test_measured_bubble_matches_builder_truth_and_theory():
    frames, truth = pp_job(p=4, m=16, steps=2)
    table, p = stage_table(JobContext(frames))
    assert p == 4
    for stage, f_b in table.select("pp_stage", "f_b").iter_rows():
        assert f_b == pytest.approx(truth.bubble[(stage, 1)] / truth.step_ns[1], abs=1e-9)
        assert f_b == pytest.approx(3 / 19, abs=0.02)  # GPipe/1F1B theory with tiny P2P time


def test_triggers_stage_imbalance_naming_the_slow_stage():
    frames, _ = pp_job(p=4, m=8, stage_scale={2: 1.3})
    found, _ = _run(frames)
    (f,) = found
    assert f.ranks == (2,) and f.metrics["slow_stage"] == 2 and f.metrics["m"] == 8
    assert f.gpu_seconds_lost and f.gpu_seconds_lost > 0


def test_triggers_structural_bubble_for_few_microbatches():
    frames, _ = pp_job(p=8, m=4, steps=2)
    found, _ = _run(frames)
    assert [f.key for f in found] == ["structural"]
    assert found[0].metrics["f_B_theory"] == pytest.approx(7 / 11, abs=1e-4)
    assert found[0].severity.value == "warning"  # 64% of the step idle by construction


def test_structural_bubble_below_half_the_step_is_info():
    frames, _ = pp_job(p=4, m=4, steps=2)  # theory 3/7 = 43%
    found, _ = _run(frames)
    structural = [f for f in found if f.key == "structural"]
    assert [f.severity.value for f in structural] == ["info"]


def test_triggers_excess_bubble_when_config_says_more_microbatches():
    # The trace has m=4 but the config claims m=32: measured bubble far above theory.
    frames, _ = pp_job(p=4, m=4, steps=2)
    found, _ = _run(frames, microbatches="32")
    assert "excess" in [f.key for f in found]


def test_clean_balanced_pipeline():
    frames, _ = pp_job(p=4, m=16)
    assert _run(frames) == ([], [])


def test_skipped_without_a_pipeline_group():
    frames, _ = dp_job(n_ranks=4, steps=2)
    _, skipped = _run(frames)
    assert [s.detector for s in skipped] == ["pipeline_bubble"] and "pipeline" in skipped[0].reason
