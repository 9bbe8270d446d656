"""timeline.json.gz (Chrome / Perfetto JSON trace) and collectives.parquet: structure, clock, bounds, CLI."""

from __future__ import annotations

import gzip
from pathlib import Path

import orjson
import polars as pl
import pyarrow.parquet as pq
import pytest
from forensics.reports import perfetto
from forensics.reports.view_collectives import COLLECTIVES_SCHEMA
from typer.testing import CliRunner

from forensics.base.findings import Finding, Severity
from forensics.base.frames import JobFrames
from forensics.cli import app
from forensics.facts.context import JobContext
from forensics.pipeline import Analysis, analyze
from tests.conftest import ROOT
from tests.frame_builders import MS, dp_job

SAMPLE = ROOT / "sample_traces" / "ddp_straggler"


def check_trace(doc: dict) -> dict[tuple[int, int], str]:
    """What Perfetto and chrome://tracing need of a JSON trace; returns the thread names by (pid, tid)."""
    assert set(doc) >= {"traceEvents", "displayTimeUnit", "otherData"}
    events = doc["traceEvents"]
    procs = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    for e in events:
        assert {"ph", "ts", "pid", "tid", "name"} <= set(e), e
        assert isinstance(e["ts"], (int, float)) and isinstance(e["pid"], int) and isinstance(e["tid"], int)
        assert e["ph"] in ("M", "X", "i"), e
        if e["ph"] == "X":
            assert e["dur"] >= 0 and e["ts"] >= 0
        if e["ph"] != "M":
            assert e["pid"] in procs and (e["pid"], e["tid"]) in threads, e
    # slices of one thread never overlap partially (a viewer nests or rejects them)
    xs = sorted(((e["pid"], e["tid"]), e["ts"], e["ts"] + e["dur"]) for e in events if e["ph"] == "X")
    for (k1, _, e1), (k2, s2, _) in zip(xs, xs[1:]):
        if k1 == k2:
            assert s2 >= e1 - 1e-3, (k1, s2, e1)
    return threads


@pytest.fixture(scope="module")
def sample() -> Analysis:
    return analyze(SAMPLE, workers=1)


def test_sample_trace_structure_names_and_annotations(sample: Analysis):
    doc = orjson.loads(gzip.decompress(perfetto.render(sample)))
    threads = check_trace(doc)
    events = doc["traceEvents"]
    procs = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    ranks = sorted(sample.frames["ranks"]["rank"].to_list())
    assert sorted(procs) == ranks
    ident = sample.context.identity.filter(pl.col("bus_id").is_not_null()).unique("rank")
    assert ident.height == len(ranks)
    for rank, host, bus in ident.select("rank", "host", "bus_id").iter_rows():
        assert procs[rank] == f"{host}/rank {rank}/GPU {bus}"
    assert any(name.startswith("NCCL ") for name in threads.values())  # communicators are tracks
    culprits = {r for f in sample.findings if f.detector == "straggler" for r in f.ranks}
    marks = [e for e in events if e["ph"] == "i"]
    assert culprits and {e["pid"] for e in marks} >= culprits
    assert all(threads[(e["pid"], e["tid"])] == "findings" for e in marks)
    worst = doc["otherData"]["steps"]
    med = sample.context.steps.group_by("step").agg(pl.col("step_ns").median()).sort("step_ns")
    assert med["step"][-1] in worst and len(worst) <= 3
    n_kernels = sum(1 for e in events if e["ph"] == "X" and e["cat"] != "step")
    assert n_kernels == doc["otherData"]["kernels_in_window"] and not doc["otherData"]["merged"]


def test_wider_window_and_the_event_cap(sample: Analysis):
    narrow = perfetto.trace_events(sample, around=0)
    wide = perfetto.trace_events(sample, around=5)
    all_steps = sorted(set(sample.context.steps["step"].to_list()))
    assert len(narrow["otherData"]["steps"]) == 1 and wide["otherData"]["steps"] == all_steps
    capped = perfetto.trace_events(sample, around=5, max_events=300)
    check_trace(capped)
    other = capped["otherData"]
    kept = sum(1 for e in capped["traceEvents"] if e["ph"] == "X" and e["cat"] != "step")
    assert other["merged"] and other["cap"] == 300 and kept <= 300
    assert other["ranks"] + other["ranks_dropped"] == len(sample.context.ranks)


def test_ranks_land_on_one_clock_and_kernels_keep_their_duration():
    frames, _ = dp_job(n_ranks=16, steps=3, clock_offset={1: 7 * MS}, seq=True)
    analysis = Analysis(Path("j"), JobContext(frames),
                        [Finding("straggler", Severity.INFO, "t", "s", "r", kind="slow_rank", ranks=(9,))])
    doc = perfetto.trace_events(analysis, around=2)  # all 3 steps
    check_trace(doc)
    nccl = [e for e in doc["traceEvents"] if e["ph"] == "X" and e["cat"] == "comm"]
    ends = sorted(e["ts"] + e["dur"] for e in nccl)
    gaps = [b - a for a, b in zip(ends, ends[1:])]
    # the 16 kernels of one all-reduce end at one instant on the common clock; all-reduces are ms apart
    assert len(nccl) == 16 * 3 and sum(g > 1000 for g in gaps) == 2 and all(g < 1e-2 or g > 1000 for g in gaps)
    raw = sorted(frames["kernels"].filter(pl.col("class") == "comm")["end_ns"].to_list())
    assert raw[15] - raw[0] == 7 * MS  # ... while the hosts' own clocks are 7 ms apart
    k = frames["kernels"]
    durs = {round((e - s) / 1e3, 3) for s, e in zip(k["start_ns"], k["end_ns"])}
    assert {e["dur"] for e in doc["traceEvents"] if e["ph"] == "X" and e["cat"] != "step"} <= durs
    assert [e["pid"] for e in doc["traceEvents"] if e["ph"] == "i"] == [9]


def test_empty_job_gives_an_empty_but_valid_trace():
    doc = perfetto.trace_events(Analysis(Path("j"), JobContext(JobFrames({}))))
    assert doc["traceEvents"] == [] and doc["otherData"]["empty"]


def test_cli_writes_timeline_and_collectives_and_drops_a_stale_timeline(tmp_path: Path):
    out = tmp_path / "out"
    runner = CliRunner()
    res = runner.invoke(app, ["analyze", str(SAMPLE), "--out", str(out), "--timeline", "--timeline-steps", "2",
                              "-q", "--workers", "1"])
    assert res.exit_code in (0, 1), res.output
    doc = orjson.loads(gzip.decompress((out / "timeline.json.gz").read_bytes()))
    check_trace(doc)
    df = pl.read_parquet(out / "collectives.parquet")
    assert df.columns == list(COLLECTIVES_SCHEMA)
    meta = pq.read_metadata(out / "collectives.parquet").metadata  # readable without Polars too
    assert {k.decode(): v.decode() for k, v in meta.items() if k.startswith(b"forensics.doc.")} == {
        f"forensics.doc.{c}": doc for c, (_, doc) in COLLECTIVES_SCHEMA.items()}
    assert "matched across its ranks" in meta[b"forensics"].decode()
    kernels = analyze(SAMPLE, workers=1).context.match.kernels.filter(pl.col("matched"))
    assert df.height == kernels["instance"].n_unique() > 0
    res = runner.invoke(app, ["analyze", str(SAMPLE), "--out", str(out), "-q", "--workers", "1"])
    assert res.exit_code in (0, 1), res.output
    assert not (out / "timeline.json.gz").exists() and (out / "collectives.parquet").exists()
