"""`forensics analyze` end to end on the two real multi-node per-rank nsys jobs (Ring and Tree AllReduce,
2 nodes x 3 GPUs, with the job's NCCL_DEBUG log), copied to a temporary folder."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from forensics.pipeline import analyze
from tests.conftest import ROOT, assert_valid_findings, shared_path

JOBS = {
    "ring": ("DistributedSysLab_FS24/ring_simple_2nodes_6gpus_job508813", "RING"),
    "tree": ("DistributedSysLab_FS24/tree_simple_2nodes_6gpus_job508838", "TREE"),
}
# rank -> (host, pid) from the per-rank tables of sample_data/nsys/SOURCES.md
EXPECTED = {
    "ring": {0: ("ault43", 485050), 1: ("ault43", 485052), 2: ("ault43", 485055),
             3: ("ault44", 739538), 4: ("ault44", 739541), 5: ("ault44", 739537)},
    "tree": {0: ("ault43", 491768), 1: ("ault43", 491764), 2: ("ault43", 491770),
             3: ("ault44", 742412), 4: ("ault44", 742406), 5: ("ault44", 742413)},
}


def job_copy(tmp_path: Path, key: str) -> Path:
    src = shared_path("nsys", JOBS[key][0])
    dst = tmp_path / key
    # the golden CSVs are not part of what a job leaves behind
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("nsys2023.4.4_reference"))
    for p in [dst, *dst.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    return dst


@pytest.mark.parametrize("key", sorted(JOBS))
def test_analyze_multinode_job(tmp_path, key):
    run_dir = job_copy(tmp_path, key)
    result = analyze(run_dir, workers=1)
    src = result.sources
    nsys = src.filter(pl.col("path").str.ends_with(".sqlite"))
    assert nsys.height == 6 and set(nsys["status"]) == {"ok"}
    # rank and host of every file from its captured environment, never from file order
    got = {r: (h, int(p.rsplit("_", 1)[1].removesuffix(".sqlite"))) for p, r, h in nsys.select("path", "rank", "host").iter_rows()}
    assert got == EXPECTED[key]
    ctx = result.context
    assert ctx.ranks == [0, 1, 2, 3, 4, 5] and ctx.hosts == ["ault43", "ault44"] and ctx.world_size == 6
    # a .nsys-rep next to an export (the Ring job keeps all six) is recognised and left alone
    reps = src.filter(pl.col("path").str.ends_with(".nsys-rep"))
    n_reps = {"ring": 6, "tree": 0}[key]
    assert sorted(reps["path"]) == sorted(p.name for p in run_dir.glob("*.nsys-rep")) and reps.height == n_reps
    assert reps["status"].to_list() == ["ignored"] * n_reps
    assert src.filter(pl.col("path").str.ends_with(".o"))["kind"].to_list() == ["nccl_log"]
    # one AllReduce kernel per rank, on the device SOURCES.md lists, algorithm hint as NCCL_ALGO said
    comm = result.frames["kernels"].filter(pl.col("class") == "comm").sort("rank")
    assert comm["rank"].to_list() == [0, 1, 2, 3, 4, 5]
    assert comm["device"].to_list() == [0, 1, 2, 0, 1, 2]
    assert set(comm["collective"]) == {"allreduce"} and set(comm["name_algo"]) == {JOBS[key][1]}
    calls = result.frames["comms"].sort("rank")
    assert calls.select("rank", "collective").rows() == [(r, "allreduce") for r in range(6)]
    assert calls["kernel_correlation"].null_count() == 0


def test_cli_analyze_writes_valid_report(tmp_path, findings_validator):
    run_dir = job_copy(tmp_path, "ring")
    out = tmp_path / "out"
    res = subprocess.run([sys.executable, "-m", "forensics.cli", "analyze", str(run_dir), "--out", str(out), "--quiet"],
                         capture_output=True, text=True, cwd=ROOT)
    doc = assert_valid_findings(findings_validator, out / "findings.json")
    # every file of the copy is listed once as a source (read from disk here, not from the tool)
    on_disk = sorted(p.relative_to(run_dir).as_posix() for p in run_dir.rglob("*") if p.is_file())
    assert sorted(s["path"] for s in doc["run"]["sources"]) == on_disk
    assert (doc["run"]["ranks"], doc["run"]["hosts"]) == (sorted(EXPECTED["ring"]), ["ault43", "ault44"])
    assert "6 rank(s) on 2 host(s)" in (out / "summary.md").read_text()
    # the job's log says both nodes fell back to TCP sockets (`NET/Socket : Using`): a critical finding on
    # both hosts, so the default --fail-on critical exits 1
    log = next(run_dir.glob("*.o")).read_text()
    socket_hosts = sorted({line.split(":", 1)[0] for line in log.splitlines() if "NCCL INFO NET/Socket : Using" in line})
    assert socket_hosts == ["ault43", "ault44"]
    critical = [f for f in doc["findings"] if f["severity"] == "critical"]
    assert [(f["detector"], f["hosts"]) for f in critical] == [("nccl_transport", socket_hosts)]
    assert res.returncode == 1, res.stderr


@pytest.mark.parametrize("key", sorted(JOBS))
def test_nccl_log_algorithm_joins_trace_collectives(tmp_path, key):
    """The job's NCCL_DEBUG log says which algorithm NCCL was told to use, per process; the trace's
    collectives join it on (host, pid), which both sources name the same way (short host name)."""
    result = analyze(job_copy(tmp_path, key), workers=1)
    env = result.frames["nccl_env"].filter(pl.col("var") == "NCCL_ALGO").select("host", "pid", "value").unique()
    comm = result.frames["kernels"].filter(pl.col("class") == "comm").select("rank", "source", "name_algo")
    ranks = result.frames["ranks"].select("rank", "host", "pid", "source")
    joined = comm.join(ranks, on=["rank", "source"]).join(env, on=["host", "pid"], how="left").sort("rank")
    assert joined["rank"].to_list() == [0, 1, 2, 3, 4, 5]
    expected = {"ring": "Ring", "tree": "Tree"}[key]
    assert joined["value"].to_list() == [expected] * 6
    assert (joined["name_algo"].str.to_lowercase() == joined["value"].str.to_lowercase()).all()


@pytest.mark.parametrize("key,last_rank", [("ring", 2), ("tree", 0)])
def test_allreduce_matched_across_ranks(tmp_path, key, last_rank):
    """The six AllReduce kernels form one matched instance; the last to arrive is the rank with the
    shortest kernel (SOURCES.md per-rank tables: Ring rank 2, 15.541 ms; Tree rank 0, 39.464 ms) and the
    transfer time is that shortest duration (read here from the raw exports with SQL)."""
    import sqlite3

    from forensics.facts.collectives import match_collectives

    run_dir = job_copy(tmp_path, key)
    durations = []
    for f in sorted(run_dir.glob("*.sqlite")):
        con = sqlite3.connect(f"file:{f}?mode=ro&immutable=1", uri=True)
        durations.append(con.execute("SELECT end - start FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0])
        con.close()
    result = analyze(run_dir, workers=1)
    m = match_collectives(result.frames)
    assert m.instances.height == 1
    inst = m.instances.row(0, named=True)
    assert (inst["collective"], inst["n_ranks"], inst["last_rank"]) == ("allreduce", 6, last_rank)
    assert inst["transfer_ns"] == min(durations)
    assert m.kernels["matched"].all()
