"""Partial inputs for the trace detectors: a job of which only some ranks' traces are given.

Built two independent ways: hand-built frames filtered to some ranks (the ``ranks`` and
``process_groups`` frames still say how many ranks the job has), and simulator runs whose other ranks'
trace files are deleted before parsing (the job's size then comes from the trace metadata and the
NCCL logs, as with a real partial upload).
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from forensics.base.frames import JobFrames

PER_RANK = ("kernels", "cpu_ops", "steps")


def only_ranks(frames: JobFrames, keep: set[int]) -> JobFrames:
    """The same job with the per-rank event frames of ``keep`` only; job metadata is kept whole."""
    out = {name: frames[name] for name in frames.present}
    for name in PER_RANK:
        if name in out:
            out[name] = out[name].filter(pl.col("rank").is_in(sorted(keep)))
    return JobFrames(out)


def simulate_with_traces_of(tmp_path: Path, scenario: str, keep: set[int], **kw) -> tuple[dict, JobFrames]:
    """Simulate ``scenario``, delete every trace file but those of ranks ``keep``, parse what is left."""
    from forensics.pipeline import load
    from forensics.simulate import simulate

    run = tmp_path / "run"
    truth = simulate(scenario, run, truth_path=tmp_path / "truth.json", **kw)
    for r in truth["ranks"]:
        if r["rank"] not in keep:
            (run / r["trace"]).unlink()
    left = sorted(p.name for p in (run / "profiler").iterdir())
    assert len(left) == len(keep), left
    _, frames = load(run, workers=1)
    return truth, frames
