"""Flight Recorder dumps at scale: `forensics analyze` on RANKS dumps of ENTRIES entries each.

    python benchmarks/fr_bench.py [--ranks 4096] [--entries 2000] [--workers 2] [--keep DIR]

Writes one pickle dump per rank of a hung TP=8 x PP=4 x DP job (one rank stuck on the device), each holding the
last ENTRIES/4 collectives of its four process groups (format 2.10, no stacks). The dumps are written with
Python's C pickler (protocol 2: the same data-only opcodes as torch's, plus memoized containers), because the
standard-library writer of the simulator (torch's exact bytes) takes minutes for 8 million entries. Then it
times `forensics analyze DIR` (the CLI, WORKERS parse processes) and samples the peak resident memory of the
whole process tree every 0.1 s from /proc.

Target (issue 26): 4,096 ranks x 2,000 entries in <= 30 s and <= 2 GB on 2 cores. Prints the figures and
PASS/FAIL; the verdict must also name the injected rank.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from forensics.simulate import flight_recorder as sim

TIME_LIMIT_S = 30.0
MEMORY_LIMIT = 2 << 30
CULPRIT = 1234


def _tree_rss(pid: int) -> int:
    """Resident bytes of ``pid`` and its descendants."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as fh:
                    children.setdefault(int(fh.read().rsplit(")", 1)[1].split()[1]), []).append(int(entry))
            except (OSError, IndexError, ValueError):
                continue
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        todo += children.get(p, [])
        try:
            with open(f"/proc/{p}/statm") as fh:
                total += int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, IndexError, ValueError):
            pass
    return total


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


def run(run_dir: Path, workers: int) -> tuple[float, int, dict]:
    out = Path(tempfile.mkdtemp(prefix="fr_bench_out_"))
    cmd = [sys.executable, "-m", "forensics.cli", "analyze", str(run_dir), "--out", str(out / "o"), "-q",
           "--workers", str(workers), "--only", "hang_verdict"]
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    peak = 0
    while proc.poll() is None:
        peak = max(peak, _tree_rss(proc.pid))
        time.sleep(0.1)
    wall = time.perf_counter() - start
    if proc.returncode not in (0, 1):
        sys.exit(f"analyze failed ({proc.returncode}): {proc.stderr.read().decode()[-2000:] if proc.stderr else ''}")
    doc = json.loads((out / "o" / "findings.json").read_text())
    shutil.rmtree(out, ignore_errors=True)
    return wall, peak, doc


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
    wall, peak, doc = run(run_dir, args.workers)
    stuck = [f for f in doc["findings"] if f["detector"] == "hang_verdict" and f["metrics"].get("class") == "device"]
    named = stuck[0]["ranks"] if stuck else []
    ok_time, ok_mem, ok_verdict = wall <= TIME_LIMIT_S, peak <= MEMORY_LIMIT, named == [CULPRIT % args.ranks]
    print(f"{args.ranks} ranks x {args.entries} entries, {args.workers} worker(s): {wall:.1f} s wall "
          f"(limit {TIME_LIMIT_S:.0f} s), peak RSS {peak / 2**20:.0f} MiB (limit {MEMORY_LIMIT / 2**20:.0f} MiB), "
          f"device-stuck rank(s) named: {named} (injected {CULPRIT % args.ranks})")
    failed = [w for w, ok in (("time", ok_time), ("memory", ok_mem), ("verdict", ok_verdict)) if not ok]
    print(f"FAIL ({', '.join(failed)})" if failed else "PASS")
    if not args.keep:
        shutil.rmtree(run_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
