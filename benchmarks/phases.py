"""Speed and memory of `forensics analyze`, phase by phase, next to the bare JSON parse and HTA, in one run.

    python benchmarks/phases.py                      # the standard set (see INPUTS); minutes
    python benchmarks/phases.py --quick              # the real inputs and 64/256 simulated ranks only
    python benchmarks/phases.py --only sim1024 --hta-venv /tmp/hta-venv
    python benchmarks/phases.py --only sim1024 --python ../main/.venv/bin/python   # another checkout, same run
    python benchmarks/phases.py --only sim1024 --only sim4096 --cli-only   # the CLI alone: the per-rank targets

Each input is analysed in a fresh child process that runs the pipeline's phases one after the other and
reports, after each, the wall time, the peak RSS so far (its own, and its parser workers') and the CPU time
so far (its own plus its parser workers'; on a loaded machine the steadier figure):
  discover  classify every file by content (parsers.discovery.discover)
  parse     parse the files, in the worker pool when there are enough (discover_and_parse, minus discover)
  assemble  merge per-file frames into one JobFrames (analyze.collect_frames)
  context   the JobContext facts: identity, collective matching, step breakdown, exposure, stages
  detect    every detector, then incidents (run_detectors, correlate)
  render    findings.json, summary.md and report.html in memory
  write     the output set written to a temporary folder
Next to it, in its own child each: the floor, a bare `orjson.loads` of every trace file of the input (what
any JSON-based tool pays at least), and HTA's `TraceAnalysis` load when --hta-venv points at a venv with
`holistictraceanalysis` (created by `python benchmarks/parse_bench.py --setup-hta`), on the real inputs; else
said as skipped.
Beside the phase child, the CLI itself end to end, as a user runs it (`forensics analyze PATH --out TMP -q`:
argument parsing, collectives.parquet and the file commit included): its CPU seconds and peak RSS are the
figures the issue's targets are checked against. The peak is the process tree's resident memory at one moment
(the RSS of the CLI and its parser workers summed every SAMPLE_S, or the largest process's own ru_maxrss where
that is higher); the table prints beside it, in brackets, the upper bound earlier passes used (the CLI's own
peak plus one worker peak per core, as if all peaked at once: the parent peaks while rendering, long after its
workers are gone).
Children run with a bytecode cache (PYTHONPYCACHEPREFIX under --cache, PYTHONDONTWRITEBYTECODE unset) warmed
once per interpreter, as an installed package has: without it every run compiles the sources again
(~0.15 s of CPU). `--repeat N` runs each child N times and keeps the median of each figure.
The targets of issue 29 are printed with PASS/FAIL (`--before PYTHON`: also for another checkout, measured
input by input beside this one), against an import baseline (python + polars + orjson + forensics).
Figures depend on the machine and its load: compare only figures of one run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from _common import tree_rss

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "sample_data"
PHASES = ("discover", "parse", "assemble", "context", "detect", "render", "write")

CHILD = r"""
import json, resource, sys, tempfile, time
from pathlib import Path
t0 = time.perf_counter()
from forensics.pipeline import Analysis, collect_frames
from forensics.facts.context import JobContext
from forensics.detectors import run_detectors
from forensics.base.findings import sort_findings
from forensics.incidents import correlate, job_facts
from forensics.base.outputs import OutputSet
from forensics.parsers.discovery import discover, discover_and_parse
from forensics.reports import html, json_report, markdown
run = Path(sys.argv[1]); out = []
def cpu():
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime
def mark(name, t):
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    out.append({"phase": name, "s": time.perf_counter() - t, "rss_kb": own, "worker_rss_kb": kids, "cpu_s": cpu()})
    return time.perf_counter()
t = mark("import", t0)
files = discover(run); t = mark("discover", t)
parsed = discover_and_parse(run); dt = time.perf_counter() - t
out.append({"phase": "parse", "s": dt - out[-1]["s"], "rss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
            "worker_rss_kb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, "cpu_s": cpu()})
t = time.perf_counter()
_, frames = collect_frames(parsed); t = mark("assemble", t)
ctx = JobContext(frames)
for fact in ("identity", "match", "breakdown", "exposure", "stages", "clock_offsets"):
    getattr(ctx, fact)
t = mark("context", t)
findings, skipped = run_detectors(ctx)
correlated, incidents = correlate(sort_findings(findings), job_facts(frames, ctx.world_size, len(ctx.ranks)))
a = Analysis(run, ctx, correlated, skipped, incidents); t = mark("detect", t)
docs = {"findings.json": json_report.render(a), "summary.md": markdown.render(a), "report.html": html.render(a)}
t = mark("render", t)
with tempfile.TemporaryDirectory() as d:
    outs = OutputSet(Path(d) / "out")
    for name, body in docs.items():
        (outs.add_bytes if isinstance(body, bytes) else outs.add_text)(name, body)
    outs.commit()
t = mark("write", t)
print(json.dumps({"phases": out, "files": len(files), "findings": len(a.findings)}))
"""

ORJSON_CHILD = r"""
import gzip, json, sys, time, orjson
t = time.perf_counter(); n = 0
for p in sys.argv[1:]:
    with (gzip.open(p) if p.endswith('.gz') else open(p, 'rb')) as fh:
        n += len(orjson.loads(fh.read()).get('traceEvents', []))
print(json.dumps({"s": time.perf_counter() - t, "events": n}))
"""

HTA_CHILD = r"""
import json, logging, sys, time
logging.disable(logging.WARNING)
from hta.trace_analysis import TraceAnalysis
t = time.perf_counter(); a = TraceAnalysis(trace_dir=sys.argv[1])
print(json.dumps({"s": time.perf_counter() - t}))
"""


BASELINE_CHILD = r"""
import json, resource
import orjson, polars
import forensics.cli, forensics.pipeline, forensics.parsers.kineto, forensics.detectors
print(json.dumps({"rss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}))
"""
"""The import baseline of issue 29's memory targets: python + polars + orjson + forensics, before any input."""


FILE_COST_CHILD = r"""
import json, resource, sys
from pathlib import Path
from forensics.parsers.discovery import discover, parse_unit
def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime
run = Path(sys.argv[1]); t = cpu(); files = discover(run)
out = {"discover": (cpu() - t) / len(files) * 1e3}
for kind in sys.argv[2:]:
    fs = [f for f in files if f.kind == kind]
    parse_unit(fs[:2], run)  # imports and first-use costs out of the way
    costs = []
    for part in (fs[: len(fs) // 8], fs):
        t = cpu(); parse_unit(part, run); costs.append((cpu() - t, len(part)))
    (c0, n0), (c1, n1) = costs
    out[kind] = (c1 - c0) / (n1 - n0) * 1e3  # the slope: what one more file of the kind costs
print(json.dumps(out))
"""
FILE_KINDS = ("nccl_log", "dmesg")
"""The small per-rank and per-node files of a job, whose cost per file is the fixed cost the issue bounds."""


@dataclass
class Child:
    out: dict
    wall_s: float
    maxrss_mb: float  # the process or one of the children it waited for (workers), whichever peaked highest
    cpu_s: float = 0.0  # the process and the children it waited for (workers), start-up included
    tree_mb: float = 0.0  # the process and all its descendants at once: the highest sampled sum of their RSS


CHILD_ENV: dict[str, str] = dict(os.environ)
"""The children's environment: see :func:`use_bytecode_cache`."""
REPEAT = 1


def use_bytecode_cache(cache: Path, pythons: list[str]) -> None:
    """Children read and write compiled bytecode under ``cache`` (as an installed package has its .pyc; an
    editable checkout under PYTHONDONTWRITEBYTECODE=1 compiles every module on every start), warmed once
    per interpreter so that no measured run pays the compilation."""
    CHILD_ENV.pop("PYTHONDONTWRITEBYTECODE", None)
    CHILD_ENV["PYTHONPYCACHEPREFIX"] = str(cache / "pycache")
    warm = ("import forensics.cli, forensics.pipeline, forensics.reports.html, forensics.reports.markdown, "
            "forensics.reports.json_report, forensics.detectors, forensics.parsers.kineto, pyarrow.parquet; "
            "forensics.detectors.load_all()")
    for python in dict.fromkeys(pythons):
        subprocess.run([python, "-c", warm], cwd=tempfile.gettempdir(), env=CHILD_ENV, check=False)


SAMPLE_S = 0.02
"""How often the process tree's resident memory is summed (``Child.tree_mb``)."""


def _sample_tree(pid: int, done: threading.Event, peak: list[int]) -> None:
    """The highest sum of the RSS of ``pid`` and its descendants (its parser workers) seen until ``done``:
    memory in use at one moment, where ru_maxrss gives each process's own peak, whenever it was."""
    while not done.wait(SAMPLE_S):
        peak[0] = max(peak[0], tree_rss(pid))


def _once(cmd: list[str], parse: bool) -> Child:
    start = time.perf_counter()
    # not run in ROOT: `python -c` would import this checkout's folders even for another --python
    proc = subprocess.Popen(cmd, cwd=tempfile.gettempdir(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=CHILD_ENV)
    done, peak = threading.Event(), [0]
    sampler = threading.Thread(target=_sample_tree, args=(proc.pid, done, peak), daemon=True)
    sampler.start()
    try:
        _, status, usage = os.wait4(proc.pid, 0)  # this child's own rusage (communicate() would reap it first)
    finally:
        done.set()
        sampler.join()
    wall = time.perf_counter() - start
    text = proc.stdout.read().decode() if proc.stdout else ""
    if os.waitstatus_to_exitcode(status) != 0:
        err = proc.stderr.read().decode() if proc.stderr else ""
        raise RuntimeError(f"{' '.join(cmd[:3])} failed:\n{err[-1500:]}")
    out = json.loads(text.strip().splitlines()[-1]) if parse else {}
    return Child(out, wall, usage.ru_maxrss / 1024, usage.ru_utime + usage.ru_stime, peak[0] / 2**20)


def run_child(cmd: list[str], parse: bool = True) -> Child:
    """``cmd`` run REPEAT times: the median of each figure (the phase figures of the median-CPU run)."""
    runs = [_once(cmd, parse) for _ in range(REPEAT)]
    mid = sorted(runs, key=lambda c: c.cpu_s)[len(runs) // 2]
    return Child(mid.out, statistics.median(c.wall_s for c in runs), statistics.median(c.maxrss_mb for c in runs),
                 mid.cpu_s, statistics.median(c.tree_mb for c in runs))


def run_cli(python: str, path: Path) -> Child:
    """`forensics analyze PATH` as a user runs it, into a temporary folder."""
    out = Path(tempfile.mkdtemp(prefix="forensics-phases-"))
    try:
        return run_child([python, "-m", "forensics.cli", "analyze", str(path), "--out", str(out / "out"), "-q",
                          "--fail-on", "never"], parse=False)
    finally:
        shutil.rmtree(out, ignore_errors=True)


def _simulated(ranks: int, cache: Path, scenario: str = "ddp_straggler", size: float | None = None) -> Path:
    name = f"{scenario}_{ranks}x5" + (f"_{size:g}mb" if size else "")
    run = cache / name
    if not (run / "truth.json").exists():  # generated once, reused by later runs of the benchmark
        cmd = [sys.executable, "-m", "forensics.cli", "simulate", scenario, "--out", str(run), "--ranks", str(ranks)]
        cmd += ["--size", str(size)] if size else ["--steps", "5"]
        subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True)
    return run


def inputs(cache: Path, quick: bool, only: list[str]) -> dict[str, tuple[Path, str]]:
    """name -> (RUN_DIR or file, what it is); with ``only``, just those (nothing else is generated)."""
    real = {
        "hta53": (SHARED / "kineto" / "hta" / "df_index_resolver.json.gz", "real 53.7 MB Kineto trace (HTA sample)"),
        "dlrm8": (SHARED / "kineto" / "param_dlrm_8rank", "real 8-rank DLRM traces + logs"),
    }
    sims = [64, 256] if quick and not only else [64, 256, 1024, 4096]
    out = {k: v for k, v in real.items() if not only or k in only}
    for n in sims:
        if not only or f"sim{n}" in only:
            out[f"sim{n}"] = (_simulated(n, cache), f"simulated ddp_straggler, {n} ranks x 5 steps")
    if not quick and (not only or "dense" in only):
        out["dense"] = (_simulated(1, cache, "ddp_clean", 100.0), "simulated kernel-dense trace, 1 rank, ~100 MB")
    return out


def trace_files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    return sorted(p for p in path.rglob("*") if p.name.endswith((".json", ".json.gz")) and "truth" not in p.name)


def json_bytes(files: list[Path]) -> int:
    import gzip

    total = 0
    for p in files:
        with (gzip.open(p) if p.name.endswith(".gz") else open(p, "rb")) as fh:
            while chunk := fh.read(1 << 24):
                total += len(chunk)
    return total


@dataclass
class Result:
    name: str
    what: str
    ours: Child
    cli: Child
    floor: Child | None
    hta: Child | None
    json_mb: float
    n_files: int
    path: Path = Path()  # the input measured

    def peak_mb(self) -> float:
        """Our child's own peak plus one parser worker's peak per core (an upper bound of the total)."""
        if not self.ours.out["phases"]:  # --cli-only
            return 0.0
        last = self.ours.out["phases"][-1]
        workers = min(os.cpu_count() or 1, self.n_files) if last["worker_rss_kb"] else 0
        return (last["rss_kb"] + workers * last["worker_rss_kb"]) / 1024

    def cli_bound_mb(self) -> float | None:
        """An upper bound of the CLI's peak: its own (or a worker's) plus one worker peak per core when it used a
        pool (the phase child's worker peak), as if every process peaked at the same moment."""
        if not self.ours.out["phases"]:  # --cli-only: no worker peak measured
            return None
        last = self.ours.out["phases"][-1]
        workers = min(os.cpu_count() or 1, self.n_files) if last["worker_rss_kb"] else 0
        return self.cli.maxrss_mb + workers * last["worker_rss_kb"] / 1024

    def cli_peak_mb(self) -> float:
        """The CLI's peak, the figure the targets are checked against: its process tree's resident memory at
        one moment (the highest sum sampled every SAMPLE_S, workers included), or the largest single process's
        own peak where that is higher (a spike between two samples)."""
        return max(self.cli.maxrss_mb, self.cli.tree_mb)


def measure(name: str, path: Path, what: str, hta_venv: Path | None, python: str = sys.executable,
            floor: bool = True, cli_only: bool = False) -> Result:
    files = trace_files(path)
    if cli_only:  # no phase child, floor or HTA: the CLI's own figures only
        n = sum(1 for p in path.rglob("*") if p.is_file()) if path.is_dir() else 1
        cli = run_cli(python, path)
        return Result(name, what, Child({"phases": [], "files": n}, 0.0, 0.0), cli, None, None,
                      json_bytes(files) / 1e6 if files else 0.0, n, path)
    ours = run_child([python, "-c", CHILD, str(path)])
    cli = run_cli(python, path)
    bare = run_child([sys.executable, "-c", ORJSON_CHILD, *map(str, files)]) if files and floor else None
    hta = None
    if hta_venv and files and not name.startswith("sim"):  # real traces: HTA on 1,024 simulated ones takes ages
        with tempfile.TemporaryDirectory() as tmp:  # HTA loads a folder: a lone file gets one of its own
            trace_dir = path if path.is_dir() else Path(tmp)
            if path.is_file():
                (trace_dir / path.name).symlink_to(path)
            try:
                hta = run_child([str(hta_venv / "bin" / "python"), "-c", HTA_CHILD, str(trace_dir)])
            except RuntimeError as exc:  # HTA's own failure: the row says so instead of ending the run
                print(f"HTA failed on {name}: {str(exc).strip().splitlines()[-1]}", file=sys.stderr)
    return Result(name, what, ours, cli, bare, hta, json_bytes(files) / 1e6 if files else 0.0, ours.out["files"], path)


def table(results: list[Result]) -> str:
    head = ["input", "files", "JSON MB", *PHASES, "total s", "CPU s", "peak MB", "CLI s (CPU)", "CLI peak MB (bound)",
            "orjson floor s (CPU)", "CLI x floor (CPU)", "HTA load s (CPU)", "HTA / CLI (CPU)"]
    rows = [head, ["---"] * len(head)]
    for r in results:
        ph = {p["phase"]: p["s"] for p in r.ours.out["phases"]}
        floor = r.floor.out["s"] if r.floor else None
        hta = r.hta.out["s"] if r.hta else None
        ours = [*[f"{ph.get(p, 0.0):.2f}" for p in PHASES], f"{r.ours.wall_s:.2f}", f"{r.ours.cpu_s:.2f}",
                f"{r.peak_mb():.0f}"] if ph else ["-"] * (len(PHASES) + 3)  # --cli-only: no phase child
        rows.append([r.name, str(r.n_files), f"{r.json_mb:.1f}", *ours,
                     _pair(r.cli.wall_s, r.cli.cpu_s), f"{r.cli_peak_mb():.0f} ({_mb(r.cli_bound_mb())})",
                     _pair(floor, r.floor and r.floor.cpu_s),
                     _pair(floor and r.cli.wall_s / floor, r.floor and r.cli.cpu_s / r.floor.cpu_s),
                     _pair(hta, r.hta and r.hta.cpu_s) if r.hta else "skipped",
                     _pair(hta and hta / r.cli.wall_s, r.hta and r.hta.cpu_s / r.cli.cpu_s)])
    return "\n".join("| " + " | ".join(row) + " |" for row in rows)


def _mb(v: float | None) -> str:
    return "-" if v is None else f"{v:.0f}"


def _f(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def _pair(wall: float | None, cpu: float | None) -> str:
    """A wall figure and its CPU counterpart, ``wall (cpu)``."""
    return "-" if wall is None else f"{wall:.2f} ({_f(cpu)})"


def targets(by: dict[str, Result], base_mb: float) -> list[tuple[str, bool | None, str]]:
    """Issue 29's targets: (target, PASS/FAIL/None when its input was not measured, the figures). CPU seconds of the
    CLI end to end (start-up included) against the floor's; peaks in MiB, JSON in MB (1e6 bytes)."""
    out: list[tuple[str, bool | None, str]] = []

    def check(name: str, label: str, ok: object, figures: str) -> None:
        out.append((label, bool(ok) if name in by else None, figures if name in by else "not measured"))

    r = by.get("hta53")
    if r and r.hta:
        check("hta53", "53.7 MB trace: >= 5x faster than HTA's load, end to end", r.hta.cpu_s >= 5 * r.cli.cpu_s,
              f"HTA {r.hta.cpu_s:.2f} s vs {r.cli.cpu_s:.2f} s of CPU ({r.hta.cpu_s / r.cli.cpu_s:.1f}x; wall"
              f" {r.hta.wall_s:.2f} vs {r.cli.wall_s:.2f} s)")
    if r and r.floor:
        parse = _phase_cpu(r, "parse")
        check("hta53", "53.7 MB trace: end to end <= 1.0x a bare orjson.loads", r.cli.cpu_s <= r.floor.cpu_s,
              f"CPU {r.cli.cpu_s:.2f} vs {r.floor.cpu_s:.2f} s ({r.cli.cpu_s / r.floor.cpu_s:.2f}x), both processes'"
              f" start-up included; the parse phase alone {parse:.2f} s ({parse / r.floor.cpu_s:.2f}x)")
        above = r.cli_peak_mb() - base_mb
        check("hta53", "53.7 MB trace: peak RSS above the import baseline <= 1.0x the JSON", above <= r.json_mb,
              f"{r.cli_peak_mb():.0f} - {base_mb:.0f} = {above:.0f} MiB vs {r.json_mb:.0f} MB of JSON "
              f"({above / r.json_mb:.2f}x)")
    if (d := by.get("dense")) is not None:
        above = d.cli_peak_mb() - base_mb
        check("dense", "kernel-dense trace: peak RSS above the import baseline <= 1.5x the JSON",
              above <= 1.5 * d.json_mb, f"{d.cli_peak_mb():.0f} - {base_mb:.0f} = {above:.0f} MiB vs {d.json_mb:.0f}"
              f" MB ({above / d.json_mb:.2f}x)")
    if (s := by.get("sim1024")) is not None and s.floor:
        check("sim1024", "1,024 ranks x 5 steps: <= 2x a single-core gunzip + orjson.loads, <= 1 GB",
              s.cli.cpu_s <= 2 * s.floor.cpu_s and s.cli_peak_mb() <= 1024,
              f"{s.cli.cpu_s:.1f} vs {s.floor.cpu_s:.1f} s of CPU ({s.cli.cpu_s / s.floor.cpu_s:.2f}x; wall "
              f"{s.cli.wall_s:.1f} s), {s.cli_peak_mb():.0f} MiB (upper bound {_mb(s.cli_bound_mb())})")
    if (s := by.get("sim4096")) is not None:
        check("sim4096", "4,096 ranks x 5 steps: <= 3 GB", s.cli_peak_mb() <= 3072,
              f"{s.cli_peak_mb():.0f} MiB (upper bound {_mb(s.cli_bound_mb())}; {s.cli.cpu_s:.1f} s of CPU, wall "
              f"{s.cli.wall_s:.1f} s)")
    if (a := by.get("sim1024")) is not None and (b := by.get("sim4096")) is not None:
        t = (b.cli.cpu_s / 4096) / (a.cli.cpu_s / 1024)
        m = (b.cli_peak_mb() / 4096) / (a.cli_peak_mb() / 1024)
        check("sim4096", "4,096 ranks: time and memory per rank within 10% of those at 1,024",
              t <= 1.1 and m <= 1.1, f"CPU {1e3 * a.cli.cpu_s / 1024:.1f} -> {1e3 * b.cli.cpu_s / 4096:.1f} ms per "
              f"rank ({t:.2f}x), peak {a.cli_peak_mb() / 1024:.3f} -> {b.cli_peak_mb() / 4096:.3f} MiB per rank "
              f"({m:.2f}x)")
    return out


def _phase_cpu(r: Result, phase: str) -> float:
    """CPU seconds of one phase of the phase child."""
    phases = r.ours.out["phases"]
    i = next(i for i, p in enumerate(phases) if p["phase"] == phase)
    return phases[i]["cpu_s"] - phases[i - 1]["cpu_s"]


def slope(by: dict[str, Result]) -> str:
    """Least-squares fit of total time and peak memory against ranks over the simulated inputs."""
    pts = sorted((int(k[3:]), r) for k, r in by.items() if k.startswith("sim"))
    if len(pts) < 2:
        return "slope: needs two simulated sizes"
    xs = [float(n) for n, _ in pts]

    def fit(ys: list[float]) -> tuple[float, float]:
        mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
        b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
        return b, my - b * mx

    bt, at = fit([r.cli.wall_s for _, r in pts])
    bm, am = fit([r.cli_peak_mb() for _, r in pts])
    per_file = bt * 1000 * pts[-1][0] / max(pts[-1][1].n_files, 1)
    return (f"time = {at:.2f} s + {bt * 1000:.2f} ms x ranks; peak = {am:.0f} MB + {bm:.2f} MB x ranks; "
            f"about {per_file:.2f} ms per file at {pts[-1][0]} ranks (wall, all of a file's work, its events included)")


def file_costs(by: dict[str, Result], python: str) -> str | None:
    """CPU ms per file of discovery (all files) and of parsing one more small log of each kind, on the largest
    simulated job measured (its NCCL logs are ~5 KB, its kernel logs ~6 KB)."""
    sims = sorted((int(k[3:]), r) for k, r in by.items() if k.startswith("sim"))
    if not sims:
        return None
    n, r = sims[-1]
    run = r.path
    out = run_child([python, "-c", FILE_COST_CHILD, str(run), *FILE_KINDS]).out
    parts = [f"discovery {out['discover']:.2f}"] + [f"{k} {out[k]:.2f}" for k in FILE_KINDS if k in out]
    worst = max(out.values())
    return (f"{'PASS' if worst <= 2.0 else 'FAIL'}  no per-file fixed cost above 2 ms: CPU ms per file at {n} ranks: "
            + ", ".join(parts))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="real inputs and 64/256 simulated ranks only")
    ap.add_argument("--only", action="append", default=[], help="measure only this input (repeatable)")
    ap.add_argument("--hta-venv", type=Path, default=None, help="a venv with holistictraceanalysis installed")
    ap.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "forensics-bench",
                    help="where simulated inputs are generated once and reused")
    ap.add_argument("--python", default=sys.executable,
                    help="the interpreter whose forensics is measured (another checkout's venv: before/after)")
    ap.add_argument("--before", default=None,
                    help="another checkout's interpreter, measured input by input beside --python (before/after)")
    ap.add_argument("--cli-only", action="store_true",
                    help="measure only the CLI (no phase child, floor or HTA): the big inputs in half the time")
    ap.add_argument("--json", type=Path, default=None, help="also write every figure (per phase RSS too) here")
    ap.add_argument("--repeat", type=int, default=1, help="run each child this many times; medians are printed")
    ap.add_argument("--no-bytecode-cache", action="store_true",
                    help="children compile every module on every start (the environment as it is)")
    args = ap.parse_args()
    global REPEAT
    REPEAT = max(1, args.repeat)
    if not args.no_bytecode_cache:
        use_bytecode_cache(args.cache, [args.python, sys.executable, *([args.before] if args.before else [])])
    todo = inputs(args.cache, args.quick, args.only)
    results, before = [], []
    for name, (path, what) in todo.items():  # the two checkouts side by side, input by input
        print(f"measuring {name}: {what} ...", file=sys.stderr, flush=True)
        results.append(measure(name, path, what, args.hta_venv, args.python, cli_only=args.cli_only))
        if args.before:  # the floor and HTA do not depend on the checkout: measured once
            print(f"measuring {name} (before): {what} ...", file=sys.stderr, flush=True)
            before.append(measure(name, path, what, None, args.before, floor=False, cli_only=args.cli_only))
            before[-1].floor, before[-1].hta = results[-1].floor, results[-1].hta
    for label, rows, python in (("before (--before)", before, args.before), ("after", results, args.python)):
        if not rows:
            continue
        base = run_child([python, "-c", BASELINE_CHILD])
        print(f"{label}: {python}; import baseline (python + polars + orjson + forensics) {base.maxrss_mb:.0f} MiB")
        print(table(rows))
        print()
        for target, ok, figures in targets({r.name: r for r in rows}, base.maxrss_mb):
            print(f"{'PASS' if ok else 'FAIL' if ok is not None else 'n/a '}  {target}: {figures}")
        print()
    print(slope({r.name: r for r in results}))
    per_file = None if args.cli_only else file_costs({r.name: r for r in results}, args.python)
    if per_file:
        print(per_file)
    if args.json:
        args.json.write_text(json.dumps([{"name": r.name, "ours": r.ours.out, "wall_s": r.ours.wall_s,
                                          "cpu_s": r.ours.cpu_s, "peak_mb": r.peak_mb(), "json_mb": r.json_mb,
                                          "cli_wall_s": r.cli.wall_s, "cli_cpu_s": r.cli.cpu_s,
                                          "cli_peak_mb": r.cli_peak_mb(), "cli_bound_mb": r.cli_bound_mb(),
                                          "floor_s": r.floor.out["s"] if r.floor else None,
                                          "floor_cpu_s": r.floor.cpu_s if r.floor else None,
                                          "hta_s": r.hta.out["s"] if r.hta else None,
                                          "hta_cpu_s": r.hta.cpu_s if r.hta else None} for r in results], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
