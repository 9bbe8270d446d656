"""JobContext: one per analysis, shared by detectors, tables and reports; its facts against hand-built jobs."""

from __future__ import annotations

import re
from pathlib import Path

import polars as pl
from forensics.reports import html as html_report
from forensics.reports import json_report, markdown

import forensics.facts.context as context_mod
from forensics.base.frames import JobFrames, conform
from forensics.facts.context import JobContext
from forensics.facts.identity import identities
from forensics.pipeline import analyze
from tests.conftest import ROOT
from tests.frame_builders import MS, dp_job


def test_step_windows_are_the_builders_steps():
    frames, truth = dp_job(n_ranks=4, steps=3, host_delay={2: 3 * MS})
    w = JobContext(frames).step_windows
    got = {(r, s): (a, b) for r, s, a, b in w.select("rank", "step", "w_start", "w_end").iter_rows()}
    assert set(got) == set(truth.step_ns)
    for rank in range(4):
        start = 1_000 * MS  # the builder's first step start; steps follow each other back to back
        for step in range(3):
            assert got[(rank, step)] == (start, start + truth.step_ns[(rank, step)])
            start += truth.step_ns[(rank, step)]


def test_clock_offsets_recover_the_builders_host_offset():
    frames, _ = dp_job(n_ranks=16, steps=3, clock_offset={1: 7 * MS})
    off = JobContext(frames).clock_offsets
    by_host = dict(off.by_host.select("host", "offset_ns").iter_rows())
    assert by_host["node1"] - by_host["node0"] == 7 * MS
    by_rank = dict(off.by_rank.select("rank", "offset_ns").iter_rows())
    assert {by_rank[r] - by_rank[0] for r in range(8, 16)} == {7 * MS}


def test_stages_identity_and_job_facts():
    frames, _ = dp_job(n_ranks=4, steps=2)
    ctx = JobContext(frames)
    assert ctx.stages.height == 0  # no pipeline group
    assert ctx.ranks == [0, 1, 2, 3] and ctx.hosts == ["node0"] and ctx.world_size == 4
    assert identities(frames).height == 0 and ctx.identity["rank"].sort().to_list() == [0, 1, 2, 3]


def test_identity_of_a_trace_only_job_is_every_traced_rank_on_its_host_and_device():
    ranks = pl.DataFrame({"rank": [0, 1, 9], "host": ["a", "a", "b"], "pid": [10, 11, 12], "device": [0, 1, 1]})
    ctx = JobContext(JobFrames({"ranks": conform("ranks", ranks)}))
    got = ctx.identity.sort("rank").select("rank", "host", "pid", "cuda_dev", "how", "trace_rank").rows()
    assert got == [(0, "a", 10, 0, "trace", 0), (1, "a", 11, 1, "trace", 1), (9, "b", 12, 1, "trace", 9)]
    empty = JobContext(JobFrames({}))
    assert empty.ranks == [] and empty.hosts == [] and empty.world_size is None and empty.stages.height == 0


def test_facts_are_cached_on_the_context_itself():
    frames, _ = dp_job(n_ranks=4, steps=2)
    before = dict(vars(frames))
    ctx = JobContext(frames)
    assert ctx.breakdown is ctx.breakdown and ctx.match is ctx.breakdown.collectives
    ctx.exposure, ctx.stages, ctx.clock_offsets, ctx.identity  # noqa: B018
    assert {"match", "breakdown", "exposure", "stages", "clock_offsets", "identity"} <= set(vars(ctx))
    assert vars(frames) == before, "no cache smuggled into the frames"


def test_one_analysis_computes_the_breakdown_once_for_detectors_and_reports(monkeypatch):
    calls = []
    real = context_mod.compute_breakdown

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(context_mod, "compute_breakdown", counting)
    analysis = analyze(ROOT / "sample_traces" / "ddp_straggler", workers=1)
    json_report.build(analysis)
    markdown.render(analysis)
    html_report.render(analysis)
    assert len(calls) == 1


def test_no_library_code_builds_a_second_context():
    pattern = re.compile(r"(?<![\w.])JobContext\(")
    found = [
        str(p.relative_to(ROOT))
        for folder in ("forensics", "parsers", "reports")
        for p in (ROOT / folder).rglob("*.py")
        if pattern.search(p.read_text(encoding="utf-8"))
    ]
    assert found == ["forensics/pipeline.py"], found


def test_analysis_exposes_the_context_sources_and_frames():
    analysis = analyze(ROOT / "sample_traces" / "xid79", workers=1)
    assert analysis.sources is analysis.context.sources
    assert analysis.frames is analysis.context.frames
    assert isinstance(analysis.run_dir, Path)


def test_identity_keeps_the_logs_join_and_adds_only_unlogged_traced_ranks():
    comms = pl.DataFrame({"origin": ["init"], "nranks": [2], "host": ["a"], "pid": [10], "cuda_dev": [0], "rank": [0],
                          "bus_id": ["0000:3b:00.0"]})
    ranks = pl.DataFrame({"rank": [0, 1], "host": ["a", "a"], "pid": [10, 11], "device": [0, 1]})
    frames = JobFrames({"nccl_comms": conform("nccl_comms", comms), "ranks": conform("ranks", ranks)})
    got = JobContext(frames).identity.sort("rank").select("rank", "cuda_dev", "bus_id", "how", "trace_rank").rows()
    assert got == [(0, 0, "0000:3b:00.0", "init", 0), (1, 1, None, "trace", 1)]


def test_one_analysis_computes_the_launch_times_once(monkeypatch):
    # collective matching and the step breakdown both tie kernels to their launch calls: one join, shared
    import forensics.facts.breakdown as breakdown_mod
    import forensics.facts.collectives as collectives_mod

    calls = []
    real = collectives_mod.launch_times

    def counting(frames: JobFrames) -> pl.DataFrame:
        calls.append(1)
        return real(frames)

    for mod in (context_mod, collectives_mod, breakdown_mod):
        monkeypatch.setattr(mod, "launch_times", counting)
    analysis = analyze(ROOT / "sample_traces" / "ddp_straggler", workers=1)
    html_report.render(analysis)
    assert len(calls) == 1
