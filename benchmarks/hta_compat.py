"""Check that traces written by `forensics simulate` load in HTA (holistictraceanalysis from PyPI).

HTA is too heavy for CI, so this lives here: it creates /tmp/hta-venv (once), installs HTA there,
generates a run dir with the simulator (or takes one), loads its traces with
``TraceAnalysis(trace_dir=...)``, runs a few HTA analyses and prints OK.

    /work/venv/bin/python benchmarks/hta_compat.py [RUN_DIR [--truth TRUTH.json]] [--scenario ddp_straggler --ranks 8
    --steps 3]
    /work/venv/bin/python benchmarks/hta_compat.py sample_traces/ddp_straggler --truth
    sample_traces/ddp_straggler.truth.json
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VENV = Path("/tmp/hta-venv")

CHECK = r"""
import sys, warnings, logging
warnings.filterwarnings("ignore")
logging.disable(logging.WARNING)
from hta.trace_analysis import TraceAnalysis
trace_dir = sys.argv[1]
expected_ranks = int(sys.argv[2])
expected_kernels = {int(k): int(v) for k, v in (kv.split("=") for kv in sys.argv[3].split(","))}
import gzip, json, os
# HTA drops the last ProfilerStep (often incomplete in real traces): expect the GPU events before it.
expected_hta = {}
for fn in os.listdir(trace_dir):
    d = json.load(gzip.open(os.path.join(trace_dir, fn)))
    ev = d["traceEvents"]
    gpu = [e for e in ev if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    assert len(gpu) == expected_kernels[d["distributedInfo"]["rank"]], fn
    last = max(e["ts"] for e in ev if e.get("name", "").startswith("ProfilerStep#"))
    expected_hta[d["distributedInfo"]["rank"]] = sum(1 for e in gpu if e["ts"] < last)
ta = TraceAnalysis(trace_dir=trace_dir)
ranks = sorted(ta.t.traces.keys())
assert len(ranks) == expected_ranks, f"HTA loaded {len(ranks)} ranks, expected {expected_ranks}"
for r in ranks:
    df = ta.t.get_trace(r)
    names = ta.t.symbol_table.get_sym_table()
    cats = df["cat"].map(lambda i: names[i]) if df["cat"].dtype != object else df["cat"]
    n = int(cats.isin(["kernel", "gpu_memcpy", "gpu_memset"]).sum())
    assert n == expected_hta[r], (f"rank {r}: HTA sees {n} GPU events, expected {expected_hta[r]} "
                                  f"(truth: {expected_kernels[r]} in all steps)")
tb = ta.get_temporal_breakdown(visualize=False)
ov = ta.get_comm_comp_overlap(visualize=False)
print("temporal breakdown (first 3 ranks):")
print(tb.head(3).to_string())
print("comm/comp overlap:")
print(ov.head(3).to_string())
if any(k.startswith("ncclKernel") for k in ta.t.symbol_table.get_sym_id_map()):
    # HTA's straggler analysis only sees NCCL <= 2.18 kernel names; informational, not checked
    print("HTA get_potential_stragglers():", ta.get_potential_stragglers())
hta_version = __import__('importlib.metadata').metadata.version('HolisticTraceAnalysis')
print(f"OK: HTA {hta_version} loaded {len(ranks)} ranks from {trace_dir}")
"""


def ensure_venv() -> Path:
    py = VENV / "bin" / "python"
    if not py.exists():
        venv.create(VENV, with_pip=True)
    probe = subprocess.run([str(py), "-c", "import hta"], capture_output=True)
    if probe.returncode != 0:
        subprocess.run([str(py), "-m", "pip", "install", "-q", "holistictraceanalysis"], check=True)
    return py


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run_dir", nargs="?", type=Path)
    ap.add_argument("--truth", type=Path, help="truth.json of RUN_DIR [default: RUN_DIR/truth.json]")
    ap.add_argument("--scenario", default="ddp_straggler")
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--steps", type=int, default=3)
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    import orjson

    run_dir = args.run_dir
    if run_dir is None:
        from forensics.simulate import simulate

        run_dir = Path(tempfile.mkdtemp(prefix="hta-compat-")) / args.scenario
        simulate(args.scenario, run_dir, ranks=args.ranks, steps=args.steps, seed=0)
    truth = orjson.loads((args.truth or run_dir / "truth.json").read_bytes())
    gpu_events = ("kernel", "gpu_memcpy", "gpu_memset")
    kernels = ",".join(f"{r['rank']}={sum(r['counts'].get(k, 0) for k in gpu_events)}" for r in truth["ranks"])
    py = ensure_venv()
    proc = subprocess.run([str(py), "-c", CHECK, str(run_dir / "profiler"), str(len(truth["ranks"])), kernels])
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
