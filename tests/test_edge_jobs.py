"""Jobs with zero steps, zero ranks known or zero kernels (issue #13, item 7): every detector skips with a
reason or returns nothing, and every renderer (findings.json, summary.md, report.html) works. Each case is
built twice, as a Kineto trace and as an Nsight Systems export (tests/nsys_synth.py), and each fixture is
checked to really be the case it claims (so a fixture that drifts cannot make the test pass vacuously)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from forensics.reports import html, json_report, markdown

from forensics.detectors import load_all
from forensics.pipeline import Analysis, analyze
from tests.conftest import assert_valid_findings
from tests.nsys_synth import make_export

US = 1_000
STEP_DETECTORS = {"straggler", "exposed_comm", "busy_wait", "pipeline_bubble"}
CASES = ("no_steps", "no_rank", "no_kernels")


def _kineto_events(steps: bool, kernels: bool) -> list[dict]:
    events: list[dict] = []
    for i in range(3):
        t = 1_000 + i * 10_000  # microseconds, as Kineto writes them
        if steps:
            events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{i + 1}", "pid": 7, "tid": 7,
                           "ts": t, "dur": 9_000})
        events.append({"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 7, "tid": 7, "ts": t + 10, "dur": 100})
        if kernels:
            events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 7, "tid": 7,
                           "ts": t + 20, "dur": 5, "args": {"correlation": 100 + i}})
            events.append({"ph": "X", "cat": "kernel", "name": "void gemm_kernel<float>(float*)", "pid": 0, "tid": 7,
                           "ts": t + 40, "dur": 4_000,
                           "args": {"device": 0, "stream": 7, "correlation": 100 + i, "grid": [64, 1, 1]}})
            events.append({"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
                           "pid": 0, "tid": 13, "ts": t + 4_100, "dur": 2_000,
                           "args": {"device": 0, "stream": 13, "correlation": 200 + i, "grid": [8, 1, 1]}})
    return events


def kineto_run(tmp: Path, case: str) -> Path:
    run = tmp / f"kineto_{case}"
    run.mkdir()
    doc: dict = {"schemaVersion": 1, "traceEvents": _kineto_events(steps=case != "no_steps", kernels=case != "no_kernels")}
    if case == "no_rank":
        name = "node_trace.json"  # no rank in the name, no distributedInfo
    else:
        doc["distributedInfo"] = {"rank": 0, "world_size": 1, "backend": "nccl"}
        name = "rank0.pt.trace.json"
    (run / name).write_text(json.dumps(doc))
    return run


def nsys_run(tmp: Path, case: str) -> Path:
    run = tmp / f"nsys_{case}"
    run.mkdir()
    kernels, runtime, nvtx = [], [], []
    for i in range(3):
        t = 1_000_000 + i * 10_000_000  # ns
        if case != "no_steps":
            nvtx.append((t, t + 9_000_000, 59, 42, 43, f"ProfilerStep#{i + 1}", 0, None, None))
        if case != "no_kernels":
            runtime.append((t + 20 * US, t + 25 * US, 42, 43, 100 + i, "cudaLaunchKernel_v7000"))
            kernels.append((t + 40 * US, t + 4_040 * US, 0, 7, 100 + i, 42, "void gemm_kernel<float>(float*)", 64))
    env = None if case == "no_rank" else {"RANK": "0", "WORLD_SIZE": "1"}
    make_export(run / "report.sqlite", env=env, kernels=kernels, runtime=runtime, nvtx=nvtx)
    return run


def _check_case(analysis: Analysis, case: str) -> None:
    """The fixture is what it claims to be."""
    frames = analysis.frames
    assert analysis.sources["status"].to_list() == ["ok"], analysis.sources.rows()
    if case == "no_steps":
        assert frames["steps"].height == 0 and frames["kernels"].height > 0
    elif case == "no_rank":
        assert frames["steps"].height > 0 and frames["kernels"].height > 0
        assert frames["kernels"]["rank"].null_count() == frames["kernels"].height or analysis.context.ranks in ([], [0])
    else:
        assert frames["kernels"].height == 0 and frames["steps"].height > 0


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("build", [kineto_run, nsys_run], ids=["kineto", "nsys"])
def test_every_detector_and_renderer_copes(tmp_path: Path, build, case: str, findings_validator):
    analysis = analyze(build(tmp_path, case), workers=1)
    _check_case(analysis, case)
    registry = load_all()
    skipped = {s.detector: s.reason for s in analysis.skipped}
    assert all(reason.strip() for reason in skipped.values())  # a skip always says why
    assert set(skipped) <= set(registry)
    if case == "no_kernels":
        # no GPU activity to measure steps with: those detectors skip or say nothing, never guess
        # (without profiler steps but with kernels they measure one whole-trace pseudo-step instead)
        assert not [f for f in analysis.findings if f.detector in STEP_DETECTORS]
    doc = json.loads(json_report.render(analysis))
    assert_valid_findings(findings_validator, doc)
    assert doc["run"]["steps_analyzed"] == (None if case == "no_steps" else 3)
    md = markdown.render(analysis)
    assert md.startswith("# forensics") and "## Findings" in md
    page = html.render(analysis)
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
