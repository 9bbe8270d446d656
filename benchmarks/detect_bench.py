"""Detector time next to parse time on a simulated multi-rank job, in one run, side by side.

    python benchmarks/detect_bench.py [--ranks 64] [--steps 5] [--scenario ddp_straggler] [--workers N]

Simulates the job into a temporary RUN_DIR (or uses --run-dir), then times, in this process:
  parse     discovery + Kineto parsing of every rank's trace into frames (forensics.pipeline.load)
  match     collective matching across ranks (forensics.facts.collectives)
  breakdown per-rank/step interval algebra (forensics.facts.breakdown)
  detectors the four trace detectors end to end (straggler, exposed_comm, busy_wait, pipeline_bubble),
            on fresh frames so no cached analysis is reused
and prints one table. Figures depend on the machine and its load; run it on an idle one.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from forensics.base.frames import JobFrames  # noqa: E402
from forensics.detectors import run_detectors  # noqa: E402
from forensics.facts.breakdown import compute_breakdown  # noqa: E402
from forensics.facts.collectives import match_collectives  # noqa: E402
from forensics.facts.context import JobContext  # noqa: E402
from forensics.pipeline import load  # noqa: E402

TRACE_DETECTORS = ["busy_wait", "exposed_comm", "pipeline_bubble", "straggler"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=64)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--scenario", default="ddp_straggler")
    ap.add_argument("--run-dir", type=Path, default=None, help="use an existing RUN_DIR instead of simulating")
    ap.add_argument("--workers", type=int, default=None, help="parser processes (default: the pipeline's choice)")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        run_dir = args.run_dir
        if run_dir is None:
            from forensics.simulate import simulate

            run_dir = Path(tmp) / "run"
            t = time.perf_counter()
            simulate(args.scenario, run_dir, ranks=args.ranks, steps=args.steps)
            sim_s = time.perf_counter() - t
        else:
            sim_s = float("nan")
        size = sum(p.stat().st_size for p in run_dir.rglob("*") if p.is_file())

        t = time.perf_counter()
        _, frames = load(run_dir, workers=args.workers)
        parse_s = time.perf_counter() - t

        fresh = JobFrames({n: frames[n] for n in frames.present if n in frames}, present=frames.present)
        t = time.perf_counter()
        match = match_collectives(fresh)
        match_s = time.perf_counter() - t
        t = time.perf_counter()
        compute_breakdown(fresh, match)
        breakdown_s = time.perf_counter() - t

        fresh = JobFrames({n: frames[n] for n in frames.present if n in frames}, present=frames.present)
        t = time.perf_counter()
        findings, skipped = run_detectors(JobContext(fresh), only=TRACE_DETECTORS)
        detect_s = time.perf_counter() - t

    k = frames["kernels"].height
    print(f"job: {args.scenario}, {args.ranks} ranks x {args.steps} steps, {size / 1e6:.1f} MB on disk, "
          f"{k:,} GPU events, {frames['cpu_ops'].height:,} CPU events (simulated in {sim_s:.1f} s)")
    print(f"{'stage':<28}{'seconds':>10}{'x parse':>10}")
    for name, sec in (("parse (discovery + Kineto)", parse_s), ("  collective matching", match_s),
                      ("  step breakdown", breakdown_s), ("4 trace detectors (total)", detect_s)):
        print(f"{name:<28}{sec:>10.3f}{sec / parse_s:>10.3f}")
    print(f"findings: {', '.join(f'{f.detector}:{f.title}' for f in findings) or 'none'}; "
          f"skipped: {', '.join(s.detector for s in skipped) or 'none'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
