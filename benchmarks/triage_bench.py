"""Triage many small simulated jobs: wall time and peak memory against the issue-17 targets.

    python benchmarks/triage_bench.py [--jobs 1000] [--engine local|ray] [--workers N] [--keep DIR]

Makes a few small jobs with `forensics simulate` (4 ranks, 3 steps; a straggler, an Xid 79, a clean
job, rotating), copies them into JOBS folders, then times `forensics triage` on a tenth of them and on
all of them, and a second run over all of them (nothing changed: the incremental path). Memory is the
peak resident set of the whole process tree (the CLI and its workers), sampled every 0.1 s from /proc.

Targets: all jobs in <= 300 s; memory flat: the peak for all jobs at most 1.25 x the peak for a tenth
(+ 64 MB of slack for the per-job records the parent keeps).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import tree_rss

SCENARIOS = ("ddp_straggler", "xid79", "ddp_clean")
TIME_LIMIT_S = 300.0


def run(cmd: list[str]) -> tuple[float, int, float, subprocess.CompletedProcess[str]]:
    """(wall seconds, peak tree RSS bytes, CPU seconds of the whole tree, result) of one command."""
    cpu0 = _children_cpu()
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peak = 0
    while proc.poll() is None:
        peak = max(peak, tree_rss(proc.pid))
        time.sleep(0.1)
    out, err = proc.communicate()
    wall = time.perf_counter() - start
    return wall, peak, _children_cpu() - cpu0, subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def _children_cpu() -> float:
    """User + system CPU seconds of every waited-for descendant (the CLI reaps its workers)."""
    import resource

    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def make_jobs(base: Path, n: int) -> Path:
    cli = [sys.executable, "-m", "forensics.cli"]
    seeds = base / "seeds"
    for sc in SCENARIOS:
        subprocess.run([*cli, "simulate", sc, "--out", str(seeds / sc), "--ranks", "4", "--steps", "3"],
                       check=True, capture_output=True)
        (seeds / sc / "truth.json").unlink()
    jobs = base / "jobs"
    for i in range(n):
        shutil.copytree(seeds / SCENARIOS[i % len(SCENARIOS)], jobs / f"job{i:05d}")
    return jobs


def _subset(jobs: Path, n: int, base: Path) -> Path:
    sub = base / "subset"
    sub.mkdir()
    for d in sorted(jobs.iterdir())[:n]:
        shutil.copytree(d, sub / d.name)
    return sub


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=1000)
    ap.add_argument("--engine", choices=("local", "ray"), default="local")
    ap.add_argument("--workers", type=int, default=None)
    ap.add_argument("--keep", type=Path, default=None, help="work in this folder and keep it")
    args = ap.parse_args()
    base = args.keep or Path(tempfile.mkdtemp(prefix="triage-bench-"))
    base.mkdir(parents=True, exist_ok=True)
    try:
        jobs = make_jobs(base, args.jobs)
        small = _subset(jobs, max(1, args.jobs // 10), base)
        cli = [sys.executable, "-m", "forensics.cli", "triage", "-q", "--engine", args.engine]
        if args.workers:
            cli += ["--workers", str(args.workers)]
        figures = {}
        for label, root, out in (("tenth", small, base / "out_small"), ("all", jobs, base / "out"),
                                 ("again", jobs, base / "out")):
            wall, peak, cpu, res = run([*cli, str(root), "--out", str(out)])
            if res.returncode not in (0, 1):
                print(res.stderr, file=sys.stderr)
                return 2
            figures[label] = (wall, peak)
            n = len(list(root.iterdir()))
            print(f"{label:>5}: {n} jobs in {wall:.1f} s ({n / wall:.1f} jobs/s), CPU {cpu:.1f} s "
                  f"({cpu / n:.2f} s a job), peak RSS {peak / 2**20:.0f} MB (process tree), engine {args.engine}, "
                  f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}", flush=True)
        wall_all, peak_all = figures["all"]
        peak_small = figures["tenth"][1]
        time_ok = wall_all <= TIME_LIMIT_S
        mem_ok = peak_all <= 1.25 * peak_small + 64 * 2**20
        print(f"{'PASS' if time_ok else 'FAIL'} time: {args.jobs} jobs in {wall_all:.1f} s (target <= "
              f"{TIME_LIMIT_S:.0f} s)")
        print(f"{'PASS' if mem_ok else 'FAIL'} memory: peak {peak_all / 2**20:.0f} MB for {args.jobs} jobs vs "
              f"{peak_small / 2**20:.0f} MB for {max(1, args.jobs // 10)} (flat: <= 1.25x + 64 MB)")
        print(f"incremental second run, nothing changed: {figures['again'][0]:.1f} s")
        return 0 if time_ok and mem_ok else 1
    finally:
        if args.keep is None:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
