"""`analyze` and `triage` with ``--engine ray --ray-address ADDR`` against a Ray cluster of two nodes started as
separate processes with token authentication (tests/ray_cluster.py): the same outputs as the local engine. A
client without the cluster's token, or with a wrong one, gets exit 2 and one line saying what to set.

Ray is in the test extra, which CI installs: without it these tests fail, they are not skipped."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import polars as pl
import pytest

from tests.conftest import ROOT, require_ray
from tests.ray_cluster import RayCluster, new_cluster, remove


@pytest.fixture(scope="module")
def cluster() -> Iterator[RayCluster]:
    require_ray()
    c = new_cluster()
    try:
        c.start()
        yield c
    finally:
        try:
            c.stop()
        finally:
            remove(c)


def _cli(*args: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "forensics.cli", *args], capture_output=True, text=True, cwd=cwd,
                          env=env, timeout=600)


def _run_dir(tmp_path: Path) -> Path:
    """A simulated job with a broken trace (a failed source must come back in its place too)."""
    run = tmp_path / "job"
    shutil.copytree(ROOT / "sample_traces" / "ddp_straggler", run)
    (run / "profiler" / "zz_broken.pt.trace.json").write_bytes(b"{")
    return run


def test_analyze_on_a_two_node_cluster_writes_what_the_local_engine_writes(cluster: RayCluster, tmp_path: Path):
    _run_dir(tmp_path)
    local = _cli("analyze", "job", "--out", "local", "-q", "--fail-on", "never", env=cluster.env(), cwd=tmp_path)
    assert local.returncode == 0, local.stderr
    before = {name: cluster.tasks_run(name, "_parse_worker") for name in ("head", "node2")}
    # a relative RUN_DIR: the cluster's workers run in another folder, so the paths they get must be absolute
    on_ray = _cli("analyze", "job", "--out", "ray", "-q", "--fail-on", "never", "--engine", "ray",
                  "--ray-address", cluster.address, env=cluster.env(), cwd=tmp_path)
    assert on_ray.returncode == 0, on_ray.stderr
    assert on_ray.stdout.replace("Report: ray", "Report: local") == local.stdout, (on_ray.stdout, local.stdout)
    for name in ("findings.json", "summary.md", "collectives.parquet"):
        assert (tmp_path / "ray" / name).read_bytes() == (tmp_path / "local" / name).read_bytes(), name
    assert b'"status": "failed"' in (tmp_path / "ray" / "findings.json").read_bytes()
    for name in ("head", "node2"):  # both nodes parsed
        assert cluster.tasks_run(name, "_parse_worker") > before[name], name


def test_triage_on_a_two_node_cluster_gives_the_local_dataset(cluster: RayCluster, tmp_path: Path):
    jobs = tmp_path / "jobs"
    for name in ("xid79", "ddp_straggler", "pp_small_m"):
        shutil.copytree(ROOT / "sample_traces" / name, jobs / name)
    (jobs / "broken").mkdir()
    (jobs / "broken" / "rank0.pt.trace.json").write_bytes(b"{")
    local = _cli("triage", "jobs", "--out", "local", "-q", env=cluster.env(), cwd=tmp_path)
    assert local.returncode == 0, local.stderr
    on_ray = _cli("triage", "jobs", "--out", "ray", "-q", "--engine", "ray", "--ray-address", cluster.address,
                  env=cluster.env(), cwd=tmp_path)
    assert on_ray.returncode == 0, on_ray.stderr
    assert all(cluster.tasks_run(name, "analyze_job") > 0 for name in ("head", "node2"))
    data = {out: pl.read_parquet(tmp_path / out / "triage.parquet").drop("analysed_at_ns") for out in ("local", "ray")}
    assert data["local"].height == 4 and set(data["local"]["status"]) == {"ok", "failed"}
    assert data["ray"].equals(data["local"]), data
    for name in ("xid79", "ddp_straggler", "pp_small_m", "broken"):
        for file in ("findings.json", "summary.md"):
            assert (tmp_path / "ray" / "jobs" / name / file).read_bytes() == \
                (tmp_path / "local" / "jobs" / name / file).read_bytes(), (name, file)


# Ray retries a refused connection for 20 s before it gives up; the tests shorten that to 2 (the same path)
_FAST = {"RAY_gcs_server_port_wait_time_s": "2"}


@pytest.mark.parametrize("client", ["wrong token", "no token, token mode unset", "token mode, no token"])
def test_a_client_without_the_cluster_s_token_gets_one_line_and_exit_2(cluster: RayCluster, tmp_path: Path,
                                                                       client: str):
    empty_home = tmp_path / "home"  # no ~/.ray/auth_token to fall back on
    empty_home.mkdir()
    token_file = tmp_path / "wrong-token"
    token_file.write_text("0" * 32)
    env = {
        "wrong token": cluster.env(RAY_AUTH_TOKEN_PATH=str(token_file), **_FAST),
        "no token, token mode unset": cluster.env(RAY_AUTH_MODE="", RAY_AUTH_TOKEN_PATH="", HOME=str(empty_home),
                                                  **_FAST),
        "token mode, no token": cluster.env(RAY_AUTH_TOKEN_PATH="", HOME=str(empty_home), **_FAST),
    }[client]
    res = _cli("analyze", str(ROOT / "sample_traces" / "xid79"), "--out", "out", "-q", "--engine", "ray",
               "--ray-address", cluster.address, env=env, cwd=tmp_path)
    assert res.returncode == 2, (res.returncode, res.stderr)
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, res.stderr
    assert "RAY_AUTH_TOKEN" in lines[0] and "RAY_AUTH_MODE=token" in lines[0], lines[0]
    assert "Traceback" not in res.stderr and "bug" not in res.stderr
    assert not (tmp_path / "out").exists()
