"""gpu_idle: GPU idle (no kernel on any stream) classified by the CPU-side evidence.

Expectations come from (a) hand-built one-rank jobs whose gaps are laid out by hand, (b) the simulator's
truth.json (input_bound: injected data-loader stall, GPU idle fraction from the engine's own timeline),
(c) the real DLRM 8-rank set, whose idle times were computed by a throwaway script over the raw JSON
(see DLRM_* below), and (d) silence on clean simulator scenarios and every bundled sample.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from forensics.detectors import run_detectors
from forensics.facts.context import JobContext
from forensics.pipeline import load
from tests.frame_builders import MS, US, _Rows

ROOT = Path(__file__).resolve().parents[2]
SHARED = ROOT.parent / "shared" / "sample_data"


def _run(frames, **overrides):
    over = {"gpu_idle": {k: str(v) for k, v in overrides.items()}} if overrides else None
    findings, skipped = run_detectors(JobContext(frames), overrides=over, only=["gpu_idle"])
    assert not skipped, skipped
    return findings


def _one_rank(layout, steps: int = 3, step_ns: int = 10 * MS):
    """One rank; ``layout(rows, t0)`` fills each step [t0, t0 + step_ns)."""
    rows = _Rows()
    for s in range(steps):
        t0 = 1_000 * MS + s * step_ns
        rows.steps.append(dict(rank=0, host="node0", source="r0.json", step=s, start_ns=t0, end_ns=t0 + step_ns))
        layout(rows, t0)
    return rows.frames(1, [])


def _op(rows, name: str, start: int, end: int, category: str = "cpu_op") -> None:
    rows.ops.append(dict(rank=0, host="node0", source="r0.json", category=category, name=name, start_ns=start,
                         end_ns=end, is_launch=False))


def test_triggers_sync_bound_gap_after_a_synchronization():
    # GPU busy 0-6 ms; the host blocks in cudaStreamSynchronize 2 ms .. 6.01 ms, then does 3 ms of Python
    # before the next launch: the GPU idles 6-9 ms = 30% of every step.
    def layout(rows, t0):
        rows.kernel(0, t0, t0 + 6 * MS, "compute", launch=t0)
        _op(rows, "cudaStreamSynchronize", t0 + 2 * MS, t0 + 6 * MS + 10 * US, "cuda_runtime")
        rows.kernel(0, t0 + 9 * MS, t0 + 10 * MS, "compute", launch=t0 + 9 * MS - 5 * US)

    (f,) = _run(_one_rank(layout))
    assert f.metrics["class"] == "sync"
    assert f.ranks == (0,)
    assert f.metrics["idle_share"] == pytest.approx(0.3, abs=1e-6)
    assert f.gpu_seconds_lost == pytest.approx(3 * 3e-3, abs=1e-9)
    assert f.severity.value == "warning"


def test_triggers_input_bound_gap_while_the_host_is_in_the_data_loader():
    # The loader runs 0-4 ms of each step; the first kernel is launched after it: idle 0-4 ms = 40%.
    def layout(rows, t0):
        _op(rows, "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__", t0, t0 + 4 * MS, "user_annotation")
        rows.kernel(0, t0 + 4 * MS + 10 * US, t0 + 10 * MS, "compute", launch=t0 + 4 * MS)

    (f,) = _run(_one_rank(layout))
    assert f.metrics["class"] == "input"
    assert f.metrics["idle_share"] == pytest.approx(0.401, abs=1e-6)
    assert "num_workers" in f.remediation


def test_triggers_pause_one_long_gap():
    # One 6 ms gap (60% of the step) with nothing on the host side that explains it.
    def layout(rows, t0):
        rows.kernel(0, t0, t0 + 4 * MS, "compute", launch=t0)
        rows.kernel(0, t0 + 9_990 * US, t0 + 10 * MS, "compute", launch=t0 + 3 * MS)

    (f,) = _run(_one_rank(layout))
    assert f.metrics["class"] == "pause"
    assert f.metrics["idle_share"] == pytest.approx(0.599, abs=1e-6)
    assert f.severity.value == "warning"  # 0.599 < critical_idle 0.6
    (g,) = _run(_one_rank(layout), critical_idle=0.5)
    assert g.severity.value == "critical"


def test_triggers_launch_bound_many_short_kernels_launched_late():
    # 500 kernels of 5 us, each launched 15 us after the previous one ended: GPU idle 75% of the step,
    # every gap host-bound, median kernel 5 us.
    def layout(rows, t0):
        t = t0
        for _ in range(500):
            rows.kernel(0, t + 15 * US, t + 20 * US, "compute", launch=t + 10 * US)
            t += 20 * US

    (f,) = _run(_one_rank(layout))
    assert f.metrics["class"] == "launch"
    assert f.metrics["idle_share"] == pytest.approx(0.75, abs=1e-6)
    assert "CUDA graphs" in f.remediation


def test_skipped_without_kernels():
    from forensics.base.frames import JobFrames

    findings, skipped = run_detectors(JobContext(JobFrames({})), only=["gpu_idle"])
    assert findings == []
    assert [s.detector for s in skipped] == ["gpu_idle"] and "kernels" in skipped[0].reason


def test_skipped_without_profiler_steps():
    # A capture without steps (e.g. one collective benchmark): one window over the whole trace, mostly idle.
    rows = _Rows()
    rows.kernel(0, 1_000 * MS, 1_001 * MS, "compute")
    rows.kernel(0, 1_100 * MS, 1_101 * MS, "compute")
    findings, skipped = run_detectors(JobContext(rows.frames(1, [])), only=["gpu_idle"])
    assert findings == []
    assert [s.detector for s in skipped] == ["gpu_idle"] and "profiler steps" in skipped[0].reason


def test_below_threshold_is_silent_and_threshold_is_a_setting():
    def layout(rows, t0):  # 8% idle
        rows.kernel(0, t0 + 800 * US, t0 + 10 * MS, "compute", launch=t0 + 790 * US)

    assert _run(_one_rank(layout)) == []
    (f,) = _run(_one_rank(layout), min_idle=0.05)
    assert f.severity.value == "info"


# --- simulator --------------------------------------------------------------------------------------

CLEAN = ["ddp_clean", "fsdp_clean", "pp_clean", "pp_interleaved", "pp_megatron", "old_nccl"]


def _simulate(tmp_path_factory, scenario: str, **kw):
    from forensics.simulate import simulate

    out = tmp_path_factory.mktemp(scenario)
    simulate(scenario, out, seed=0, **kw)
    _, frames = load(out, workers=1)
    return json.loads((out / "truth.json").read_text()), frames


@pytest.mark.parametrize("scenario", CLEAN)
def test_clean_scenarios_are_silent(tmp_path_factory, scenario):
    _, frames = _simulate(tmp_path_factory, scenario)
    assert _run(frames) == []


def test_input_bound_scenario_against_truth(tmp_path_factory):
    truth, frames = _simulate(tmp_path_factory, "input_bound")
    (fault,) = truth["faults"]
    (f,) = _run(frames)
    assert f.metrics["class"] == "input"
    assert sorted(f.ranks) == sorted(fault["ranks"])
    assert sorted(f.hosts) == sorted(set(fault["hosts"]))
    assert sorted(f.gpus) == sorted(set(fault["gpus"]))
    assert f.metrics["idle_share"] == pytest.approx(fault["expected"]["gpu_idle_fraction_median"], abs=0.01)
    assert 0.35 <= f.metrics["idle_share"] <= 0.45
    assert f.metrics["class_share_of_idle"] >= 0.9


def test_bundled_samples_are_silent():
    samples = sorted(p for p in (ROOT / "sample_traces").iterdir() if p.is_dir())
    assert samples
    for s in samples:
        _, frames = load(s, workers=1)
        assert [f.title for f in _run(frames)] == [], s.name


# --- real DLRM 8-rank set ---------------------------------------------------------------------------
# Computed independently with json over the raw worker*.pt.trace.json.gz (tests/gpu_steps_reference.py):
# window = ProfilerStep#10 on the GPU timeline, from its CPU start (or, on ranks 1 and 3, the end of GPU
# work launched before it, 1.3 and 0.6 ms later) to max(its end, end of the GPU work launched in it);
# idle = window minus the union of kernel, memcpy and memset events (all streams). Median kernel duration
# 3 us on every rank. The job is host bound: kernels are tiny and the host launches each one after the
# GPU ran dry.
DLRM_WINDOW_US = [14455, 18584, 13017, 18711, 17979, 17797, 13091, 12509]
DLRM_IDLE_US = [7865, 6459, 8713, 8179, 10277, 10526, 8732, 9850]


def test_dlrm_real_is_launch_bound():
    run_dir = SHARED / "kineto" / "param_dlrm_8rank"
    assert run_dir.is_dir(), f"shared sample data missing: {run_dir} (../shared/sample_data is required)"
    _, frames = load(run_dir, workers=1)
    (f,) = _run(frames)
    assert f.metrics["class"] == "launch"
    assert f.ranks == tuple(range(8))
    shares = sorted(i / w for i, w in zip(DLRM_IDLE_US, DLRM_WINDOW_US))
    assert f.metrics["idle_share"] == pytest.approx((shares[3] + shares[4]) / 2, abs=1e-4)
    assert f.gpu_seconds_lost == pytest.approx(sum(DLRM_IDLE_US) / 1e6, abs=1e-6)
    by_rank = {e["rank"]: e for e in f.evidence}
    for r in range(8):
        assert by_rank[r]["idle"] == pytest.approx(DLRM_IDLE_US[r] / DLRM_WINDOW_US[r], abs=1e-4)
        assert by_rank[r]["median_kernel_us"] == 3.0
    assert f.severity.value == "warning"
