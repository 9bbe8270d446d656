"""pipeline_bubble: f_B against (p-1)/(m+p-1), stage imbalance at the right stage, structural bubbles."""

from __future__ import annotations

import json

import polars as pl
import pytest

from forensics.base.findings import Severity
from forensics.detectors import run_detectors
from forensics.detectors.pipeline_bubble import _TEXT, _Bubble, _Pipeline, stage_table, theory
from forensics.facts.context import JobContext
from forensics.pipeline import load
from tests.frame_builders import dp_job, pp_job


def test_measured_bubble_matches_builder_truth_and_theory():
    frames, truth = pp_job(p=4, m=16, steps=2)
    table, p = stage_table(JobContext(frames))
    assert p == 4 and sorted(table["pp_stage"]) == [0, 1, 2, 3]
    for stage, f_b in table.select("pp_stage", "f_b").iter_rows():
        assert f_b == pytest.approx(truth.bubble[(stage, 1)] / truth.step_ns[1], abs=1e-9)
        assert f_b == pytest.approx(3 / 19, abs=0.02)  # GPipe/1F1B theory with tiny P2P time


def test_triggers_stage_imbalance_naming_the_slow_stage(run_detector):
    frames, _ = pp_job(p=4, m=8, stage_scale={2: 1.3})
    found, _ = run_detector(frames)
    (f,) = found
    assert f.ranks == (2,) and f.metrics["slow_stage"] == 2 and f.metrics["m"] == 8
    assert f.gpu_seconds_lost and f.gpu_seconds_lost > 0


def test_triggers_structural_bubble_for_few_microbatches(run_detector):
    frames, _ = pp_job(p=8, m=4, steps=2)
    found, _ = run_detector(frames)
    assert [f.key for f in found] == ["structural"]
    assert found[0].metrics["f_B_theory"] == pytest.approx(7 / 11, abs=1e-4)
    assert found[0].severity.value == "warning"  # 64% of the step idle by construction


def test_structural_bubble_below_half_the_step_is_info(run_detector):
    frames, _ = pp_job(p=4, m=4, steps=2)  # theory 3/7 = 43%
    found, _ = run_detector(frames)
    structural = [f for f in found if f.key == "structural"]
    assert [f.severity.value for f in structural] == ["info"]


def test_triggers_excess_bubble_when_config_says_more_microbatches(run_detector):
    # The trace has m=4 but the config claims m=32: measured bubble far above theory.
    frames, _ = pp_job(p=4, m=4, steps=2)
    found, _ = run_detector(frames, microbatches="32")
    assert "excess" in [f.key for f in found]


def test_clean_balanced_pipeline(run_detector):
    frames, _ = pp_job(p=4, m=16)
    assert run_detector(frames) == ([], [])


def test_skipped_without_a_pipeline_group(run_detector):
    frames, _ = dp_job(n_ranks=4, steps=2)
    _, skipped = run_detector(frames)
    assert [s.detector for s in skipped] == ["pipeline_bubble"] and "pipeline" in skipped[0].reason


def test_theory_far_above_measured_reports_measured_and_no_by_construction_claim(run_detector):
    # The trace runs m=32 (measured bubble ~3/35 = 9%) but the schedule says m=2 (theory 3/5 = 60%):
    # the theory cannot be backed by the trace, so no "by construction" claim and no structural warning.
    frames, truth = pp_job(p=4, m=32, steps=2)
    measured = sum(truth.bubble[(s, 1)] for s in range(4)) / 4 / truth.step_ns[1]
    assert measured == pytest.approx(3 / 35, abs=0.03)  # GPipe plus the builder's P2P latency
    found, _ = run_detector(frames, microbatches="2")
    assert found, "the disagreement between schedule and trace must be reported"
    for f in found:
        assert "by construction" not in f.title + f.summary
        assert f.severity.value == "info"
        assert f.metrics["schedule_uncertain"] is True
        assert f.metrics["f_B_measured"] == pytest.approx(measured, abs=0.01)
        assert f.fraction_of_step == pytest.approx(measured, abs=0.01)
        assert "uncertain" in f.summary


def test_theory_agreeing_with_measured_is_not_uncertain(run_detector):
    frames, _ = pp_job(p=8, m=4, steps=2)
    (f,) = run_detector(frames)[0]
    assert f.metrics.get("schedule_uncertain", False) is False
    assert "by construction" in f.title


def _sim(tmp_path, scenario):
    import json

    from forensics.pipeline import load
    from forensics.simulate import simulate

    simulate(scenario, tmp_path, seed=0)
    _, frames = load(tmp_path, workers=1)
    return json.loads((tmp_path / "truth.json").read_text()), frames


def test_sim_stage_imbalance_stage2_25pct_names_stage_and_its_ranks(run_detector, tmp_path):
    truth, frames = _sim(tmp_path, "pp_imbalance_stage2")
    (fault,) = truth["faults"]
    assert fault["expected"]["stage"] == 2 and fault["expected"]["factor"] == 1.25
    found, _ = run_detector(frames)
    imb = [f for f in found if f.key.startswith("imbalance")]
    assert len(imb) == 1
    assert imb[0].metrics["slow_stage"] == 2
    assert sorted(imb[0].ranks) == sorted(fault["ranks"]) and fault["ranks"]
    assert "stage 2" in imb[0].title.lower()
    assert all(str(r) in imb[0].summary for r in fault["ranks"])
    assert "by construction" not in " ".join(f.title + f.summary for f in found)


def test_sim_megatron_batched_p2p_schedule_inferred_from_order(tmp_path):
    # Megatron 1F1B, p=4, m=32, one SendRecv kernel per batched exchange: the kernel counts alone give
    # m=17 (35 kernels on stage 0, 69 on stage 1); the order of P2P and compute kernels gives m=32.
    from forensics.detectors.pipeline_bubble import infer_schedule

    truth, frames = _sim(tmp_path, "pp_megatron")
    job = truth["job"]
    assert (job["pp"], job["microbatches"], job["chunks"]) == (4, 32, 1)
    ctx = JobContext(frames)
    assert infer_schedule(ctx) == (32, 1)
    table, p = stage_table(ctx)
    measured = float(table["f_b"].mean())
    assert measured == pytest.approx(truth["expected"]["bubble_fraction_measured"], abs=0.02)
    assert truth["expected"]["bubble_fraction_theory"] == pytest.approx(3 / 35, abs=1e-6)
    found, skipped = run_detectors(ctx, only=["pipeline_bubble", "gpu_idle", "straggler", "busy_wait", "exposed_comm"])
    assert found == [], [f.title for f in found]


def test_schedule_inference_unchanged_for_unbatched_schedules(tmp_path_factory):
    from forensics.detectors.pipeline_bubble import infer_schedule

    for scenario in ("pp_clean", "pp_interleaved", "pp_small_m"):
        truth, frames = _sim(tmp_path_factory.mktemp(scenario), scenario)
        job = truth["job"]
        assert infer_schedule(JobContext(frames)) == (job["microbatches"], job["chunks"]), scenario


@pytest.mark.parametrize("params", [{}, {"stage": "3"}], ids=["stage1", "stage3"])
def test_sim_megatron_coalesced_dp2_slow_stage_named_with_its_ranks(tmp_path, params):
    # Megatron 1F1B, p=4, m=32, DP=2, batch_isend_irecv under PyTorch's coalescing manager: every PP kernel is a
    # SendRecv labelled "coalesced" (no Src/Dst Rank), the steady-state ones carry a send and a receive. One stage
    # computes 35% longer on both of its ranks. Before coalesced SendRecv kernels counted as P2P, m could not be
    # told and the detector skipped.
    from forensics.detectors.pipeline_bubble import infer_schedule
    from forensics.simulate import simulate

    simulate("pp_megatron_imbalance", tmp_path, seed=0, params=params)
    truth = json.loads((tmp_path / "truth.json").read_text())
    job, (fault,) = truth["job"], truth["faults"]
    assert (job["pp"], job["microbatches"], job["chunks"], job["dp"], job["p2p"]) == (4, 32, 1, 2, "coalesced batched")
    assert fault["expected"]["factor"] == 1.35 and len(fault["ranks"]) == 2
    _, frames = load(tmp_path, workers=1)
    ctx = JobContext(frames)
    assert set(ctx.match.kernels.filter(pl.col("pg_type") == "PP")["collective"].unique()) == {"sendrecv"}
    assert infer_schedule(ctx) == (32, 1)
    found, _ = run_detectors(ctx, only=["pipeline_bubble"])
    (imb,) = [f for f in found if f.key.startswith("imbalance")]
    assert imb.metrics["slow_stage"] == fault["expected"]["stage"]
    assert (imb.metrics["p"], imb.metrics["m"], imb.metrics["v"]) == (4, 32, 1)
    assert sorted(imb.ranks) == sorted(fault["ranks"])


def test_sim_interleaved_coalesced_schedule_inferred_and_silent(tmp_path):
    from forensics.detectors.pipeline_bubble import infer_schedule
    from forensics.simulate import simulate

    simulate("pp_interleaved_coalesced", tmp_path, seed=0)
    job = json.loads((tmp_path / "truth.json").read_text())["job"]
    assert (job["pp"], job["microbatches"], job["chunks"], job["dp"]) == (4, 8, 2, 2)
    _, frames = load(tmp_path, workers=1)
    ctx = JobContext(frames)
    assert infer_schedule(ctx) == (8, 2)
    found, _ = run_detectors(ctx, only=["pipeline_bubble", "straggler", "busy_wait", "exposed_comm"])
    assert found == [], [f.title for f in found]


def test_slow_stage_named_even_when_the_schedule_cannot_be_told(tmp_path):
    # The coalesced Megatron job above with the last stage's P2P kernels gone from its traces (so neither the
    # per-transfer counts nor the order on the last stage give m): the theory is not compared, but the stages'
    # compute still is, and the slow stage is named with its ranks; the saving is a lower bound.
    from forensics.base.frames import JobFrames
    from forensics.detectors.pipeline_bubble import infer_schedule
    from forensics.simulate import simulate

    simulate("pp_megatron_imbalance", tmp_path, seed=0)
    (fault,) = json.loads((tmp_path / "truth.json").read_text())["faults"]
    _, frames = load(tmp_path, workers=1)
    last = [6, 7]  # stage 3 of p=4 (DP=2: ranks 2s and 2s+1)
    sendrecv = pl.col("name").cast(pl.String).str.contains("SendRecv")  # names are Categorical
    kernels = frames["kernels"].filter(~(pl.col("rank").is_in(last) & sendrecv))
    cut = JobFrames({**{n: frames[n] for n in frames.present}, "kernels": kernels}, frames.present)
    ctx = JobContext(cut)
    assert infer_schedule(ctx) == (0, 0)
    found, skipped = run_detectors(ctx, only=["pipeline_bubble"])
    assert not skipped
    (imb,) = found
    assert imb.key == f"imbalance-stage{fault['expected']['stage']}" and sorted(imb.ranks) == sorted(fault["ranks"])
    assert imb.metrics["m_source"] == "unknown" and "could not be told" in imb.summary and "at least" in imb.summary


def test_words_are_read_from_the_record_alone():
    table = pl.DataFrame({"pp_stage": [0, 1], "f_b": [0.1, 0.3]})
    pp = _Pipeline(table=table, p=2, m=4, v=1, m_src="config", f_star=0.2, n_ranks=2, n_steps=3, step_ns=1e8,
                   mean_c=5e7, worst={"pp_stage": 1, "ranks": [1], "compute_ns": 6e7}, sigma=0.2,
                   common={"schedule": "1f1b", "f_B_measured": 0.2}, evidence=())
    excess = _Bubble("excess", pp, Severity.WARNING, 0.3, (1, 3), (1, 3), lost_ns=1.0, fraction=0.1, key="excess",
                     confidence="medium", extra={})
    title, summary = _TEXT["excess"](excess)
    assert title == "Pipeline bubble 30% of the step, theory 20%"
    assert summary.startswith("Stage(s) 1, 3 spend 30.0% of the step without compute") and "imbalance 20.0%" in summary
    assert "p=2, m=4 (config), v=1" in summary
    imbalance = _Bubble("imbalance", pp, Severity.WARNING, 0.2, (1,), (1,), lost_ns=1.0, fraction=0.1, key="x",
                        confidence="high", extra={}, saving_ns=1.5e7)
    title, summary = _TEXT["imbalance"](imbalance)
    assert title == "Pipeline stage 1 is 20% slower than the mean stage"
    assert "rank(s) 1) computes 60.0 ms per step against a stage mean of 50.0 ms" in summary
    assert summary.endswith("Balancing would save about 15.0 ms per step.")


@pytest.mark.parametrize(("schedule", "formula"), [("1f1b", "(p-1)/(v*m+p-1)"), ("zb-h1", "(p-1)/(3m+p-1)")])
def test_structural_summary_states_the_formula_of_its_schedule(schedule: str, formula: str):
    """The structural finding quotes the formula its theory was computed with (ZB-H1's is not 1F1B's)."""
    table = pl.DataFrame({"pp_stage": [0, 1], "f_b": [0.2, 0.2]})
    f_star = theory(4, 8, 1, schedule)
    pp = _Pipeline(table=table, p=4, m=8, v=1, m_src="config", f_star=f_star, n_ranks=4, n_steps=3, step_ns=1e8,
                   mean_c=5e7, worst={"pp_stage": 1, "ranks": [1], "compute_ns": 5e7}, sigma=0.0,
                   common={"schedule": schedule, "f_B_measured": f_star}, evidence=())
    b = _Bubble("structural", pp, Severity.INFO, f_star, (0, 1), (0, 1), lost_ns=1.0, fraction=f_star, key="s",
                confidence="high", extra={})
    _, summary = _TEXT["structural"](b)
    assert f"the {schedule} bubble is {formula} = {f_star:.1%} of the step" in summary
