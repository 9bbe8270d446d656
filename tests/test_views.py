"""The report's views: every number a figure or table shows, checked against the frames or the builder's
ground truth (computed here, independently of the views), and every view safe on empty and partial jobs."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

import plotly.io as pio
import polars as pl
import pytest
from forensics.reports import view_timeline
from forensics.reports.view_anatomy import anatomy_segments, outlier_ranks, step_anatomy_view
from forensics.reports.view_collectives import collectives_table, collectives_view
from forensics.reports.view_heatmap import rank_step_heatmap_view
from forensics.reports.view_hwevents import hw_events_view, job_marks
from forensics.reports.view_ncclconfig import nccl_config_view
from forensics.reports.views import VIEWS, View, build_views

from forensics.base.findings import CostBasis, Finding, Severity, When
from forensics.base.frames import JobFrames, conform
from forensics.facts.context import JobContext
from forensics.pipeline import Analysis, analyze
from tests.conftest import ROOT, shared_path
from tests.frame_builders import MS, dp_job

SAMPLES = sorted(p for p in (ROOT / "sample_traces").iterdir() if p.is_dir())
IDS = ["step-anatomy", "op-categories", "rank-step-heatmap", "timeline", "collectives", "hw-events", "nccl-config",
       "kernel-classes",
       "who-is-stuck-where"]


def _straggler(*ranks: int) -> Finding:
    return Finding("straggler", Severity.WARNING, "Straggler", "s", "r", ranks=tuple(ranks), kind="slow_rank")


def _analysis(frames: JobFrames, findings: list[Finding] | None = None) -> Analysis:
    return Analysis(Path("job"), JobContext(frames), findings or [])


def _row(labels: list[str], rank: int) -> int:
    """Index of a rank's row in a heatmap: labels read ``r<rank> <gpu>``, culprits prefixed ``▶``."""
    found = [i for i, label in enumerate(labels) if label.removeprefix("▶ ").split(" ")[0] == f"r{rank}"]
    assert len(found) == 1, (rank, labels)
    return found[0]


@pytest.fixture(scope="module")
def dp():
    # 16 ranks on 2 hosts; host 1's clock runs 9 ms ahead; rank 3 computes 30% slower.
    frames, truth = dp_job(n_ranks=16, steps=4, slow={3: 1.3}, clock_offset={1: 9 * MS}, seq=True)
    return _analysis(frames, [_straggler(3)]), frames, truth


def test_views_are_listed_in_page_order_with_stable_anchors(dp):
    views = build_views(dp[0])
    assert [v.id for v in views] == IDS
    assert all(isinstance(v, View) and v.caption and v.empty_reason is None for v in views[:5])
    assert len(VIEWS) == len(IDS)


def test_heatmap_cell_is_the_steps_duration_and_culprit_is_marked(dp):
    analysis, frames, truth = dp
    view = rank_step_heatmap_view(analysis)
    fig = view.figures[0].to_plotly_json()["data"][0]
    steps = frames["steps"].sort("rank", "step")
    assert steps.height == 16 * 4
    for row in steps.iter_rows(named=True):
        y = _row(fig["y"], row["rank"])
        x = fig["x"].index(f"step {row['step']}")
        expected_ms = (row["end_ns"] - row["start_ns"]) / 1e6
        assert fig["z"][y][x] == pytest.approx(expected_ms, abs=1e-3)
        assert expected_ms == pytest.approx(truth.step_ns[(row["rank"], row["step"])] / 1e6)
    marked = [label for label in fig["y"] if label.startswith("▶")]
    assert len(marked) == 1 and marked[0].replace("▶ ", "").startswith("r3 ")


def test_heatmap_exposed_comm_is_transfer_plus_wait(dp):
    analysis, _, truth = dp
    exposed = rank_step_heatmap_view(analysis).figures[1].to_plotly_json()["data"][0]
    assert len(truth.wait) == 16 * 4
    for (rank, step), wait in truth.wait.items():
        y = _row(exposed["y"], rank)
        want = (wait + 2 * MS) / 1e6  # every all-reduce moves for tx_ns = 2 ms, nothing hides it
        assert exposed["z"][y][exposed["x"].index(f"step {step}")] == pytest.approx(want, abs=1e-3)


def test_anatomy_segments_match_the_builder_and_add_up(dp):
    analysis, frames, truth = dp
    table, segs = anatomy_segments(analysis)
    k = frames["kernels"]
    for r in (0, 3, 9):
        row = table.filter(pl.col("rank") == r).row(0, named=True)
        comp = k.filter((pl.col("rank") == r) & (pl.col("class") == "compute"))
        assert row["compute"] == pytest.approx(float((comp["end_ns"] - comp["start_ns"]).sum()) / 4 / 1e6, abs=1e-6)
        assert row["wait DP"] == pytest.approx(sum(truth.wait[(r, s)] for s in range(4)) / 4 / 1e6, abs=1e-6)
        assert row["exposed DP"] == pytest.approx(2.0, abs=1e-6)
        assert row["step_ms"] == pytest.approx(sum(truth.step_ns[(r, s)] for s in range(4)) / 4 / 1e6, abs=1e-6)
        assert sum(row[s] for s in segs) == pytest.approx(row["step_ms"], abs=1e-6)
    assert row["gpu"] == "node1:cuda1"  # rank 9: host and device, no bus id without NCCL logs
    fig = step_anatomy_view(analysis).figures[0].to_plotly_json()
    assert fig["data"][0]["x"][3].startswith("▶ r3")


def test_anatomy_aggregates_per_host_beyond_64_ranks_keeping_outliers():
    frames, _ = dp_job(n_ranks=80, steps=2, slow={70: 1.5})
    analysis = _analysis(frames, [_straggler(5)])
    table, _ = anatomy_segments(analysis)
    assert outlier_ranks(table, [5]) == [5, 70]
    labels = step_anatomy_view(analysis).figures[0].to_plotly_json()["data"][0]["x"]
    hosts = {f"node{h}" for h in range(10)}
    assert len(labels) == 2 + len(hosts)
    assert labels[0].startswith("▶ r5") and labels[1].startswith("◆ r70")
    assert any(lbl.startswith("node8 (mean of 7 ranks)") for lbl in labels)  # node8 = ranks 64..71 less rank 70


def test_anatomy_of_a_healthy_job_beyond_64_ranks_is_one_bar_per_host():
    # no culprit and no outlier: the list of lone ranks is empty (its labels once had no type and the concat with
    # the hosts' rows failed, exit 3, on 1,000 tiny traces of benchmarks/many_small_files.py)
    frames, _ = dp_job(n_ranks=80, steps=2, slow={})
    analysis = _analysis(frames)
    table, _ = anatomy_segments(analysis)
    assert outlier_ranks(table, []) == []
    labels = step_anatomy_view(analysis).figures[0].to_plotly_json()["data"][0]["x"]
    assert labels == [f"node{h} (mean of 8 ranks)" for h in range(10)]


def test_collective_skew_last_rank_transfer_and_busbw_by_hand(dp):
    analysis, frames, truth = dp
    table = collectives_table(analysis.context).sort("step")
    assert table.height == 4
    comm = frames["kernels"].filter(pl.col("class") == "comm")
    for row in table.iter_rows(named=True):
        s = row["step"]
        waits = [truth.wait[(r, s)] for r in range(16)]
        # arrival = kernel start; the estimated offsets put both hosts' ends together, so the skew is
        # max - min of the start times on one clock: the longest wait.
        assert row["skew_ns"] == max(waits) - min(waits)
        assert row["last_rank"] == truth.last[s] == 3
        assert row["transfer_ns"] == 2 * MS
        assert row["wait_max_ns"] == max(waits) and row["wait_sum_ns"] == sum(waits)
        assert row["seq"] == s and row["op"] == "allreduce" and row["bytes"] == 64 << 20 and row["n_hosts"] == 2
        assert row["busbw_gbps"] == pytest.approx((64 << 20) / (2 * MS) * 2 * 15 / 16)
        assert row["expected_busbw_gbps"] is None  # no GPU model in the frames: no expectation
    raw = comm.filter(pl.col("seq") == 0)
    assert int(raw["start_ns"].max() - raw["start_ns"].min()) != table["skew_ns"][0]  # raw clocks disagree


def test_collective_expectation_uses_the_cost_model_when_the_gpu_is_known():
    from forensics.facts import nccl_cost as nc

    frames, _ = dp_job(n_ranks=8, steps=2, seq=True)
    ranks = frames["ranks"].with_columns(pl.lit("NVIDIA H100 80GB HBM3").alias("gpu_name"))
    frames = JobFrames({**{n: frames[n] for n in frames.present}, "ranks": ranks})
    row = collectives_table(JobContext(frames)).row(0, named=True)
    t_us = nc.choose(nc.Comm(nranks=8, nnodes=1, arch="hopper"), "AllReduce", 64 << 20)[2]
    assert row["expected_by"] == "cost model"
    assert row["expected_busbw_gbps"] == pytest.approx((64 << 20) / (t_us * 1e3) * 2 * 7 / 8)
    assert row["busbw_ratio"] == pytest.approx(row["busbw_gbps"] / row["expected_busbw_gbps"])


def test_collectives_view_shows_the_worst_first(dp):
    view = collectives_view(dp[0])
    caption, shown = view.tables[0]
    assert "collectives.parquet" in caption
    assert shown["wait_sum_ms"].to_list() == sorted(shown["wait_sum_ms"].to_list(), reverse=True)


def test_timeline_puts_ranks_on_one_clock(dp):
    analysis, frames, truth = dp
    ctx = analysis.context
    steps = view_timeline.pick_steps(ctx)
    step = steps[0][0]
    med = {s: sorted(truth.step_ns[(r, s)] for r in range(16))[7:9] for s in range(4)}
    assert steps[0][1] == "slowest" and sum(med[step]) == max(sum(v) for v in med.values())
    ranks = view_timeline.pick_ranks(ctx, step, [3])
    assert ranks[0] == (3, "culprit") and {role for _, role in ranks} >= {"median", "fastest"}
    shown = [r for r, _ in ranks]
    iv = view_timeline.step_intervals(ctx, step, shown)
    ends = iv.filter(pl.col("kind") == "NCCL transfer").group_by("rank").agg(pl.col("end_ns").max())
    assert ends["end_ns"].n_unique() == 1  # every rank's all-reduce ends at one instant on the common clock
    raw_end = frames["kernels"].filter((pl.col("class") == "comm") & pl.col("rank").is_in(shown)
                                       & (pl.col("seq") == step))
    assert raw_end["end_ns"].n_unique() > 1  # ... though the two hosts' clocks say otherwise
    for r in shown:  # the wait bar is the builder's wait, the transfer bar the 2 ms transfer
        mine = iv.filter(pl.col("rank") == r)
        wait = mine.filter(pl.col("kind") == "NCCL wait")
        assert int((wait["end_ns"] - wait["start_ns"]).sum()) == truth.wait[(r, step)]
        tx = mine.filter(pl.col("kind") == "NCCL transfer")
        assert int((tx["end_ns"] - tx["start_ns"]).sum()) == 2 * MS
    view = view_timeline.timeline_view(analysis)
    assert len(view.figures) == 2 and view.tables[0][1]["rank"].to_list()[0] == 3


def test_timeline_bars_are_bounded_whatever_the_kernel_count():
    frames, _ = dp_job(n_ranks=8, steps=2, n_kernels=4000, compute_ns=40 * MS)
    ctx = JobContext(frames)
    iv = view_timeline.step_intervals(ctx, 0, [0, 1])
    assert frames["kernels"].filter(pl.col("rank") == 0).height > 8000
    assert iv.group_by("rank", "lane", "kind").len()["len"].max() <= view_timeline.RESOLUTION


def _kernel_events(rows: list[dict]) -> pl.DataFrame:
    return conform("kernel_events", pl.DataFrame(rows, infer_schema_length=None))


def test_hw_events_lanes_kinds_and_marks():
    frames, _ = dp_job(n_ranks=8, steps=3)
    t = 2_000 * MS
    ke = _kernel_events([
        dict(host="node0", source="dmesg.log", line=1, kind="xid", xid=79, pci_bus_id="0000:9a:00.0", wall_ns=t,
             message="NVRM: Xid (PCI:0000:9a:00): 79, <b>fallen</b>"),
        dict(host="node0", source="dmesg.log", line=2, kind="benign", wall_ns=t, message="ignored"),
        dict(host="node0", source="dmesg.log", line=3, kind="aer", mono_ns=5 * 10**9, message="AER: corrected"),
    ])
    frames = JobFrames({**{n: frames[n] for n in frames.present}, "kernel_events": ke})
    timeout = Finding("nccl_timeout", Severity.CRITICAL, "Timeout", "s", "r", ranks=(4,), kind="timeout",
                      when=When.span(t, t + 600 * 10**9, "watchdog stamp minus the run time"),
                      cost=CostBasis(fatal=True, died_ns=t + 600 * 10**9, hung_s=600.0))
    analysis = _analysis(frames, [timeout])
    steps = frames["steps"]
    last = min(steps.group_by("rank").agg(pl.col("step").max())["step"].to_list())
    last_end = steps.filter(pl.col("step") == last)["end_ns"].max()
    assert job_marks(analysis) == sorted([(t, "timed-out collective began"), (t + 600 * 10**9, "NCCL timeout"),
                                          (last_end, f"last completed step ({last})")])
    view = hw_events_view(analysis)
    walled = view.figures[0].to_plotly_json()
    xid = next(d for d in walled["data"] if d["name"] == "xid 79")
    assert xid["y"] == ["node0:0000:9a:00.0"]
    assert xid["x"] == [datetime.fromtimestamp(t / 1e9, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f")]
    assert "&lt;b&gt;" in xid["text"][0]  # log text is shown as text, not plotly markup
    assert len(walled["layout"]["shapes"]) == 3
    assert {d["name"] for d in view.figures[1].to_plotly_json()["data"]} == {"aer"}  # since-boot stamps alone
    summary = view.tables[0][1]
    assert sorted(summary["kind"].to_list()) == ["aer", "xid 79"]


def test_nccl_config_flags_the_process_that_differs():
    base = dict(source="r.log", line=1, origin="nccl")
    env = conform("nccl_env", pl.DataFrame([
        {**base, "host": "n0", "pid": 10 + d, "cuda_dev": d, "var": "NCCL_IB_HCA", "value": "mlx5"} for d in range(4)
    ] + [{**base, "host": "n0", "pid": 12, "cuda_dev": 2, "var": "NCCL_ALGO", "value": "Ring"}]))
    view = nccl_config_view(_analysis(JobFrames({"nccl_env": env})))
    caption, odd = view.tables[-1]
    assert "1 of 4" in caption
    assert odd["pid"].to_list() == [12] and odd["deviates"].to_list() == ["env"]
    assert odd["env"].to_list() == ["NCCL_ALGO=Ring, NCCL_IB_HCA=mlx5"]


def test_every_view_says_why_it_is_empty_on_an_empty_job():
    views = build_views(_analysis(JobFrames({})))
    assert [v.id for v in views] == IDS
    for v in views:
        assert v.empty_reason and not v.figures and not v.tables, v.id


def test_views_on_a_job_with_kernels_but_no_steps_or_ranks():
    frames, _ = dp_job(n_ranks=4, steps=2)
    no_steps = JobFrames({"kernels": frames["kernels"]})
    views = {v.id: v for v in build_views(_analysis(no_steps))}
    assert views["rank-step-heatmap"].figures and views["timeline"].figures  # one whole-trace pseudo-step
    assert views["hw-events"].empty_reason and views["nccl-config"].empty_reason


@pytest.mark.parametrize("sample", SAMPLES, ids=lambda p: p.name)
def test_views_on_each_bundled_sample(sample: Path):
    analysis = analyze(sample, workers=1)
    views = build_views(analysis)
    assert [v.id for v in views] == IDS
    for v in views:
        assert v.empty_reason or v.figures or v.tables, v.id
        for fig in v.figures:
            pio.to_json(fig, validate=True)
    by_id = {v.id: v for v in views}
    assert by_id["step-anatomy"].empty_reason is None and by_id["collectives"].empty_reason is None


def test_heatmap_on_a_real_sample_matches_step_windows_from_the_frames():
    analysis = analyze(ROOT / "sample_traces" / "ddp_straggler", workers=1)
    fig = rank_step_heatmap_view(analysis).figures[0].to_plotly_json()["data"][0]
    steps = analysis.frames["steps"].sort("rank", "start_ns")
    nxt = steps.with_columns(pl.col("start_ns").shift(-1).over("rank").alias("next")).drop_nulls("next")
    assert nxt.height
    for row in nxt.iter_rows(named=True):  # step N runs to step N+1's start (the last one is left out here)
        y = _row(fig["y"], row["rank"])
        x = fig["x"].index(f"step {row['step']}")
        assert fig["z"][y][x] == pytest.approx((row["next"] - row["start_ns"]) / 1e6, abs=1e-3)
    marked = [label for label in fig["y"] if label.startswith("▶")]
    truth = {r for f in analysis.findings if f.detector == "straggler" for r in f.ranks}
    assert truth and {int(m.split()[1][1:]) for m in marked} == truth


@pytest.mark.parametrize("folder", ["dmesg", "nccl_logs"])
def test_views_on_shared_log_samples(folder: str):
    path = shared_path(folder)
    views = {v.id: v for v in build_views(analyze(path, workers=1))}
    assert views["hw-events" if folder == "dmesg" else "nccl-config"].empty_reason is None
    assert views["timeline"].empty_reason  # logs only: no trace to draw


def test_every_detector_links_to_an_existing_view():
    from forensics.reports.views import view_for

    from forensics.detectors import load_all

    registry = load_all()
    assert all(spec.view for spec in registry.values())
    assert {view_for(name) for name in registry} <= set(IDS)
