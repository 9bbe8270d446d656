"""CUDA graph replays (#30): known as such in the kernels frame, attributed (to the capturing ops when the capture
is in the trace), counted in the coverage line, and no change to what the detectors find.

Real trace: ../shared/sample_data/kineto/hta/rank0.json.gz (facebookresearch/HolisticTraceAnalysis
tests/data/negative_queue_length_values_check/rank0.json.gz): a torch.compile job on A100 whose compiled regions
replay CUDA graphs (70 ``cudaGraphLaunch`` calls inside ``CompiledFunction`` / ``CompiledFunctionBackward``, the
capture not profiled). Expectations are computed from the raw JSON here, not from the parser.
"""

from __future__ import annotations

import gzip
import json

import polars as pl
import pytest
from conftest import shared_path

from forensics.detectors import run_detectors
from forensics.facts.context import JobContext
from forensics.facts.op_categories import GRAPH_REPLAY_OP, NOTE_SHARE, attributed_kernels
from forensics.pipeline import load

GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")


@pytest.fixture(scope="module")
def hta_rank0(tmp_path_factory):
    src = shared_path("kineto", "hta", "rank0.json.gz")
    run = tmp_path_factory.mktemp("hta_graphs")
    (run / "rank0.json.gz").write_bytes(src.read_bytes())  # a run folder of its own (in tmp, not the repo)
    raw = json.loads(gzip.decompress(src.read_bytes()))
    _, frames = load(run, workers=1)
    return raw["traceEvents"], JobContext(frames)


def _raw_graph_events(events: list) -> tuple[list, list]:
    launches = {e["args"]["correlation"] for e in events
                if e.get("cat") == "cuda_runtime" and e.get("name") == "cudaGraphLaunch"}
    gpu = [e for e in events if e.get("cat") in GPU_CATS and e.get("ph") == "X"]
    return [e for e in gpu if e["args"].get("correlation") in launches], gpu


def test_graph_replayed_kernels_are_marked_on_a_real_trace(hta_rank0):
    events, ctx = hta_rank0
    graph, gpu = _raw_graph_events(events)
    k = ctx.frames["kernels"]
    marked = k.filter(pl.col("graph_replay"))
    assert marked.height == len(graph) > 100
    assert sorted(marked["correlation"].unique().to_list()) == sorted({e["args"]["correlation"] for e in graph})
    assert k.filter(~pl.col("graph_replay")).height == len(gpu) - len(graph)


def test_graph_kernels_are_said_to_be_replayed_with_their_compiled_region(hta_rank0):
    events, ctx = hta_rank0
    graph, _ = _raw_graph_events(events)
    att = ctx.op_attribution
    replayed = att.filter(pl.col("via") == "graph replay")
    assert replayed["kernels"].sum() == len(graph)
    assert replayed["time_ns"].sum() == sum(round(e["dur"] * 1000) for e in graph)
    assert all(op.startswith(GRAPH_REPLAY_OP) for op in replayed["op"].to_list())
    # every cudaGraphLaunch of this trace runs inside CompiledFunction or CompiledFunctionBackward
    assert set(replayed["region"].to_list()) == {"CompiledFunction", "CompiledFunctionBackward"}


def test_coverage_says_the_graph_share_in_words(hta_rank0):
    events, ctx = hta_rank0
    graph, gpu = _raw_graph_events(events)
    cov = ctx.coverage
    total = sum(round(e["dur"] * 1000) for e in gpu)
    assert cov["gpu_time_ns"] == total
    share = sum(round(e["dur"] * 1000) for e in graph) / total
    assert cov["graph_replayed"] == round(share, 4)
    assert share > NOTE_SHARE
    assert f"{share:.1%} of GPU time is replayed from CUDA graphs" in cov["line"]
    assert sum(cov["categories"].values()) == pytest.approx(1.0, abs=1e-3)
    assert "other" in cov["categories"]


def _raw_regions(events: list) -> dict[int, str | None]:
    """id() of each GPU event -> the torch.compile region (innermost CompiledFunction / CompiledFunctionBackward
    cpu_op) open on the thread of its launch call when that call began, from the raw JSON."""
    launch = {e["args"]["correlation"]: e for e in events
              if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in (e.get("args") or {})}
    regions = [e for e in events if e.get("cat") == "cpu_op" and e.get("name") in ("CompiledFunction",
                                                                                    "CompiledFunctionBackward")]
    out: dict[int, str | None] = {}
    for k in (e for e in events if e.get("cat") in GPU_CATS and e.get("ph") == "X"):
        call = launch.get(k["args"].get("correlation"))
        around = [] if call is None else [g for g in regions if (g["pid"], g["tid"]) == (call["pid"], call["tid"])
                                          and g["ts"] <= call["ts"] <= g["ts"] + g["dur"]]
        out[id(k)] = max(around, key=lambda g: g["ts"])["name"] if around else None
    return out


def test_triton_kernels_of_an_old_inductor_keep_their_regions_and_are_named_in_the_coverage(hta_rank0):
    """hta/rank0: 81 Triton kernels with the pre-2023 inductor names (``triton__0d1d2d``: no family in the name),
    75 replayed from the compiled regions' CUDA graphs, 6 launched eagerly outside any region (from the raw
    JSON). Without a family they are ``other``, and the coverage's part for ``other`` names them."""
    events, ctx = hta_rank0
    regions = _raw_regions(events)
    graph, _ = _raw_graph_events(events)
    replayed = {id(e) for e in graph}
    triton = [e for e in events if e.get("cat") == "kernel" and e["name"].startswith("triton")]
    expected = sorted((regions[id(e)] or "", "graph replay" if id(e) in replayed else "launch") for e in triton)
    att = attributed_kernels(ctx.kernel_categories, ctx.frames)
    att = att.filter(pl.col("name").cast(pl.String).str.starts_with("triton"))
    assert sorted(zip(att["region"].fill_null("").to_list(), att["via"].to_list())) == expected
    assert len(expected) == 81 and sum(v == "graph replay" for _, v in expected) == 75
    assert set(att["category"].to_list()) == {"other"}
    (other,) = [u for u in ctx.coverage["unexplained"] if u["what"] == "category other"]
    assert "triton__0d1d2d" in other["note"]


def test_compiled_region_share_of_a_real_trace(hta_rank0):
    events, ctx = hta_rank0
    regions = _raw_regions(events)
    gpu = [e for e in events if e.get("cat") in GPU_CATS and e.get("ph") == "X"]
    inside = sum(round(e["dur"] * 1000) for e in gpu if regions[id(e)] is not None)
    assert ctx.coverage["compiled_regions"] == round(inside / sum(round(e["dur"] * 1000) for e in gpu), 4)
    assert f"{ctx.coverage['compiled_regions']:.0%} in torch.compile regions" in ctx.coverage["line"]


def test_compiled_regions_without_graphs_or_triton_on_a_real_trace(tmp_path):
    """hta/df_index_resolver.json.gz (facebookresearch/HolisticTraceAnalysis tests/data/df_index_resolver/): an
    AOTAutograd job whose CompiledFunction / CompiledFunctionBackward regions launch ATen kernels eagerly (no
    graph replay, no Triton): each kernel's region and the regions' share of GPU time, from the raw JSON."""
    src = shared_path("kineto", "hta", "df_index_resolver.json.gz")
    (tmp_path / src.name).write_bytes(src.read_bytes())
    events = json.loads(gzip.decompress(src.read_bytes()))["traceEvents"]
    ctx = JobContext(load(tmp_path, workers=1)[1])
    regions = _raw_regions(events)
    gpu = [e for e in events if e.get("cat") in GPU_CATS and e.get("ph") == "X"]
    by_region: dict[str, int] = {}
    for e in gpu:
        key = regions[id(e)] or ""
        by_region[key] = by_region.get(key, 0) + round(e["dur"] * 1000)
    att = ctx.op_attribution
    got = att.group_by(pl.col("region").fill_null("")).agg(pl.col("time_ns").sum())
    assert dict(got.iter_rows()) == by_region
    assert set(att["via"].to_list()) == {"launch"}
    total = sum(by_region.values())
    assert ctx.coverage["compiled_regions"] == round((total - by_region.get("", 0)) / total, 4) > 0.9


@pytest.fixture(scope="module")
def sim(tmp_path_factory):
    cache: dict[tuple, tuple] = {}

    def _run(scenario: str, **kw):
        key = (scenario, tuple(sorted((k, str(v)) for k, v in kw.items())))
        if key not in cache:
            from forensics.simulate import simulate

            out = tmp_path_factory.mktemp(scenario)
            simulate(scenario, out, seed=0, **kw)
            truth = json.loads((out / "truth.json").read_text())
            _, frames = load(out, workers=1)
            cache[key] = (truth, JobContext(frames))
        return cache[key]

    return _run


def _findings(ctx: JobContext) -> list[tuple]:
    found, _ = run_detectors(ctx)
    return [(f.detector, f.severity.value, f.title, tuple(f.ranks), f.gpu_seconds_lost) for f in found]


def test_graph_replay_finds_the_same_straggler_as_eager(sim):
    """The same engine run written eagerly and as graph replays: the same findings, and the graph share the
    writer put in the truth."""
    params = {"layers": "4"}
    truth, graphed = sim("graph_straggler", ranks=8, steps=3, params=params)
    _, eager = sim("ddp_straggler", ranks=8, steps=3, params=params)
    found = _findings(graphed)
    assert found == _findings(eager)
    assert any(f[0] == "straggler" and f[3] == (5,) for f in found)
    g = graphed.frames["kernels"].filter(pl.col("graph_replay"))
    exp = truth["expected"]["cuda_graphs"]
    assert g.height == exp["graph_kernels"]
    assert int((g["end_ns"] - g["start_ns"]).sum()) == exp["graph_kernel_ns"]
    assert graphed.coverage["graph_mapped_to_ops"] == 0.0
    # the steps are the eager ones: kernels of a replay belong to the step that launched it
    assert graphed.steps.select("rank", "step", "step_ns").equals(eager.steps.select("rank", "step", "step_ns"))


def test_a_profiled_capture_maps_replayed_kernels_to_the_ops_that_captured_them(sim):
    """graph_capture: the first profiled step captures the graph; every replay (that one and the later steps')
    is mapped kernel by kernel to the captured launches' ops, which are the eager job's ops."""
    truth, graphed = sim("graph_capture", ranks=4, steps=2, params={"layers": "2"})
    _, eager = sim("ddp_clean", ranks=4, steps=2, params={"layers": "2"})
    att = graphed.op_attribution
    assert att.filter(pl.col("via") == "graph replay").height == 0
    mapped = att.filter(pl.col("via") == "graph capture")
    assert mapped["kernels"].sum() == truth["expected"]["cuda_graphs"]["graph_kernels"]
    cols = ["rank", "category", "op", "kernels", "time_ns"]
    eager_compute = eager.op_attribution.filter(~pl.col("category").str.starts_with("nccl")
                                                & (pl.col("category") != "memcpy")).select(cols).sort(cols)
    assert mapped.select(cols).sort(cols).equals(eager_compute)
    assert graphed.coverage["graph_mapped_to_ops"] == graphed.coverage["graph_replayed"] > 0.9


def test_graph_kernels_do_not_make_a_rank_launch_bound(sim):
    from forensics.detectors.gpu_idle import launch_facts

    _, graphed = sim("graph_capture", ranks=4, steps=2, params={"layers": "2"})
    facts = launch_facts(graphed, [0, 1, 2, 3])
    # only the eager NCCL kernels and copies are left to judge launch overhead by: long kernels
    eager = graphed.frames["kernels"].filter(~pl.col("graph_replay") & (pl.col("rank") == 0))
    assert facts.filter(pl.col("rank") == 0)["median_kernel_us"].item() == pytest.approx(
        float((eager["end_ns"] - eager["start_ns"]).median()) / 1e3)


# --- torch.compile -----------------------------------------------------------------------------------------------


def test_a_compiled_kernel_of_a_real_trace_is_attributed_to_its_launcher_and_region(tmp_path):
    """tracelens/eager_trace.json.gz (AMD-AGI/TraceLens tests/traces/b200/eager_trace.json.gz, vLLM on B200): one
    inductor kernel, launched under a host op of its own name inside ``## Call CompiledFxGraph <hash> ##``."""
    src = shared_path("kineto", "tracelens", "eager_trace.json.gz")
    (tmp_path / "trace.json.gz").write_bytes(src.read_bytes())
    raw = json.loads(gzip.decompress(src.read_bytes()))["traceEvents"]
    triton = [e for e in raw if e.get("cat") == "kernel" and e["name"].startswith("triton_")]
    region = next(e["name"] for e in raw if str(e.get("name")).startswith("## Call CompiledFxGraph"))
    _, frames = load(tmp_path, workers=1)
    att = JobContext(frames).op_attribution.filter(pl.col("op").str.starts_with("triton_"))
    assert att["kernels"].sum() == len(triton) == 1
    row = att.row(0, named=True)
    assert (row["category"], row["op"], row["via"]) == ("elementwise", triton[0]["name"], "launch")
    assert row["region"] == region.removeprefix("## Call ").removesuffix(" ##")


def test_a_compiled_model_gets_triton_categories_regions_and_template_flops(sim):
    truth, ctx = sim("compiled", ranks=2, steps=2, params={"layers": "2"})
    exp = truth["expected"]["compiled"]
    tp = ctx.op_throughput.filter(pl.col("op").str.starts_with("triton_tem_"))
    assert int((tp["gflop_per_call"] * 1e9 * tp["calls"]).sum().__round__()) == exp["triton_template_flops"]
    assert int(tp["kernel_ns"].sum()) == exp["triton_template_ns"]
    att = ctx.op_attribution.filter(pl.col("op").str.starts_with("triton_"))
    assert att["kernels"].sum() == exp["triton_kernels"]
    assert att["time_ns"].sum() == exp["triton_kernel_ns"]
    assert set(att["region"].to_list()) == {"CompiledFunction", "CompiledFunctionBackward"}
    family = pl.col("op").str.extract(r"^(triton_[a-z]+)_")
    cats = dict(att.group_by(family).agg(pl.col("category").unique()).iter_rows())
    assert {k: sorted(v) for k, v in cats.items()} == {
        "triton_tem": ["gemm"], "triton_per": ["normalization"], "triton_red": ["normalization"],
        "triton_poi": ["elementwise"]}
    k = ctx.frames["kernels"].filter(pl.col("class") != "sync")
    total = int((k["end_ns"] - k["start_ns"]).sum())
    assert ctx.coverage["with_flop_model"] == round(exp["triton_template_ns"] / total, 4)
    # nothing else changes: the same findings as the eager job
    _, eager = sim("ddp_clean", ranks=2, steps=2, params={"layers": "2"})
    assert _findings(ctx) == _findings(eager)


def _graph_trace(launch_api: str, node_ids: bool) -> dict:
    """A hand-written rank-0 trace: one step, a graph launched once (``launch_api``) running three kernels that
    start out of node order (the graph's nodes 1 and 2 run on two streams), after a capture of three launches
    under aten::mm, aten::add, aten::relu in that order; with ``node_ids`` the kernels carry `graph id` / `graph
    node id` args."""
    ev: list[dict] = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 0.0,
                       "dur": 500.0, "args": {}},
                      {"ph": "X", "cat": "cuda_runtime", "name": "cudaStreamBeginCapture", "pid": 1, "tid": 1,
                       "ts": 1.0, "dur": 1.0, "args": {"correlation": 1}}]
    for i, op in enumerate(("aten::mm", "aten::add", "aten::relu")):
        ev.append({"ph": "X", "cat": "cpu_op", "name": op, "pid": 1, "tid": 1, "ts": 10.0 + 10 * i, "dur": 5.0,
                   "args": {"External id": 10 + i}})
        ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
                   "ts": 11.0 + 10 * i, "dur": 2.0, "args": {"External id": 10 + i, "correlation": 10 + i}})
    ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaStreamEndCapture", "pid": 1, "tid": 1, "ts": 50.0,
               "dur": 1.0, "args": {"correlation": 20}})
    ev.append({"ph": "X", "cat": "cuda_runtime", "name": launch_api, "pid": 1, "tid": 1, "ts": 60.0, "dur": 5.0,
               "args": {"External id": 30, "correlation": 30}})
    # node 0 (gemm) first; node 2 (relu) starts before node 1 (add), on another stream
    for node, (name, start, stream) in enumerate((("gemm_kernel", 100.0, 7), ("add_kernel", 160.0, 7),
                                                 ("relu_kernel", 150.0, 9))):
        args: dict = {"device": 0, "stream": stream, "correlation": 30, "External id": 30}
        if node_ids:
            args.update({"graph id": 5, "graph node id": 100 + node})
        ev.append({"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": stream, "ts": start, "dur": 40.0,
                   "args": args})
    return {"schemaVersion": 1, "distributedInfo": {"rank": 0, "world_size": 1}, "traceEvents": ev}


@pytest.mark.parametrize("launch_api", ["cudaGraphLaunch", "hipGraphLaunch"])
@pytest.mark.parametrize("node_ids", [True, False])
def test_a_capture_maps_kernels_by_graph_node_or_by_order(tmp_path, launch_api, node_ids):
    (tmp_path / "rank0.pt.trace.json").write_text(json.dumps(_graph_trace(launch_api, node_ids)))
    ctx = JobContext(load(tmp_path, workers=1)[1])
    k = ctx.frames["kernels"].sort("name")
    assert k["graph_replay"].to_list() == [True, True, True]
    assert k["graph_node_id"].to_list() == ([101, 100, 102] if node_ids else [None, None, None])
    att = ctx.op_attribution
    ops = dict(zip(att["kernel_names"].list.first().to_list(), att["op"].to_list()))
    assert set(att["via"].to_list()) == {"graph capture"}
    if node_ids:  # node order: relu is the graph's third node although it started second
        assert ops == {"gemm_kernel": "aten::mm", "add_kernel": "aten::add", "relu_kernel": "aten::relu"}
    else:  # start order: what a trace without node ids can tell
        assert ops == {"gemm_kernel": "aten::mm", "relu_kernel": "aten::add", "add_kernel": "aten::relu"}


def test_the_coverage_line_says_the_graph_share_in_summary_md_and_the_report_header(tmp_path):
    """#30 item 2: the coverage line is in findings.json, summary.md and the report's first view (the job header),
    and a share hiding more than 10% of GPU time (here: graph replays whose capture is not profiled) is said in
    words there, its figure the simulator's own."""
    import html
    import re

    from typer.testing import CliRunner

    from forensics.cli import app
    from forensics.simulate import simulate

    run, out = tmp_path / "run", tmp_path / "out"
    truth = simulate("graph_straggler", run, ranks=4, steps=2, seed=0, params={"layers": "2"})
    res = CliRunner().invoke(app, ["analyze", str(run), "--out", str(out), "-q", "--fail-on", "never",
                                   "--workers", "1"])
    assert res.exit_code == 0, res.output
    exp = truth["expected"]["cuda_graphs"]
    share = exp["graph_kernel_ns"] / exp["gpu_time_ns"]
    assert share > NOTE_SHARE
    cov = json.loads((out / "findings.json").read_text())["run"]["coverage"]
    assert (cov["gpu_time_ns"], cov["graph_replayed"]) == (exp["gpu_time_ns"], round(share, 4))
    sentence = f"{share:.1%} of GPU time is replayed from CUDA graphs whose capture is not in the trace"
    hidden = [u["note"] for u in cov["unexplained"] if u["share"] >= NOTE_SHARE]
    assert sentence in " ".join(hidden) and hidden == cov["notes"]
    md = (out / "summary.md").read_text()
    (line,) = [ln for ln in md.splitlines() if ln.startswith("**Coverage:**")]
    assert md.index("## Job") < md.index(line) < md.index("\n## ", md.index("## Job") + 1)  # in the Job section
    plain = re.sub(r"\\(.)", r"\1", line)  # md_text's escapes undone
    page = (out / "report.html").read_text()
    header = html.unescape(page[page.index('<header class="top">'):page.index("</header>")])
    for note in hidden:
        assert note.rstrip(".") in plain
        assert note.rstrip(".") in header
    # the replayed kernels keep their categories: nothing of them is a silent "other"
    assert cov["categories"].get("other", 0.0) < NOTE_SHARE
