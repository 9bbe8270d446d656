"""How `forensics analyze --engine ray` divides its time and memory between the Ray workers and the driver.

    python benchmarks/ray_split.py RUN_DIR [RUN_DIR...]                 # a local Ray session (ray.init)
    python benchmarks/ray_split.py RUN_DIR --ray-address HOST:PORT      # a running cluster (its token in the env)
    python benchmarks/ray_split.py --simulate 1024 --simulate 4096 --cache /tmp/forensics-bench

Each RUN_DIR is analysed in a fresh child process (the driver) that runs the pipeline's phases as
benchmarks/phases.py does, with the parse on Ray. The driver's own CPU seconds and peak RSS are read after each
phase; every parse task reports its CPU seconds (all the threads of its worker process), wall time and its worker's
peak RSS, so the workers' share is the sum over the tasks (the parse function is wrapped here, by value, the
product's units and parse function unchanged). What the driver holds is the size of the job's frames after
assembly (Polars' estimated size) and its resident set after each phase. Figures depend on the machine and its
load: say both with them.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import json, os, resource, sys, time
from pathlib import Path
t0 = time.perf_counter()
from forensics.pipeline import Analysis, collect_frames
from forensics.facts.context import JobContext
from forensics.detectors import run_detectors
from forensics.base.findings import sort_findings
from forensics.incidents import correlate, job_facts
from forensics.parsers import discovery
from forensics.reports import html, json_report, markdown

class Timed(list):
    '''A unit's parsed files with what its task cost (defined in __main__: Ray pickles it by value).'''

def timed_parse(args):
    import os, resource, time
    c0, w0 = time.process_time(), time.perf_counter()
    out = Timed(discovery.parse_unit(*args))
    out.stats = {"cpu_s": time.process_time() - c0, "wall_s": time.perf_counter() - w0, "files": len(args[0]),
                 "rss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, "pid": os.getpid()}
    return out

tasks = []
in_order = discovery._in_order
def recording(tick):
    done = in_order(tick)
    def rec(i, items):
        tasks.append(getattr(items, "stats", None))
        done(i, list(items))
    return rec
discovery._parse_worker = timed_parse  # looked up by _parse_on_ray when it runs
discovery._in_order = recording

run, address = Path(sys.argv[1]), (sys.argv[2] or None)
out = []
def statm_kb():
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024
def mark(name, t):
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    out.append({"phase": name, "s": time.perf_counter() - t, "peak_kb": own.ru_maxrss, "rss_kb": statm_kb(),
                "cpu_s": own.ru_utime + own.ru_stime, "children_cpu_s": kids.ru_utime + kids.ru_stime})
    return time.perf_counter()
t = mark("import", t0)
files = discovery.discover(run); t = mark("discover", t)
parsed = discovery.discover_and_parse(run, engine="ray", ray_address=address)
t = mark("parse", t)  # includes a second discovery (discover_and_parse's own) and Ray's start and stop
_, frames = collect_frames(parsed)
held = sum(frames[n].estimated_size() for n in frames.present)
del parsed
t = mark("assemble", t)
ctx = JobContext(frames)
for fact in ("identity", "match", "breakdown", "exposure", "stages", "clock_offsets"):
    getattr(ctx, fact)
t = mark("context", t)
findings, skipped = run_detectors(ctx)
correlated, incidents = correlate(sort_findings(findings), job_facts(frames, ctx.world_size, len(ctx.ranks)))
a = Analysis(run, ctx, correlated, skipped, incidents); t = mark("detect", t)
docs = [json_report.render(a), markdown.render(a), b"".join(html.render_chunks(a))]
t = mark("render", t)
print(json.dumps({"phases": out, "tasks": tasks, "files": len(files), "frames_bytes": held,
                  "findings": len(a.findings)}))
"""


def simulated(ranks: int, cache: Path) -> Path:
    run = cache / f"ddp_straggler_{ranks}x5"
    if not (run / "truth.json").exists():
        subprocess.run([sys.executable, "-m", "forensics.cli", "simulate", "ddp_straggler", "--out", str(run),
                        "--ranks", str(ranks), "--steps", "5"], cwd=ROOT, check=True, capture_output=True)
    return run


def measure(run: Path, address: str | None) -> dict:
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    start = time.perf_counter()
    res = subprocess.run([sys.executable, "-c", CHILD, str(run), address or ""], capture_output=True, text=True,
                         cwd=tempfile.gettempdir(), env=env)
    if res.returncode:
        raise RuntimeError(f"the driver failed on {run}:\n{res.stderr[-3000:]}")
    data = json.loads(res.stdout.strip().splitlines()[-1])
    data["wall_s"] = time.perf_counter() - start
    return data


def report(run: Path, data: dict) -> None:
    tasks = [t for t in data["tasks"] if t]
    phases = {p["phase"]: p for p in data["phases"]}
    prev_cpu = 0.0
    print(f"\n{run.name}: {data['files']} files, {len(tasks)} parse tasks on {len({t['pid'] for t in tasks})} "
          f"worker processes, {data['findings']} findings; {data['wall_s']:.1f} s wall in all")
    print("| phase | wall s | driver CPU s | driver RSS after, MB | driver peak so far, MB |")
    print("|---|---:|---:|---:|---:|")
    for p in data["phases"]:
        print(f"| {p['phase']} | {p['s']:.1f} | {p['cpu_s'] - prev_cpu:.1f} | {p['rss_kb'] / 1024:,.0f} | "
              f"{p['peak_kb'] / 1024:,.0f} |")
        prev_cpu = p["cpu_s"]
    cpu = sum(t["cpu_s"] for t in tasks)
    print(f"workers: {cpu:.1f} s CPU in parse tasks ({sum(t['wall_s'] for t in tasks):.1f} s of task wall time), "
          f"{sum(t['files'] for t in tasks)} files, largest worker peak "
          f"{max((t['rss_kb'] for t in tasks), default=0) / 1024:,.0f} MB")
    driver = phases["render"]["cpu_s"]
    print(f"driver: {driver:.1f} s CPU ({driver / (driver + cpu):.0%} of driver + workers); Ray's own processes "
          f"started by the driver (reaped at shutdown): {phases['render']['children_cpu_s']:.1f} s CPU; "
          f"the job's frames after assembly: {data['frames_bytes'] / 2**20:,.0f} MB")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="*", type=Path)
    ap.add_argument("--simulate", type=int, action="append", default=[],
                    help="also a simulated ddp_straggler job of this many ranks x 5 steps (made once in --cache)")
    ap.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "forensics-bench")
    ap.add_argument("--ray-address", default=None, help="a running cluster [default: a local Ray session]")
    ap.add_argument("--json", type=Path, default=None, help="also write the raw figures here")
    args = ap.parse_args()
    runs = list(args.runs) + [simulated(n, args.cache) for n in args.simulate]
    results = {}
    for run in runs:
        print(f"{time.strftime('%H:%M:%S')} {run} (load average {os.getloadavg()[0]:.1f})", flush=True)
        results[str(run)] = data = measure(run, args.ray_address)
        report(run, data)
        print(f"{time.strftime('%H:%M:%S')} done (load average {os.getloadavg()[0]:.1f})", flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
