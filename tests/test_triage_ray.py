"""The Ray engine runs the same per-job function as the local pool: identical datasets and job files.

Ray is in the test extra (CI installs it); without it these tests fail, they are not skipped."""

from __future__ import annotations

import shutil
from pathlib import Path

import polars as pl

from tests.conftest import ROOT


def _triage(jobs: Path, out: Path, engine: str) -> pl.DataFrame:
    from forensics.reports import triage_json

    from forensics.cli import _triage_outputs
    from forensics.fleet.triage import find_jobs, run_triage

    run = run_triage(find_jobs([jobs]), out, engine=engine, workers=2, render=triage_json.job_files)
    try:
        _triage_outputs(run, out).commit()
    finally:
        run.cleanup()
    return pl.read_parquet(out / "triage.parquet").drop("analysed_at_ns")


def test_ray_and_local_engines_give_identical_datasets(ray_session, tmp_path: Path):
    jobs = tmp_path / "jobs"
    for name in ("xid79", "ddp_straggler", "pp_small_m"):
        shutil.copytree(ROOT / "sample_traces" / name, jobs / name)
    (jobs / "broken").mkdir()
    (jobs / "broken" / "rank0.pt.trace.json").write_bytes(b"{")
    local = _triage(jobs, tmp_path / "local", "local")
    on_ray = _triage(jobs, tmp_path / "ray", "ray")
    assert local.height == 4 and set(local["status"]) == {"ok", "failed"}
    assert on_ray.equals(local), (on_ray, local)
    for name in ("xid79", "ddp_straggler", "pp_small_m", "broken"):
        for file in ("findings.json", "summary.md"):
            assert (tmp_path / "ray" / "jobs" / name / file).read_bytes() == \
                (tmp_path / "local" / "jobs" / name / file).read_bytes(), (name, file)
