"""Start-up of each `forensics` command: CPU, wall time, peak RSS and what it imports, in fresh processes.

    python benchmarks/startup.py                                   # this checkout, 5 runs per command
    python benchmarks/startup.py --python ../main/.venv/bin/python # and another checkout's venv, in the same run
    python benchmarks/startup.py --repeat 9 --only version --only rules

Each command runs as a user runs it, through its venv's `forensics` script, with a bytecode cache (as an installed
package has its .pyc), warmed once: CPU seconds (user + system, the process and the children it waited for) and
peak RSS from wait4, the median of --repeat runs. One more run under ``-X importtime`` counts the modules the
command imported and names the heavy packages among them (:data:`WATCH`). Figures depend on the machine and its
load: compare only the columns of one run.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "sample_traces" / "xid79" / "kernel"  # two kernel logs: no trace, no figure-heavy report
SMALL = ROOT / "sample_traces" / "ddp_straggler"  # the README's 8-rank example
COMMANDS: dict[str, list[str]] = {
    "version": ["--version"],
    "help": ["--help"],
    "analyze --help": ["analyze", "--help"],
    "rules": ["rules"],
    "simulate --list": ["simulate", "--list"],
    "analyze tiny": ["analyze", str(TINY), "--out", "{out}", "-q", "--fail-on", "never"],
    "analyze 8 ranks": ["analyze", str(SMALL), "--out", "{out}", "-q", "--fail-on", "never"],
}
WATCH = ("typer", "rich", "polars", "orjson", "plotly", "narwhals", "jinja2", "pyarrow", "numpy", "pandas", "ray",
         "pydantic", "markdown_it", "pygments", "msgspec")
"""Packages whose presence says what a command pays for."""


def script(python: str) -> str:
    """The venv's `forensics` entry point next to ``python``."""
    path = Path(python).parent / "forensics"
    if not path.exists():
        raise SystemExit(f"no forensics script next to {python}")
    return str(path)


def environment(cache: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = str(cache)
    return env


def run_once(cmd: list[str], env: dict[str, str]) -> tuple[float, float, float]:
    """(CPU s, wall s, peak RSS MB) of one run of ``cmd``."""
    out = Path(tempfile.mkdtemp(prefix="forensics-startup-"))
    argv = [a.replace("{out}", str(out / "out")) for a in cmd]
    try:
        start = time.perf_counter()
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env,
                                cwd=tempfile.gettempdir())
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        if os.waitstatus_to_exitcode(status) != 0:
            raise RuntimeError(f"{' '.join(argv)} failed: {proc.stderr.read().decode()[-1000:] if proc.stderr else ''}")
        return usage.ru_utime + usage.ru_stime, wall, usage.ru_maxrss / 1024
    finally:
        shutil.rmtree(out, ignore_errors=True)


def imported(cmd: list[str], env: dict[str, str]) -> list[str]:
    """The modules ``cmd`` imported (``-X importtime`` names every one)."""
    out = Path(tempfile.mkdtemp(prefix="forensics-startup-"))
    argv = [a.replace("{out}", str(out / "out")) for a in cmd]
    try:
        res = subprocess.run([argv[0], "-X", "importtime", *argv[1:]], capture_output=True, text=True, env=env,
                             cwd=tempfile.gettempdir())
    finally:
        shutil.rmtree(out, ignore_errors=True)
    return [line.rsplit("|", 1)[1].strip() for line in res.stderr.splitlines()
            if line.startswith("import time:") and "self [us]" not in line]


def measure(python: str, args: list[str], env: dict[str, str], repeat: int) -> dict[str, object]:
    cmd = [python, script(python), *args]
    runs = [run_once(cmd, env) for _ in range(repeat)]
    mods = imported(cmd, env)
    tops = {m.split(".")[0] for m in mods}
    return {"cpu": statistics.median(r[0] for r in runs), "wall": statistics.median(r[1] for r in runs),
            "rss": statistics.median(r[2] for r in runs), "modules": len(mods),
            "heavy": [w for w in WATCH if w in tops]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--python", action="append", default=[],
                    help="another checkout's venv python (repeatable); this checkout's is always measured")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--only", action="append", default=[], help="only this command (a key of COMMANDS)")
    args = ap.parse_args()
    pythons = [sys.executable, *args.python]
    cache = Path(tempfile.mkdtemp(prefix="forensics-startup-pyc-"))
    env = environment(cache)
    names = [n for n in COMMANDS if not args.only or n in args.only]
    try:
        for python in pythons:  # the bytecode cache, warmed once per interpreter (not measured)
            for name in names:
                run_once([python, script(python), *COMMANDS[name]], env)
        print(f"{time.strftime('%H:%M:%S')}, load average {os.getloadavg()[0]:.1f}; median of {args.repeat} runs")
        print("| command | checkout | CPU s | wall s | peak MB | modules | heavy packages imported |")
        print("|---|---|---:|---:|---:|---:|---|")
        for name in names:
            for python in pythons:
                m = measure(python, COMMANDS[name], env, args.repeat)
                where = Path(python).parents[2].name if python != sys.executable else "this"
                print(f"| `{name}` | {where} | {m['cpu']:.3f} | {m['wall']:.3f} | {m['rss']:.0f} | {m['modules']} | "
                      f"{', '.join(m['heavy']) or '-'} |", flush=True)
        print(f"{time.strftime('%H:%M:%S')}, load average {os.getloadavg()[0]:.1f}")
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
