"""Steps on the GPU execution timeline, transfer estimates without sizes, confidence from the evidence.

Synthetic jobs are built event by event (tests/frame_builders.py); the real samples are read a second
time with plain json by tests/gpu_steps_reference.py, which implements the step rules from their
definition, not with the code under test.
"""

from __future__ import annotations

import shutil
import statistics

import polars as pl
import pytest

from forensics.base.confidence import evidence_confidence
from forensics.base.frames import JobFrames
from forensics.detectors import run_detectors
from forensics.facts.context import JobContext
from tests.conftest import shared_path
from tests.frame_builders import MS, _Rows, dp_job
from tests.gpu_steps_reference import read

T = 1_000 * MS
LAG = 30 * MS


def _lagging_job(pre_trace: bool = False) -> JobFrames:
    """Two ranks, 3 steps of 10 ms on the CPU. The host launches each step's 4 compute kernels (2 ms each) and
    one all-reduce (2 ms, 64 MiB) 1 ms apart; the GPU runs them back to back 30 ms behind the CPU, so GPU
    step s is [T + 30 + 10 s, T + 40 + 10 s) ms. ``pre_trace``: the GPU first finishes 30 ms of work
    launched before the profiler started (no launch in the trace)."""
    rows = _Rows()
    for r in range(2):
        if pre_trace:
            rows.kernel(r, T, T + LAG, "compute")
            rows.ops.pop()  # its launch happened before the trace
        for s in range(3):
            cpu0, gpu0 = T + s * 10 * MS, T + LAG + s * 10 * MS
            rows.steps.append(dict(rank=r, host="node0", source=f"r{r}.json", step=s, start_ns=cpu0, end_ns=cpu0 + 10 * MS))
            for i in range(4):
                rows.kernel(r, gpu0 + 2 * i * MS, gpu0 + 2 * (i + 1) * MS, "compute", launch=cpu0 + i * MS)
            rows.kernel(r, gpu0 + 8 * MS, gpu0 + 10 * MS, "comm", launch=cpu0 + 4 * MS, collective="allreduce",
                        pg_name="1", pg_desc="DATA_PARALLEL_GROUP", pg_ranks=[0, 1], group_size=2, bytes=64 << 20)
    return rows.frames(2, [("1", "DATA_PARALLEL_GROUP", [0, 1])])


@pytest.mark.parametrize("pre_trace", [False, True])
def test_a_gpu_lagging_the_cpu_by_30_ms_is_measured_on_its_own_timeline(pre_trace):
    ctx = JobContext(_lagging_job(pre_trace))
    w = ctx.step_windows.sort("rank", "step")
    # Without earlier work in the trace, nothing ran on the GPU between the first step's CPU start and its
    # first kernel: that idle time is the first step's.
    first = T + LAG if pre_trace else T
    expected = [(r, s, first if s == 0 else T + LAG + s * 10 * MS, T + LAG + (s + 1) * 10 * MS)
                for r in range(2) for s in range(3)]
    assert w.select("rank", "step", "w_start", "w_end").rows() == expected
    b = ctx.steps.sort("rank", "step")
    first_ns = 10 * MS if pre_trace else 40 * MS
    assert b["step_ns"].to_list() == [first_ns, 10 * MS, 10 * MS] * 2
    assert b["compute_ns"].to_list() == [8 * MS] * 6
    assert b["comm_exposed_ns"].to_list() == [2 * MS] * 6  # both ranks arrive together: all transfer
    assert b["idle_ns"].to_list() == [first_ns - 10 * MS, 0, 0] * 2
    (f,) = run_detectors(ctx, only=["exposed_comm"])[0]
    # The finding and the table agree: 2 ms of 10 ms exposed in every step (the median step).
    assert f.metrics["exposed_fraction"] == pytest.approx(0.2)
    assert f.metrics["exposed_ms_per_step"] == 2.0
    assert f.confidence == "high"  # both ranks, 3 steps, sizes known
    # Kernels belong to the step that launched them, wherever the GPU ran them.
    k = ctx.match.kernels.sort("rank", "start_ns")
    assert k["step"].to_list() == [0, 1, 2, 0, 1, 2]


def test_the_last_step_ends_at_its_last_kernel_not_at_later_work():
    # Work launched after the last step (no ProfilerStep for it) keeps the last window at the step's own
    # last kernel only when it belongs to no step; here a kernel launched before the trace runs last.
    frames = _lagging_job()
    rows = _Rows(corr=10_000)
    rows.kernel(0, T + 90 * MS, T + 95 * MS, "compute")
    rows.ops.pop()
    k = pl.concat([frames["kernels"], pl.DataFrame(rows.kernels, infer_schema_length=None).pipe(
        lambda d: d.cast({c: frames["kernels"].schema[c] for c in d.columns}))], how="diagonal_relaxed")
    ctx = JobContext(JobFrames({**{n: frames[n] for n in frames}, "kernels": k}))
    last = ctx.step_windows.filter((pl.col("rank") == 0) & (pl.col("step") == 2)).row(0, named=True)
    assert last["w_end"] == T + LAG + 30 * MS


def _without_sizes(frames: JobFrames) -> JobFrames:
    k = frames["kernels"].with_columns(pl.lit(None, dtype=pl.Int64).alias("bytes"))
    return JobFrames({**{n: frames[n] for n in frames}, "kernels": k})


def test_without_sizes_a_matched_collective_is_split_by_its_shortest_duration_across_ranks():
    frames, truth = dp_job(n_ranks=4, steps=3, tx_ns=2 * MS, host_delay={3: 10 * MS})
    ctx = JobContext(_without_sizes(frames))
    k = ctx.match.kernels
    assert k["transfer_how"].unique().to_list() == ["min_across_ranks"]
    mins = k.group_by("instance").agg(pl.col("dur_ns").min().alias("m"))
    assert k.join(mins, on="instance").select((pl.col("transfer_ns") == pl.col("m")).all()).item()
    assert k["transfer_ns"].unique().to_list() == [2 * MS]  # the builder's transfer
    (f,) = run_detectors(ctx, only=["busy_wait"])[0]
    assert "without size metadata" in f.summary and "shortest duration of that collective across its ranks" in f.summary
    assert f.confidence == "medium"  # every rank and 3 steps, but no sizes
    (g,) = run_detectors(JobContext(frames), only=["busy_wait"])[0]
    assert g.confidence == "high" and "size metadata" not in g.summary


def test_confidence_from_the_evidence():
    assert evidence_confidence(8, 8, 3) == "high"
    assert evidence_confidence(8, 8, 3, sizes_known=True) == "high"
    assert evidence_confidence(8, 8, 3, sizes_known=False) == "medium"
    assert evidence_confidence(8, 8, 1) == "medium"
    assert evidence_confidence(4, 8, 5) == "medium"
    assert evidence_confidence(3, 8, 5) == "low"
    assert evidence_confidence(1, 8, 5) == "low"
    assert evidence_confidence(1, 2, 5) == "low"  # a lone rank, even of two
    assert evidence_confidence(1, 1, 5) == "high"  # a single-GPU job is complete
    assert evidence_confidence(0, 8, 5) == "low"


# --- real samples -----------------------------------------------------------------------------------


def _load_one(tmp_path, *parts):
    from forensics.pipeline import load

    src = shared_path(*parts)
    shutil.copy(src, tmp_path / src.name)
    return load(tmp_path, workers=1)[1]


@pytest.fixture(scope="module")
def df_index(tmp_path_factory):
    """HTA's df_index_resolver: rank 1 of 2, PyTorch < 2.1 (no collective sizes), 2,020 all-reduces."""
    tmp = tmp_path_factory.mktemp("df_index")
    frames = _load_one(tmp, "kineto", "hta", "df_index_resolver.json.gz")
    return JobContext(frames), read(shared_path("kineto", "hta", "df_index_resolver.json.gz"))


def test_df_index_resolver_unsized_lone_rank_collectives_are_not_split(df_index):
    ctx, _ = df_index
    k = ctx.match.kernels
    assert k.height == 2020
    assert k["transfer_how"].unique().to_list() == ["unknown"]
    assert k.select((pl.col("transfer_ns") == pl.col("dur_ns")).all()).item()  # not the job's 4 us minimum


def test_df_index_resolver_reports_its_exposed_nccl(df_index):
    ctx, ref = df_index
    steps = sorted(ref.windows)
    assert steps == [2, 3, 4, 5, 6]
    b = {r["step"]: r for r in ctx.steps.iter_rows(named=True)}
    for s in steps:
        lo, hi = ref.windows[s]
        assert b[s]["step_ns"] == hi - lo, s
        # No compute ever overlaps the all-reduces, so all their time is exposed, wait or not.
        assert b[s]["comm_exposed_ns"] == ref.exposed_comm_ns(s), s
    per_step_ms = [ref.exposed_comm_ns(s) / 1e6 for s in steps]
    assert statistics.median(per_step_ms) == pytest.approx(59.6, abs=0.05)  # the 59.6 ms per step
    found, _ = run_detectors(ctx, only=["exposed_comm", "busy_wait"])
    (f,) = [x for x in found if x.detector == "exposed_comm"]
    x = statistics.median(ref.exposed_comm_ns(s) / (ref.windows[s][1] - ref.windows[s][0]) for s in steps)
    assert f.metrics["exposed_fraction"] == pytest.approx(x, abs=1e-4)
    assert f.metrics["overlap_fraction"] == 0.0
    assert f.severity.value == "warning" and f.confidence == "low"
    assert "no size metadata" in f.summary and "cannot be split" in f.summary
    assert [x for x in found if x.detector == "busy_wait"] == []  # no wait claimed from an unknown split


def test_mi300x_gpu_30_ms_behind_the_cpu(tmp_path):
    """TraceLens' MI300X trace: kernels start 21-39 ms after their launch; the first 30 ms of GPU time is
    work launched before the profiler started."""
    ctx = JobContext(_load_one(tmp_path, "kineto", "tracelens", "resnet_act_checkpoint.json.gz"))
    ref = read(shared_path("kineto", "tracelens", "resnet_act_checkpoint.json.gz"))
    # The parser adds the trace's baseTimeNanoseconds: compare times from the first step's CPU start.
    t0, r0 = int(ctx.frames["steps"]["start_ns"].min()), min(a for a, _ in ref.steps.values())  # type: ignore[arg-type]
    got = {s: (a - t0, b - t0) for s, a, b in ctx.step_windows.select("step", "w_start", "w_end").iter_rows()}
    assert got == {s: (a - r0, b - r0) for s, (a, b) in ref.windows.items()}
    assert ref.windows[15][0] - r0 > 30 * MS
    b = {r["step"]: r for r in ctx.steps.iter_rows(named=True)}
    assert {s: b[s]["idle_ns"] for s in b} == {s: ref.idle_ns(s) for s in ref.windows}
    (f,) = run_detectors(ctx, only=["exposed_comm"])[0]
    # The finding agrees with the step table it comes from (it said 68.9 % against 0.03 ms per step before).
    table = [b[s]["comm_exposed_ns"] / b[s]["step_ns"] for s in sorted(b)]
    assert f.metrics["exposed_fraction"] == pytest.approx(statistics.median(table), abs=0.01)
    # ... and stays below the whole NCCL time without compute (transfer is a part of each kernel).
    upper = statistics.median(ref.exposed_comm_ns(s) / (ref.windows[s][1] - ref.windows[s][0]) for s in ref.windows)
    assert 0.5 < f.metrics["exposed_fraction"] <= upper
    assert f.confidence == "low"


def test_a_lone_rank_of_eight_without_sizes_claims_no_busy_wait_above_info(tmp_path):
    # DLRM rank 1 alone: its first SendRecv lasts 7,635 us of which 7,625 us wait for rank 7 (no trace here);
    # without sizes or peers the split is unknown.
    ctx = JobContext(_load_one(tmp_path, "kineto", "param_dlrm_8rank", "worker1_step_12.1694128201556.pt.trace.json.gz"))
    assert set(ctx.match.kernels["transfer_how"].to_list()) == {"unknown"}
    found, _ = run_detectors(ctx, only=["busy_wait", "exposed_comm"])
    for f in found:
        assert f.confidence == "low", f.title
        if f.detector == "busy_wait":
            assert f.severity.value == "info"
