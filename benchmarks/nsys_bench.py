"""Parse time and peak memory of the nsys parser: `forensics frames` on one export, in a child process.

    /work/venv/bin/python benchmarks/nsys_bench.py                    # largest export in ../shared/sample_data/nsys
    /work/venv/bin/python benchmarks/nsys_bench.py --synthetic 2000000 # plus a generated export with N kernels

Each case runs `python -m forensics.cli frames RUN_DIR --out OUT --workers 1` in a fresh child
process (through a tiny wrapper that reports the child's peak RSS from getrusage), best of --repeat.
The synthetic export has N kernels, N CUDA launches and N/4 NVTX ranges, all with distinct names'
string ids, so it exercises the SQL joins and batching; its size on disk is printed alongside.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT.parent / "shared" / "sample_data" / "nsys"

_WRAPPER = """
import resource, subprocess, sys, time, json
t = time.perf_counter()
rc = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode
wall = time.perf_counter() - t
peak_mib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
print(json.dumps({"rc": rc, "wall_s": wall, "peak_rss_mib": peak_mib}))
"""


def measure(run_dir: Path, repeat: int, expect_rc: int = 0) -> dict:
    best: dict | None = None
    for _ in range(repeat):
        with tempfile.TemporaryDirectory() as out:
            cmd = [sys.executable, "-c", _WRAPPER, sys.executable, "-m", "forensics.cli", "frames", str(run_dir),
                   "--out", out, "--workers", "1", "--quiet"]
            res = json.loads(subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=True).stdout)
        if res["rc"] != expect_rc:
            raise SystemExit(f"forensics frames failed on {run_dir} (exit {res['rc']})")
        if best is None or res["wall_s"] < best["wall_s"]:
            best = res
    assert best is not None
    return best


def synthesize(path: Path, n: int, seed: int = 0) -> None:
    sys.path.insert(0, str(ROOT))
    from tests.nsys_synth import DDL, gpid, gtid

    rnd = random.Random(seed)
    con = sqlite3.connect(path)
    con.executescript(DDL)
    con.execute("CREATE TABLE META_DATA_EXPORT (name TEXT, value TEXT)")
    con.executemany("INSERT INTO META_DATA_EXPORT VALUES (?, ?)", [("EXPORT_PRODUCT_VERSION", "synthetic"),
                    ("EXPORT_CONFIG_TIME_SHIFT", "0")])
    con.execute("INSERT INTO TARGET_INFO_SESSION_START_TIME VALUES (1700000000000000000, '', '')")
    con.execute("INSERT INTO META_DATA_CAPTURE VALUES ('PROCESS_0:ENVIRONMENT_VARIABLE', 'RANK=\"0\"')")
    names = [f"void kernel_{i}<float, {i % 7}>(float*, int)" for i in range(2000)]
    con.executemany("INSERT INTO StringIds VALUES (?, ?)", [(i + 1, s) for i, s in enumerate(names)])
    con.executemany("INSERT INTO StringIds VALUES (?, ?)",
                    [(5001, "cudaLaunchKernel_v7000"), (5002, "ncclDevKernel_AllReduce_Sum_f32_RING_LL")])
    pid, t = 4242, 0
    batch = 100_000
    for lo in range(0, n, batch):
        krows, rrows = [], []
        for i in range(lo, min(n, lo + batch)):
            t += rnd.randint(1_000, 20_000)
            name = 5002 if i % 50 == 0 else rnd.randint(1, len(names))
            krows.append((t + 5_000, t + 5_000 + rnd.randint(2_000, 200_000), 0, 1, 7, i, gpid(pid), name, name, 132, 1,
                          1, 256, 1, 1))
            rrows.append((t, t + 3_000, 1, gtid(pid, pid), i, 5001, 0))
        con.executemany("INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)", krows)
        con.executemany("INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (?,?,?,?,?,?,?)", rrows)
        con.executemany("INSERT INTO NVTX_EVENTS (start, end, eventType, globalTid, text) VALUES (?,?,59,?,?)",
                        [(r[0], r[1] + 10_000, gtid(pid, pid), f"aten::op_{j % 300}") for j,
                         r in enumerate(rrows[::4])])
    con.commit()
    con.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--synthetic", type=int, default=0, help="also benchmark a generated export with this many kernels")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        exports = sorted(SAMPLES.rglob("*.sqlite"), key=lambda p: p.stat().st_size)
        if exports:
            largest = exports[-1]
            run_dir = Path(tmp) / "real"
            run_dir.mkdir()
            shutil.copy(largest, run_dir / largest.name)
            results.append({"case": f"largest sample export ({largest.relative_to(SAMPLES)})",
                            "size_mib": largest.stat().st_size / 2**20, **measure(run_dir, args.repeat)})
        empty = Path(tmp) / "empty"
        empty.mkdir()
        (empty / "note.txt").write_text("nothing to parse\n")
        baseline = measure(empty, args.repeat, expect_rc=2)  # "nothing readable" exit
        results.append({"case": "baseline (CLI start-up, no export)", "size_mib": 0.0, **baseline})
        if args.synthetic:
            run_dir = Path(tmp) / "synthetic"
            run_dir.mkdir()
            t = time.perf_counter()
            synthesize(run_dir / "synthetic.sqlite", args.synthetic)
            gen = time.perf_counter() - t
            size = (run_dir / "synthetic.sqlite").stat().st_size / 2**20
            results.append({"case": f"synthetic export, {args.synthetic:,} kernels + launches (generated in {gen:.0f} "
                                    f"s)",
                            "size_mib": size, **measure(run_dir, args.repeat)})
    print(f"{'case':<78} {'size MiB':>9} {'wall s':>8} {'peak RSS MiB':>13}")
    for r in results:
        print(f"{r['case']:<78} {r['size_mib']:>9.1f} {r['wall_s']:>8.2f} {r['peak_rss_mib']:>13.0f}")


if __name__ == "__main__":
    main()
