"""Side-by-side load benchmark: `forensics frames` vs a bare `orjson.loads` vs HTA, one trace.

Each contender runs in its own child process; wall time is measured around the child and peak RSS
is the child's ``ru_maxrss`` from ``os.wait4`` (on Linux this covers the child's own waited-for
children, like ``/usr/bin/time -v``). Every contender runs ``--repeat`` times; the table shows the
median wall time and the median peak RSS.

HTA (``holistictraceanalysis`` from PyPI) is not a project dependency. It lives in its own
virtual environment; ``--setup-hta`` creates it::

    python benchmarks/parse_bench.py --setup-hta            # once: /tmp/hta-venv
    python benchmarks/parse_bench.py ../shared/sample_data/kineto/hta/df_index_resolver.json.gz

HTA's ``TraceAnalysis`` takes a directory of traces, so the file is copied into a temp directory
(the same directory serves as RUN_DIR for ``forensics frames``).

Nsight Systems case: ``--nsys`` benchmarks the largest SQLite export under
``../shared/sample_data/nsys`` (or ``--nsys PATH``): ``forensics frames`` on a folder holding just that
export, and the nsys parser's ``parse()`` in one process; ``--nsys-synthetic N`` adds a generated
export with N kernels (see ``benchmarks/nsys_bench.py``)::

    python benchmarks/parse_bench.py --nsys --nsys-synthetic 2000000
"""

from __future__ import annotations

import argparse
import gzip
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_TRACE = ROOT.parent / "shared" / "sample_data" / "kineto" / "hta" / "df_index_resolver.json.gz"
DEFAULT_HTA_VENV = Path("/tmp/hta-venv")

ORJSON_CHILD = """
import gzip, sys, time, orjson
t = time.perf_counter()
with gzip.open(sys.argv[1]) if sys.argv[1].endswith('.gz') else open(sys.argv[1], 'rb') as fh:
    data = fh.read()
doc = orjson.loads(data)
print(f"events={len(doc['traceEvents'])} inner_s={time.perf_counter() - t:.3f}")
"""

PARSE_CHILD = """
import sys, time
from pathlib import Path
t = time.perf_counter()
from forensics.parsers.result import ParseContext
from forensics.parsers.kineto import parse
t1 = time.perf_counter()
p = Path(sys.argv[1])
r = parse(p, ParseContext(p.parent, p.name))
inner = time.perf_counter() - t1
print(f"status={r.status} kernels={r.frames['kernels'].height} import_s={t1 - t:.3f} inner_s={inner:.3f}")
"""

NSYS_PARSE_CHILD = """
import sys, time
from pathlib import Path
t = time.perf_counter()
from forensics.parsers.result import ParseContext
from forensics.parsers.nsys import parse
t1 = time.perf_counter()
p = Path(sys.argv[1])
r = parse(p, ParseContext(p.parent, p.name))
inner = time.perf_counter() - t1
print(f"status={r.status} gpu_ops={r.frames['kernels'].height} import_s={t1 - t:.3f} inner_s={inner:.3f}")
"""
DEFAULT_NSYS_DIR = ROOT.parent / "shared" / "sample_data" / "nsys"

HTA_CHILD = """
import sys, time, logging
logging.disable(logging.WARNING)
t = time.perf_counter()
from hta.trace_analysis import TraceAnalysis
t1 = time.perf_counter()
a = TraceAnalysis(trace_dir=sys.argv[1])
t2 = time.perf_counter()
df = a.t.get_trace(a.t.get_ranks()[0])
print(f"rows={len(df)} import_s={t1 - t:.3f} inner_s={t2 - t1:.3f}")
"""


@dataclass
class Run:
    wall_s: float
    maxrss_kb: int
    note: str


def measure(cmd: list[str], cwd: Path) -> Run:
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    # wait4 gives this child's own rusage; communicate() would reap it first, so read pipes after.
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    out = proc.stdout.read().decode() if proc.stdout else ""
    err = proc.stderr.read().decode() if proc.stderr else ""
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}:\n{err[-2000:]}")
    return Run(wall, usage.ru_maxrss, out.strip().splitlines()[-1] if out.strip() else "")


def setup_hta(venv: Path) -> None:
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    # HTA 0.5.0 reads a column named "cat" as df.cat, which pandas 3 no longer resolves to the column
    subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "holistictraceanalysis", "pandas<3"], check=True)


def raw_json_size(trace: Path) -> int:
    # Read only the magic: children forked from a parent holding the whole file would inherit
    # its peak RSS in ru_maxrss (Linux), which inflated every contender on big plain traces.
    with open(trace, "rb") as fh:
        magic = fh.read(2)
    if magic == b"\x1f\x8b":
        size = 0
        with gzip.open(trace) as fh:
            while chunk := fh.read(1 << 20):
                size += len(chunk)
        return size
    return trace.stat().st_size


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace", nargs="?", type=Path, default=DEFAULT_TRACE)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--hta-venv", type=Path, default=DEFAULT_HTA_VENV)
    ap.add_argument("--setup-hta", action="store_true", help="create the HTA venv (pip install holistictraceanalysis)")
    ap.add_argument("--no-hta", action="store_true")
    ap.add_argument("--nsys", nargs="?", const="largest", default=None, metavar="EXPORT",
                    help="benchmark the nsys parser instead: the largest sample export, or EXPORT")
    ap.add_argument("--nsys-synthetic", type=int, default=0, metavar="N",
                    help="with --nsys: also a generated export with N kernels")
    args = ap.parse_args(argv)
    if args.nsys:
        return nsys_main(args)

    if args.setup_hta:
        setup_hta(args.hta_venv)
        if not args.trace.exists():
            return 0
    trace: Path = args.trace.resolve()
    raw = raw_json_size(trace)
    hta_python = args.hta_venv / "bin" / "python"
    with tempfile.TemporaryDirectory(prefix="parse_bench_") as tmp_s:
        tmp = Path(tmp_s)
        run_dir = tmp / "run"
        run_dir.mkdir()
        shutil.copyfile(trace, run_dir / trace.name)
        tiny_dir = tmp / "tiny"
        tiny_dir.mkdir()
        (tiny_dir / "tiny.pt.trace.json").write_text(
            '{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 1, "dur": 2}]}'
        )
        contenders: dict[str, list[str]] = {
            "forensics frames": [sys.executable, "-m", "forensics.cli", "frames", str(run_dir), "--out",
                                 str(tmp / "out"), "-q"],
            "forensics frames, 1-event trace": [
                sys.executable, "-m", "forensics.cli", "frames", str(tiny_dir), "--out", str(tmp / "out_tiny"), "-q",
            ],
            "forensics parse() in one process": [sys.executable, "-c", PARSE_CHILD, str(trace)],
            "orjson.loads (whole file)": [sys.executable, "-c", ORJSON_CHILD, str(trace)],
        }
        if not args.no_hta:
            if not hta_python.exists():
                print(f"HTA venv not found at {args.hta_venv}; run with --setup-hta (or --no-hta)", file=sys.stderr)
                return 2
            contenders["HTA TraceAnalysis load"] = [str(hta_python), "-c", HTA_CHILD, str(run_dir)]
        results: dict[str, list[Run]] = {name: [] for name in contenders}
        for _ in range(args.repeat):
            for name, cmd in contenders.items():  # interleaved, so background load hits all alike
                out_dir = tmp / "out"
                shutil.rmtree(out_dir, ignore_errors=True)
                shutil.rmtree(tmp / "out_tiny", ignore_errors=True)
                results[name].append(measure(cmd, ROOT))

    print(f"trace: {trace}")
    print(f"raw JSON: {raw / 1e6:.1f} MB; {args.repeat} runs each, medians; machine: {os.cpu_count()} CPUs")
    print()
    hta = results.get("HTA TraceAnalysis load")
    hta_wall = statistics.median(r.wall_s for r in hta) if hta else None
    hta_inner = statistics.median(_inner(r) for r in hta) if hta else None
    header = (
        f"| {'contender':34} | process wall s | load s (in-process) | peak RSS MB | RSS / raw JSON "
        f"| HTA wall / this | HTA load / this load |"
    )
    print(header)
    print("|" + "|".join("-" * (len(c)) for c in header.split("|")[1:-1]) + "|")
    for name, runs in results.items():
        wall = statistics.median(r.wall_s for r in runs)
        inners = [_inner(r) for r in runs]
        inner = statistics.median(inners) if all(x is not None for x in inners) else None
        rss_mb = statistics.median(r.maxrss_kb for r in runs) / 1024
        speed = f"{hta_wall / wall:.1f}x" if hta_wall else "n/a"
        load_speed = f"{hta_inner / inner:.1f}x" if hta_inner and inner else "n/a"
        inner_s = f"{inner:.2f}" if inner is not None else "n/a"
        print(
            f"| {name:34} | {wall:14.2f} | {inner_s:>19} | {rss_mb:11.0f} | {rss_mb * 1024 * 1024 / raw:14.2f} "
            f"| {speed:>15} | {load_speed:>20} |"
        )
    print()
    for name, runs in results.items():
        print(f"{name}: {runs[-1].note}")
    return 0


def nsys_main(args: argparse.Namespace) -> int:
    """The nsys case: `forensics frames` and in-process `parse()` on one SQLite export (median of --repeat)."""
    if args.nsys == "largest":
        exports = sorted(DEFAULT_NSYS_DIR.rglob("*.sqlite"), key=lambda p: p.stat().st_size)
        if not exports:
            print(f"no .sqlite export under {DEFAULT_NSYS_DIR}", file=sys.stderr)
            return 2
        cases = [("largest sample export", exports[-1].resolve())]
    else:
        cases = [("export", Path(args.nsys).resolve())]
    with tempfile.TemporaryDirectory(prefix="parse_bench_nsys_") as tmp_s:
        tmp = Path(tmp_s)
        if args.nsys_synthetic:
            sys.path.insert(0, str(ROOT / "benchmarks"))
            from nsys_bench import synthesize

            synth = tmp / "synthetic.sqlite"
            synthesize(synth, args.nsys_synthetic)
            cases.append((f"synthetic, {args.nsys_synthetic:,} kernels", synth))
        print(f"{args.repeat} runs each, medians; machine: {os.cpu_count()} CPUs")
        print()
        print("| export | MB | contender | process wall s | parse s (in-process) | peak RSS MB | RSS / export |")
        print("|---|---|---|---|---|---|---|")
        for label, export in cases:
            run_dir = tmp / f"run_{len(label)}"
            run_dir.mkdir()
            shutil.copyfile(export, run_dir / export.name)
            size = export.stat().st_size
            contenders = {
                "forensics frames": [sys.executable, "-m", "forensics.cli", "frames", str(run_dir),
                                     "--out", str(tmp / "out"), "-q", "--workers", "1"],
                "nsys parse() in one process": [sys.executable, "-c", NSYS_PARSE_CHILD, str(run_dir / export.name)],
            }
            for name, cmd in contenders.items():
                runs = []
                for _ in range(args.repeat):
                    shutil.rmtree(tmp / "out", ignore_errors=True)
                    runs.append(measure(cmd, ROOT))
                wall = statistics.median(r.wall_s for r in runs)
                inners = [_inner(r) for r in runs]
                inner = f"{statistics.median(inners):.2f}" if all(x is not None for x in inners) else "n/a"
                rss = statistics.median(r.maxrss_kb for r in runs) / 1024
                print(f"| {label} ({export.name}) | {size / 1e6:.1f} | {name} | {wall:.2f} | {inner} | {rss:.0f} "
                      f"| {rss * 1024 * 1024 / size:.1f} |")
    return 0


def _inner(run: Run) -> float | None:
    """The child's own timing of the load alone (imports excluded), when it prints one."""
    for part in run.note.split():
        if part.startswith("inner_s="):
            return float(part.split("=", 1)[1])
    return None


if __name__ == "__main__":
    sys.exit(main())
