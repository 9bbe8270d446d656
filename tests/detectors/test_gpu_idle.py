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
from forensics.detectors.gpu_idle import _Idle, _words
from forensics.facts.context import JobContext
from forensics.pipeline import load
from tests.frame_builders import MS, US, _Rows

ROOT = Path(__file__).resolve().parents[2]
SHARED = ROOT.parent / "shared" / "sample_data"


def _found(run_detector, frames, **settings):
    """The findings of a detector that must have run (not skipped)."""
    findings, skipped = run_detector(frames, **settings)
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


def test_triggers_sync_bound_gap_after_a_synchronization(run_detector):
    # GPU busy 0-6 ms; the host blocks in cudaStreamSynchronize 2 ms .. 6.01 ms, then does 3 ms of Python
    # before the next launch: the GPU idles 6-9 ms = 30% of every step.
    def layout(rows, t0):
        rows.kernel(0, t0, t0 + 6 * MS, "compute", launch=t0)
        _op(rows, "cudaStreamSynchronize", t0 + 2 * MS, t0 + 6 * MS + 10 * US, "cuda_runtime")
        rows.kernel(0, t0 + 9 * MS, t0 + 10 * MS, "compute", launch=t0 + 9 * MS - 5 * US)

    (f,) = _found(run_detector, _one_rank(layout))
    assert f.metrics["class"] == "sync"
    assert f.ranks == (0,)
    assert f.metrics["idle_share"] == pytest.approx(0.3, abs=1e-6)
    assert f.gpu_seconds_lost == pytest.approx(3 * 3e-3, abs=1e-9)
    assert f.severity.value == "warning"


def test_triggers_input_bound_gap_while_the_host_is_in_the_data_loader(run_detector):
    # The loader runs 0-4 ms of each step; the first kernel is launched after it: idle 0-4 ms = 40%.
    def layout(rows, t0):
        _op(rows, "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__", t0, t0 + 4 * MS, "user_annotation")
        rows.kernel(0, t0 + 4 * MS + 10 * US, t0 + 10 * MS, "compute", launch=t0 + 4 * MS)

    (f,) = _found(run_detector, _one_rank(layout))
    assert f.metrics["class"] == "input"
    assert f.metrics["idle_share"] == pytest.approx(0.401, abs=1e-6)
    assert "num_workers" in f.remediation


def test_triggers_pause_one_long_gap(run_detector):
    # One 6 ms gap (60% of the step) with nothing on the host side that explains it.
    def layout(rows, t0):
        rows.kernel(0, t0, t0 + 4 * MS, "compute", launch=t0)
        rows.kernel(0, t0 + 9_990 * US, t0 + 10 * MS, "compute", launch=t0 + 3 * MS)

    (f,) = _found(run_detector, _one_rank(layout))
    assert f.metrics["class"] == "pause"
    assert f.metrics["idle_share"] == pytest.approx(0.599, abs=1e-6)
    assert f.severity.value == "warning"  # 0.599 < critical_idle 0.6
    (g,) = _found(run_detector, _one_rank(layout), critical_idle=0.5)
    assert g.severity.value == "critical"


def test_triggers_launch_bound_many_short_kernels_launched_late(run_detector):
    # 500 kernels of 5 us, each launched 15 us after the previous one ended: GPU idle 75% of the step,
    # every gap host-bound, median kernel 5 us.
    def layout(rows, t0):
        t = t0
        for _ in range(500):
            rows.kernel(0, t + 15 * US, t + 20 * US, "compute", launch=t + 10 * US)
            t += 20 * US

    (f,) = _found(run_detector, _one_rank(layout))
    assert f.metrics["class"] == "launch"
    assert f.metrics["idle_share"] == pytest.approx(0.75, abs=1e-6)
    assert "CUDA graphs" in f.remediation


def test_skipped_without_kernels():
    from forensics.base.frames import JobFrames

    findings, skipped = run_detectors(JobContext(JobFrames({})), only=["gpu_idle"])
    assert findings == []
    assert [s.detector for s in skipped] == ["gpu_idle"] and "kernels" in skipped[0].reason


def test_without_profiler_steps_the_profiled_window_is_the_unit(run_detector):
    # A capture without steps: one window per rank from its first to its last GPU activity (1,000 .. 1,101 ms);
    # the GPU runs 2 of its 101 ms, and the one 99 ms gap is most of the window: a pause, said of the window.
    rows = _Rows()
    rows.kernel(0, 1_000 * MS, 1_001 * MS, "compute")
    rows.kernel(0, 1_100 * MS, 1_101 * MS, "compute")
    # two kernels are set-up or a one-off test by default: not judged
    findings, skipped = run_detectors(JobContext(rows.frames(1, [])), only=["gpu_idle"])
    assert findings == [] and "no profiler steps" in skipped[0].reason
    assert "5 compute or NCCL kernels" in skipped[0].reason
    (f,) = _found(run_detector, rows.frames(1, []), min_window_kernels=2)
    assert f.metrics["unit"] == "profiled_window" and f.metrics["steps"] == 0
    assert f.metrics["class"] == "pause"
    assert f.metrics["idle_share"] == pytest.approx(99 / 101, abs=1e-4)
    assert "profiled window" in f.title and "per step" not in f.title
    assert "no profiler steps" in f.summary
    assert f.confidence == "medium"  # a window may hold start-up or phases the trace does not name


def _no_steps_sync_job(copy_name: str, host_calls: list[tuple[str, str]], rounds: int = 5):
    """One rank, no steps: each round a 1 ms kernel, a 10 us copy, the host inside ``host_calls`` from the copy's
    launch until 20 us after the copy ends, then 4 ms of host work before the next kernel."""
    rows = _Rows()
    t = 1_000 * MS
    for _ in range(rounds):
        rows.kernel(0, t, t + MS, "compute", launch=t - 5 * US)
        rows.kernel(0, t + MS, t + MS + 10 * US, "memcpy", name=copy_name, launch=t)
        for name, cat in host_calls:
            _op(rows, name, t, t + MS + 30 * US, cat)
        t += 5 * MS + 10 * US
    return rows.frames(1, [])


def test_sync_gaps_without_steps_name_what_the_host_waited_for(run_detector):
    # .item(): a device-to-host copy, then the host blocks in cudaStreamSynchronize inside aten::item. Every
    # round but the last leaves a 4 ms gap (the last gap lies after the window): 4 gaps of 4 ms.
    item = _no_steps_sync_job("Memcpy DtoH (Device -> Pageable)", [("aten::item", "cpu_op"),
                                                                   ("cudaStreamSynchronize", "cuda_runtime")])
    (f,) = _found(run_detector, item)
    assert f.metrics["class"] == "sync" and f.metrics["unit"] == "profiled_window"
    assert (f.metrics["sync_gaps"], f.metrics["d2h_copy_syncs"], f.metrics["stream_sync_syncs"]) == (4, 4, 0)
    assert f.metrics["d2h_copy_share_of_idle"] == pytest.approx(1.0)
    window = 4 * (5 * MS + 10 * US) + MS + 10 * US
    assert f.metrics["idle_share"] == pytest.approx(4 * 4 * MS / window, abs=1e-4)
    assert "4 device-to-host copies" in f.summary
    # torch.cuda.synchronize() after a device-to-device copy: a device synchronize, not a copy to the host
    (g,) = _found(run_detector,
                  _no_steps_sync_job("Memcpy DtoD (Device -> Device)", [("cudaDeviceSynchronize", "cuda_runtime")]))
    assert (g.metrics["device_sync_syncs"], g.metrics["d2h_copy_syncs"]) == (4, 0)
    # a plain stream synchronize
    (h,) = _found(run_detector,
                  _no_steps_sync_job("Memcpy DtoD (Device -> Device)", [("cudaStreamSynchronize", "cuda_runtime")]))
    assert (h.metrics["stream_sync_syncs"], h.metrics["d2h_copy_syncs"]) == (4, 0)


def test_host_sync_records_are_not_gpu_work_without_steps(run_detector):
    # Nsight lists the host's waits as CUPTI synchronization records (class sync) on the device: they must not
    # fill the idle gaps they cause. Window 1,000 .. 1,029 ms (the last record ends it), kernels 3 x 2 ms.
    rows = _Rows()
    for k in range(3):
        t = 1_000 * MS + k * 10 * MS
        rows.kernel(0, t, t + 2 * MS, "compute", launch=t - 5 * US)
        rows.kernel(0, t, t + 9 * MS, "sync", name="[CUDA sync Stream sync]", launch=t)
    (f,) = _found(run_detector, rows.frames(1, []), min_window_kernels=3)
    assert f.metrics["idle_share"] == pytest.approx(23 / 29, abs=1e-4)


def test_below_threshold_is_silent_and_threshold_is_a_setting(run_detector):
    def layout(rows, t0):  # 8% idle
        rows.kernel(0, t0 + 800 * US, t0 + 10 * MS, "compute", launch=t0 + 790 * US)

    assert _found(run_detector, _one_rank(layout)) == []
    (f,) = _found(run_detector, _one_rank(layout), min_idle=0.05)
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
def test_clean_scenarios_are_silent(run_detector, tmp_path_factory, scenario):
    _, frames = _simulate(tmp_path_factory, scenario)
    assert _found(run_detector, frames) == []


def test_input_bound_scenario_against_truth(run_detector, tmp_path_factory):
    truth, frames = _simulate(tmp_path_factory, "input_bound")
    (fault,) = truth["faults"]
    (f,) = _found(run_detector, frames)
    assert f.metrics["class"] == "input"
    assert sorted(f.ranks) == sorted(fault["ranks"])
    assert sorted(f.hosts) == sorted(set(fault["hosts"]))
    assert sorted(f.gpus) == sorted(set(fault["gpus"]))
    assert f.metrics["idle_share"] == pytest.approx(fault["expected"]["gpu_idle_fraction_median"], abs=0.01)
    assert 0.35 <= f.metrics["idle_share"] <= 0.45
    assert f.metrics["class_share_of_idle"] >= 0.9


def test_bundled_samples_are_silent(run_detector):
    samples = sorted(p for p in (ROOT / "sample_traces").iterdir() if p.is_dir())
    assert len(samples) == 4
    for s in samples:
        _, frames = load(s, workers=1)
        found = [f for f in _found(run_detector, frames)]
        if s.name == "xid79":
            # the lost GPU's host blocks in .item() on the fault step (#28 item 7): one finding, on rank 4 alone,
            # which the incidents put under the Xid (tests/test_incidents.py)
            assert [f.ranks for f in found] == [(4,)], s.name
            continue
        assert [f.title for f in found] == [], s.name


# --- real DLRM 8-rank set ---------------------------------------------------------------------------
# Computed independently with json over the raw worker*.pt.trace.json.gz (tests/gpu_steps_reference.py):
# window = ProfilerStep#10 on the GPU timeline, from its CPU start (or, on ranks 1 and 3, the end of GPU
# work launched before it, 1.3 and 0.6 ms later) to max(its end, end of the GPU work launched in it);
# idle = window minus the union of kernel, memcpy and memset events (all streams). Median kernel duration
# 3 us on every rank. The job is host bound: kernels are tiny and the host launches each one after the
# GPU ran dry.
DLRM_WINDOW_US = [14455, 18584, 13017, 18711, 17979, 17797, 13091, 12509]
DLRM_IDLE_US = [7865, 6459, 8713, 8179, 10277, 10526, 8732, 9850]


def test_dlrm_real_is_launch_bound(run_detector):
    run_dir = SHARED / "kineto" / "param_dlrm_8rank"
    assert run_dir.is_dir(), f"shared sample data missing: {run_dir} (../shared/sample_data is required)"
    _, frames = load(run_dir, workers=1)
    (f,) = _found(run_detector, frames)
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


# --- captures without profiler steps ---------------------------------------------------------------


def test_item_sync_scenario_without_steps_against_truth(run_detector, tmp_path_factory):
    # One process, no ProfilerStep: 4,097 rounds of (forward layer, .item(), 400 us of host work). The engine's
    # own timeline gives the idle share of the profiled window; every round but the last leaves its gap
    # inside the window (the last one's host work follows the last GPU op).
    truth, frames = _simulate(tmp_path_factory, "item_sync")
    (fault,) = truth["faults"]
    exp = fault["expected"]
    assert exp["d2h_syncs_per_rank"] == 4097 and 0.92 <= exp["gpu_idle_fraction_window_median"] <= 0.95
    (f,) = _found(run_detector, frames)
    assert f.metrics["class"] == "sync" and f.metrics["unit"] == "profiled_window"
    assert f.ranks == (0,) and list(f.hosts) == fault["hosts"]  # no NCCL log names its GPU
    assert f.metrics["idle_share"] == pytest.approx(exp["gpu_idle_fraction_window_median"], abs=0.002)
    assert f.metrics["d2h_copy_syncs"] == exp["d2h_syncs_per_rank"] - 1 == f.metrics["sync_gaps"]
    assert f.severity.value == "critical"


# Real Nsight export without step ranges (MPI+CUDA saxpy on Perlmutter, pipit; see nsys/SOURCES.md), computed
# independently with sqlite3 over the raw tables: window = first to last CUPTI kernel/memcpy (1,097,327,843 ns),
# busy = their union (373,273,080 ns), so idle 724,054,763 ns; 5 device-to-host copies (copyKind 2), the
# last one ends the window, the 4 others are each followed by a gap of 196.2 / 178.3 / 172.3 / 176.7 ms while
# the host returns from its synchronous cudaMemcpy and then works in MPI.
SAXPY_WINDOW_NS, SAXPY_IDLE_NS = 1_097_327_843, 724_054_763
SAXPY_D2H_GAPS_NS = [196_245_801, 178_326_307, 172_295_404, 176_723_671]


def test_real_nsys_without_steps_is_sync_bound_on_device_to_host_copies(run_detector):
    from tests.conftest import shared_path

    path = shared_path("nsys", "pipit", "saxpy-mpi-cuda_nsys_perlmutter0.sqlite")
    _, frames = load(path, workers=1)
    (f,) = _found(run_detector, frames)
    assert f.metrics["class"] == "sync" and f.metrics["unit"] == "profiled_window"
    assert f.metrics["idle_share"] == pytest.approx(SAXPY_IDLE_NS / SAXPY_WINDOW_NS, abs=1e-4)
    assert f.gpu_seconds_lost == pytest.approx(SAXPY_IDLE_NS / 1e9, abs=1e-6)
    assert f.metrics["d2h_copy_syncs"] == 4
    assert f.metrics["d2h_copy_share_of_idle"] == pytest.approx(sum(SAXPY_D2H_GAPS_NS) / SAXPY_IDLE_NS, abs=1e-3)


# Real Kineto trace without ProfilerStep (TraceLens b200 eager inference, see kineto/SOURCES.md), computed
# independently with json over the raw events: window = first to last kernel / gpu_memcpy / gpu_memset
# (84,487.18 us), their union 11,596.48 us: idle share 0.86274; median kernel 6.29 us.
EAGER_IDLE_SHARE = 0.86274


def test_real_kineto_without_steps_measures_the_profiled_window(run_detector):
    from tests.conftest import shared_path

    _, frames = load(shared_path("kineto", "tracelens", "eager_trace.json.gz"), workers=1)
    (f,) = _found(run_detector, frames)
    assert f.metrics["unit"] == "profiled_window"
    assert f.metrics["idle_share"] == pytest.approx(EAGER_IDLE_SHARE, abs=1e-4)
    assert f.metrics["class"] == "launch"  # tiny eager kernels, each launched after the GPU ran dry


def test_real_nsys_nccl_init_capture_is_not_judged():
    # DistributedSysLab ring job (see nsys/SOURCES.md): each rank's capture is NCCL set-up (memsets, copies) and one
    # ncclAllReduce kernel over 1.7 s: no workload to judge idle time in.
    from tests.conftest import shared_path

    _, frames = load(shared_path("nsys", "DistributedSysLab_FS24", "ring_simple_2nodes_6gpus_job508813"), workers=1)
    findings, skipped = run_detectors(JobContext(frames), only=["gpu_idle"])
    assert findings == [] and [s.detector for s in skipped] == ["gpu_idle"] and "set-up" in skipped[0].reason


def _idle(**kw):
    base = dict(cls="pause", whole=False, ranks=(0, 1), hosts=("n0",), gpus=(), share=0.4, cls_share=0.9,
                per_step_ns=8e6, window_ns=None, idle_ns=6.4e7, steps=4, ranks_with_data=2, sync_n={}, sync_share={},
                evidence=())
    return _Idle(**{**base, **kw})


def test_words_are_read_from_the_record_alone():
    title, summary, remedy = _words(_idle())
    assert title == ("GPU idle 40% of the step on 2 rank(s), paused: one long GPU gap per step (checkpoint, evaluation "
                     "or a host stall)")
    assert summary.startswith("Rank(s) 0-1 run no kernel on any stream for 40.0% of the step (median; 8.0 ms per step)"
                              "; 90% of that idle time is classed pause: most of the idle time is one gap per step.")
    assert "asynchronous" in remedy
    # Without profiler steps the unit is the window, in the title and in the class's wording.
    title, summary, _ = _words(_idle(whole=True, window_ns=2e7))
    assert "of the profiled window" in title and "one long GPU gap in the window" in title
    assert "(median; 8.0 ms of a 20.0 ms window;" in summary and "per step" not in summary
    # Sync gaps by cause: the causes the record counts, and no others.
    causes = {"d2h_copy": 4, "sync_copy": 0, "device_sync": 1, "stream_sync": 0}
    _, summary, _ = _words(_idle(cls="sync", sync_n=causes,
                                 sync_share={"d2h_copy": 0.5, "sync_copy": 0.0, "device_sync": 0.1, "stream_sync": 0}))
    assert summary.endswith(" 5 idle gap(s) follow a host synchronization: 4 device-to-host copies (.item(), .cpu(), "
                            ".tolist(), cudaMemcpy to the host) (50% of the idle time); 1 device synchronizes "
                            "(torch.cuda.synchronize(), cudaDeviceSynchronize) (10% of the idle time).")
