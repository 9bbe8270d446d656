"""Many small files: N tiny Kineto traces (one rank each) analysed as one job, end to end
(`forensics analyze RUN --out OUT`, reports included) in a child process. Prints, per N, the wall
time, the CPU time of the whole process tree, and its peak RSS (the sum over the CLI process and
its workers, sampled from /proc every 20 ms), and checks the target of issue #13: 10,000 traces
in <= 20 s and <= 1 GB on 2 cores.

    python benchmarks/many_small_files.py [N ...] [--cores C] [--parse-only]

N defaults to 1000 and 10000. ``--cores`` (default 2) pins the run to that many CPUs and gives the
CLI as many workers. ``--parse-only`` times discovery and parsing alone (``forensics.pipeline.load``).
Wall time depends on what else runs on the machine: the load average is printed with the figures.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TARGET_FILES, TARGET_S, TARGET_MB = 10_000, 20.0, 1024

_LOAD = """
import sys
from pathlib import Path
from forensics.pipeline import load

if __name__ == "__main__":
    load(Path(sys.argv[1]), workers=int(sys.argv[2]))
"""


def make_traces(folder: Path, n: int) -> None:
    """Traces of one step each, distinct ranks: a kernel, an NCCL all-reduce and its host call."""
    for rank in range(n):
        events = [
            {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 1000, "dur": 900},
            {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 1010, "dur": 100},
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 1020, "dur": 5,
             "args": {"correlation": 1}},
            {"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7, "ts": 1100, "dur": 300,
             "args": {"device": 0, "stream": 7, "correlation": 1}},
            {"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "pid": 1, "tid": 1, "ts": 1200, "dur": 20,
             "args": {"Collective name": "allreduce", "In msg nelems": 1024, "Out msg nelems": 1024,
                      "dtype": "Float", "Process Group Name": "0", "Group size": n}},
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 1210, "dur": 5,
             "args": {"correlation": 2}},
            {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*)",
             "pid": 0, "tid": 20, "ts": 1450, "dur": 200, "args": {"device": 0, "stream": 20, "correlation": 2}},
        ]
        doc = {"distributedInfo": {"rank": rank, "world_size": n, "backend": "nccl"}, "traceEvents": events}
        (folder / f"rank{rank}.pt.trace.json").write_text(json.dumps(doc))


def _tree_rss_kb(root: int) -> int:
    """RSS of ``root`` and its descendants, kB (0 for processes that vanish meanwhile)."""
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        try:
            with open(f"/proc/{pid}/status") as fh:
                total += next((int(line.split()[1]) for line in fh if line.startswith("VmRSS:")), 0)
            with open(f"/proc/{pid}/task/{pid}/children") as fh:
                todo.extend(int(p) for p in fh.read().split())
        except (OSError, ValueError):
            continue
    return total


def run_one(n: int, cores: int, parse_only: bool) -> tuple[float, float, float]:
    """(wall s, CPU s of the process tree, peak tree RSS MB) of one run on ``n`` fresh traces."""
    with tempfile.TemporaryDirectory() as tmp:
        run_dir, out = Path(tmp) / "run", Path(tmp) / "out"
        run_dir.mkdir()
        make_traces(run_dir, n)
        if parse_only:
            cmd = [sys.executable, "-c", _LOAD, str(run_dir), str(cores)]
        else:
            cli = Path(sys.executable).with_name("forensics")
            cmd = [str(cli), "analyze", str(run_dir), "--out", str(out), "-q", "--fail-on", "never", "--workers", str(cores)]
        cpus = sorted(os.sched_getaffinity(0))[:cores]
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, preexec_fn=lambda: os.sched_setaffinity(0, cpus))
        peak = 0
        while proc.poll() is None:
            peak = max(peak, _tree_rss_kb(proc.pid))
            time.sleep(0.02)
        wall = time.perf_counter() - start
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if proc.returncode != 0:
            raise SystemExit(f"{' '.join(cmd[:2])} exited {proc.returncode}")
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return wall, cpu, peak / 1024


def main() -> None:
    args = sys.argv[1:]
    cores = 2
    if "--cores" in args:
        cores = int(args.pop(args.index("--cores") + 1))
    sizes = [int(a) for a in args if a.isdigit()] or [1000, TARGET_FILES]
    parse_only = "--parse-only" in args
    what = "discovery + parsing" if parse_only else "forensics analyze, end to end"
    print(f"{what}; {cores} cores; load average {os.getloadavg()[0]:.1f} at start")
    for n in sizes:
        wall, cpu, peak = run_one(n, cores, parse_only)
        line = f"{n:>6} traces: {wall:6.1f} s wall, {cpu:6.1f} s CPU, peak RSS {peak:5.0f} MB"
        if n == TARGET_FILES:
            ok = wall <= TARGET_S and peak <= TARGET_MB
            line += f"   target <= {TARGET_S:.0f} s and <= {TARGET_MB} MB: {'PASS' if ok else 'FAIL'}"
        print(line, flush=True)
    print(f"load average {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    main()
