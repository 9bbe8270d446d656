"""`forensics analyze` / `forensics frames` on run folders built from copies of real traces."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import polars as pl

from tests.conftest import assert_valid_findings, run_cli, shared_path

DLRM = "param_dlrm_8rank"
W = "worker{r}_step_12.{ts}.pt.trace.json.gz"
TS = {0: "1694128201545", 1: "1694128201556", 2: "1694128201554"}


def _copy(run: Path, rel: str, *src: str) -> None:
    dest = run / rel
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(shared_path("kineto", *src), dest)


def test_analyze_run_dir_writes_valid_findings(tmp_path: Path, findings_validator):
    run = tmp_path / "run"
    for r in range(3):
        _copy(run, f"node0/{W.format(r=r, ts=TS[r])}", DLRM, W.format(r=r, ts=TS[r]))
    out = tmp_path / "out"
    res = run_cli("analyze", str(run), "--out", str(out), "--fail-on", "never")
    assert res.returncode == 0, res.stderr
    assert "Traceback" not in res.stderr
    doc = assert_valid_findings(findings_validator, out / "findings.json")
    assert (out / "summary.md").exists() and (out / "report.html").exists()
    text = json.dumps(doc)
    for r in range(3):
        assert W.format(r=r, ts=TS[r]) in text


def test_two_files_claiming_the_same_rank_fail_one_source(tmp_path: Path, findings_validator):
    run = tmp_path / "run"
    _copy(run, "a/rank1.json.gz", "hta", "df_index_resolver.json.gz")  # distributedInfo rank 1
    _copy(run, "b/w1.pt.trace.json.gz", DLRM, W.format(r=1, ts=TS[1]))  # distributedInfo rank 1
    frames_out = tmp_path / "frames"
    res = run_cli("frames", str(run), "--out", str(frames_out), "--quiet")
    assert res.returncode == 0, res.stderr
    sources = pl.read_parquet(frames_out / "sources.parquet").sort("path")
    assert sources.select("path", "status", "rank").rows() == [
        ("a/rank1.json.gz", "ok", 1),
        ("b/w1.pt.trace.json.gz", "failed", 1),
    ]
    assert "rank 1 is already claimed by a/rank1.json.gz" in sources.get_column("message")[1]
    kernels = pl.read_parquet(frames_out / "kernels.parquet")
    assert set(kernels.get_column("source")) == {"a/rank1.json.gz"}  # nothing merged from the loser
    assert kernels.height == 19370 + 2040 + 880  # compute+comm, memcpy, memset (independent count)
    res = run_cli("analyze", str(run), "--out", str(tmp_path / "out"), "--fail-on", "never", "--quiet")
    assert res.returncode == 0, res.stderr
    assert_valid_findings(findings_validator, tmp_path / "out" / "findings.json")


def test_trace_host_from_a_fqdn_file_name_is_the_short_name_nccl_logs_use(tmp_path):
    from forensics.parsers.kineto import parse
    from forensics.parsers.result import ParseContext

    trace = (
        '{"schemaVersion": 1, "distributedInfo": {"rank": 0, "world_size": 1}, "traceEvents": ['
        '{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 4242, "tid": 4242, "ts": 1.0, "dur": 2.0}]}'
    )
    name = "node7.cluster.example.org_4242.1700000000000.pt.trace.json"
    (tmp_path / name).write_text(trace)
    res = parse(tmp_path / name, ParseContext(tmp_path, name))
    assert res.host == "node7"
    assert res.frames["ranks"]["host"].to_list() == ["node7"]


def test_a_grid_past_int32_is_a_null_not_a_failed_source(tmp_path: Path, findings_validator):
    from tests.test_kineto_damaged import PAST_INT32, PAST_INT32_NOTE

    run = tmp_path / "run"
    run.mkdir()
    (run / "rank0.pt.trace.json").write_bytes(PAST_INT32)
    out = tmp_path / "out"
    res = run_cli("analyze", str(run), "--out", str(out), "--fail-on", "never")
    assert res.returncode == 0, res.stderr
    assert "Traceback" not in res.stderr and "internal" not in res.stderr
    doc = assert_valid_findings(findings_validator, out / "findings.json")
    [source] = doc["run"]["sources"]
    assert source["status"] == "ok" and PAST_INT32_NOTE in source["message"], source
