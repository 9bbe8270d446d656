"""Whole pipeline on the bundled samples and the real log samples: every findings.json validates, and the
injected faults are found where the simulator's ground truth says."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from forensics.reports import json_report

from forensics.pipeline import analyze
from tests.conftest import ROOT, SAMPLE_DATA, assert_valid_findings, shared_path

SAMPLES = sorted(p for p in (ROOT / "sample_traces").iterdir() if p.is_dir())
# Which detector must report the injected fault of each simulator fault kind.
DETECTOR_FOR_FAULT = {
    "compute_straggler": "straggler",
    "collective_timeout": "nccl_timeout",
    "xid": "gpu_hw_error",
    "nccl_algo_forced": "nccl_algorithm",
    "pipeline_bubbles_small_m": "pipeline_bubble",
}


def test_there_are_bundled_samples():
    assert {p.name for p in SAMPLES} >= {"ddp_straggler", "xid79", "pp_small_m", "algo_forced"}


@pytest.mark.parametrize("run", SAMPLES, ids=[p.name for p in SAMPLES])
def test_bundled_sample_is_analysed_and_its_fault_found(run: Path, findings_validator):
    truth = json.loads((run.parent / f"{run.name}.truth.json").read_text())
    analysis = analyze(run, workers=1)
    doc = assert_valid_findings(findings_validator, json.loads(json_report.render(analysis)))
    assert all(s["status"] == "ok" for s in doc["run"]["sources"]), doc["run"]["sources"]
    for fault in truth["faults"]:
        detector = DETECTOR_FOR_FAULT[fault["kind"]]
        hits = [f for f in doc["findings"] if f["detector"] == detector]
        assert hits, f"{run.name}: no {detector} finding for {fault['kind']}"
        if fault["ranks"]:
            assert any(set(fault["ranks"]) <= set(f["ranks"]) for f in hits), (fault, [f["ranks"] for f in hits])
        if fault["hosts"]:
            assert any(set(fault["hosts"]) <= set(f["hosts"]) for f in hits)


def test_every_real_log_sample_in_one_run_dir_gives_valid_findings(tmp_path: Path, findings_validator):
    shared_path()  # fails with a clear message when ../shared is missing
    run = tmp_path / "run"
    for folder in ("nccl_logs", "dmesg"):
        shutil.copytree(SAMPLE_DATA / folder, run / folder, ignore=shutil.ignore_patterns("SOURCES.md"))
    analysis = analyze(run, workers=1)
    doc = assert_valid_findings(findings_validator, json.loads(json_report.render(analysis)))
    kinds = {s["path"].split("/")[0]: set() for s in doc["run"]["sources"]}
    for s in doc["run"]["sources"]:
        kinds[s["path"].split("/")[0]].add((s["kind"], s["status"]))
    assert kinds["nccl_logs"] == {("nccl_log", "ok")}
    assert {k for k, _ in kinds["dmesg"]} <= {"dmesg", "nvidia_smi"} and {st for _, st in kinds["dmesg"]} == {"ok"}
    detectors = {f["detector"] for f in doc["findings"]}
    assert {"nccl_transport", "nccl_algorithm", "nccl_timeout", "gpu_hw_error"} <= detectors
    assert len({f["id"] for f in doc["findings"]}) == len(doc["findings"])  # ids are unique
