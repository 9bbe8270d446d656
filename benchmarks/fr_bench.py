"""Flight Recorder dumps at scale: `forensics analyze` on RANKS dumps of ENTRIES entries each.

    python benchmarks/fr_bench.py [--ranks 4096] [--entries 2000] [--workers 2] [--keep DIR]

Writes one pickle dump per rank of a hung TP=8 x PP=4 x DP job (one rank stuck on the device), each holding the
last ENTRIES/4 collectives of its four process groups (format 2.10, no stacks). The dumps are written with
Python's C pickler (protocol 2: the same data-only opcodes as torch's, plus memoized containers), because the
standard-library writer of the simulator (torch's exact bytes) takes minutes for 8 million entries. Then it
times `forensics analyze DIR` (the CLI, WORKERS parse processes) and samples the peak resident memory of the
whole process tree every 0.1 s from /proc.

Target (issue 26): 4,096 ranks x 2,000 entries in <= 30 s and <= 2 GB on 2 cores. Prints, from one run, the
figures (wall and CPU seconds, peak memory, the load average around it: wall time on a shared machine is only
meaningful beside it) and PASS/FAIL for each target; the verdict must also name the injected rank.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from _common import tree_rss

from forensics.simulate import flight_recorder as sim

TIME_LIMIT_S = 30.0
MEMORY_LIMIT = 2 << 30
CULPRIT = 1234


def _groups(ranks: int, entries: int) -> list:
    groups = sim.healthy(ranks)
    for g in groups:
        for r in g.ranks:  # deep enough rings for ENTRIES/4 entries per group
            g.enq[r] += entries
            g.comp[r] += entries
    sim.device_stuck(groups, CULPRIT % ranks)
    return groups


def _write(args: tuple[Path, int, int, int]) -> int:
    out, ranks, entries, lo = args
    groups = _groups(ranks, entries)
    size = 0
    for r in range(lo, min(ranks, lo + 256)):
        doc = sim.dump_doc(groups, r, "2.10", False, keep=entries // 4)
        data = pickle.dumps(doc, protocol=2)
        (out / f"comm_lib_trace_rank_{r}").write_bytes(data)
        size += len(data)
    return size


def make(out: Path, ranks: int, entries: int) -> int:
    out.mkdir(parents=True, exist_ok=True)
    with ProcessPoolExecutor(2) as pool:
        return sum(pool.map(_write, [(out, ranks, entries, lo) for lo in range(0, ranks, 256)]))


def run(run_dir: Path, workers: int) -> tuple[float, float, int, dict]:
    """(wall seconds, CPU seconds of the CLI and its workers, peak tree RSS bytes, findings.json) of one analysis."""
    out = Path(tempfile.mkdtemp(prefix="fr_bench_out_"))
    cmd = [sys.executable, "-m", "forensics.cli", "analyze", str(run_dir), "--out", str(out / "o"), "-q",
           "--workers", str(workers), "--only", "hang_verdict"]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    peak = 0
    while proc.poll() is None:
        peak = max(peak, tree_rss(proc.pid))
        time.sleep(0.1)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)  # the workers' too: the CLI reaped them
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    if proc.returncode not in (0, 1):
        sys.exit(f"analyze failed ({proc.returncode}): {proc.stderr.read().decode()[-2000:] if proc.stderr else ''}")
    doc = json.loads((out / "o" / "findings.json").read_text())
    shutil.rmtree(out, ignore_errors=True)
    return wall, cpu, peak, doc


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=4096)
    ap.add_argument("--entries", type=int, default=2000)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--keep", type=Path, help="write the dumps here and keep them (reused when present)")
    args = ap.parse_args()
    run_dir = args.keep or Path(tempfile.mkdtemp(prefix="fr_bench_"))
    t0 = time.perf_counter()
    if not any(run_dir.glob("comm_lib_trace_rank_*")):
        size = make(run_dir, args.ranks, args.entries)
        print(f"wrote {args.ranks} dumps, {size / 2**20:.0f} MiB, in {time.perf_counter() - t0:.1f} s")
    load = os.getloadavg()[0]
    wall, cpu, peak, doc = run(run_dir, args.workers)
    stuck = [f for f in doc["findings"] if f["detector"] == "hang_verdict" and f["metrics"].get("class") == "device"]
    named = stuck[0]["ranks"] if stuck else []
    print(f"{args.ranks} ranks x {args.entries} entries, {args.workers} worker(s), {os.cpu_count()} CPUs, load "
          f"average {load:.1f} before / {os.getloadavg()[0]:.1f} after: {cpu:.1f} s CPU (CLI and workers)")
    print(_verdict("time", f"{wall:.1f} s wall", f"{TIME_LIMIT_S:.0f} s", wall <= TIME_LIMIT_S))
    print(_verdict("memory", f"peak RSS {peak / 2**20:.0f} MiB", f"{MEMORY_LIMIT / 2**20:.0f} MiB",
                   peak <= MEMORY_LIMIT))
    print(_verdict("verdict", f"device-stuck rank(s) named {named}", f"injected {CULPRIT % args.ranks}",
                   named == [CULPRIT % args.ranks]))
    if not args.keep:
        shutil.rmtree(run_dir, ignore_errors=True)


def _verdict(target: str, measured: str, limit: str, ok: bool) -> str:
    return f"{target}: {measured} (target {limit}): {'PASS' if ok else 'FAIL'}"


if __name__ == "__main__":
    main()
