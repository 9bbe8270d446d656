"""Many small files: N tiny Kineto traces (one rank each) analysed as one job; prints wall time
and peak RSS (this process and its children). Target (issue #13): 10,000 traces in <= 20 s and
<= 1 GB on 2 cores.

    python benchmarks/many_small_files.py [N] [--parse-only]
"""

from __future__ import annotations

import json
import resource
import sys
import tempfile
import time
from pathlib import Path


def make_traces(folder: Path, n: int) -> None:
    for rank in range(n):
        events = [
            {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 1000, "dur": 900},
            {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 1010, "dur": 100},
            {"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7, "ts": 1100, "dur": 300,
             "args": {"device": 0, "stream": 7, "correlation": 1}},
        ]
        doc = {"distributedInfo": {"rank": rank, "world_size": n}, "traceEvents": events}
        (folder / f"rank{rank}.pt.trace.json").write_text(json.dumps(doc))


def main() -> None:
    n = int(next((a for a in sys.argv[1:] if a.isdigit()), "10000"))
    parse_only = "--parse-only" in sys.argv
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        run_dir.mkdir()
        make_traces(run_dir, n)
        start = time.perf_counter()
        if parse_only:
            from forensics.analyze import load

            load(run_dir)
        else:
            from forensics.analyze import analyze

            analyze(run_dir)
        wall = time.perf_counter() - start
    peak = max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
    print(f"{n} traces ({'parse only' if parse_only else 'parse + detect'}): {wall:.1f} s, peak RSS {peak / 1024:.0f} MB")


if __name__ == "__main__":
    main()
