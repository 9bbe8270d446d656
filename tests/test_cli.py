from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import (
    ROOT,
    SCHEMA_PATH,
    SHARED,
    assert_valid_findings,
    folder_files,
    run_cli,
    shared_path,
    write_old_outputs,
)


def test_vendored_schema_matches_shared_contract():
    shared = shared_path("findings.schema.json", root=SHARED)
    assert json.loads(shared.read_text()) == json.loads(SCHEMA_PATH.read_text())


def test_missing_run_dir_is_exit_2_without_traceback(tmp_path: Path):
    res = run_cli("analyze", str(tmp_path / "nope"), "--out", str(tmp_path / "o"))
    assert res.returncode == 2
    assert "Traceback" not in res.stderr and "no such file or directory" in res.stderr


def test_bad_option_value_is_exit_2(tmp_path: Path):
    res = run_cli("analyze", str(tmp_path), "--fail-on", "bogus")
    assert res.returncode == 2
    assert "Traceback" not in res.stderr


def test_out_inside_run_dir_is_refused(tmp_path: Path):
    res = run_cli("analyze", str(tmp_path), "--out", str(tmp_path / "report"))
    assert res.returncode == 2 and "inside RUN_DIR" in res.stderr
    assert not (tmp_path / "report").exists()


def test_folder_without_readable_source_is_exit_2_but_still_reports(tmp_path: Path, findings_validator):
    run = tmp_path / "run"
    run.mkdir()
    (run / "notes.txt").write_text("nothing here\n")
    (run / "rank0.pt.trace.json").write_text("")
    res = run_cli("analyze", str(run), "--out", str(tmp_path / "o"), "-q")
    assert res.returncode == 2, res.stderr
    doc = assert_valid_findings(findings_validator, tmp_path / "o" / "findings.json")
    statuses = {s["path"]: (s["kind"], s["status"]) for s in doc["run"]["sources"]}
    assert statuses == {"notes.txt": ("unknown", "ignored"), "rank0.pt.trace.json": ("kineto", "failed")}
    assert (tmp_path / "o" / "summary.md").exists() and (tmp_path / "o" / "report.html").exists()
    failed = next(s["message"] for s in doc["run"]["sources"] if s["path"] == "rank0.pt.trace.json")
    assert "Traceback" not in res.stderr
    assert f"(1 recognised source(s) not used: {failed}; see run.sources in" in res.stderr.splitlines()[-1]


def test_unranked_traces_say_why_nothing_was_used(tmp_path: Path):
    """Four unrelated nsys exports with no rank in them: exit 2, and the error says why none was used."""
    run = shared_path("nsys", "nsys-ai")
    res = run_cli("analyze", str(run), "--out", str(tmp_path / "o"), "-q")
    assert res.returncode == 2, res.stderr
    assert "4 recognised source(s) not used: names no rank" in one_line(res.stderr)


def test_nsys_report_alone_says_to_export_it(tmp_path: Path):
    """A binary .nsys-rep (found by its magic, whatever its name) is not read: the error says how to export it."""
    rep = next(shared_path("nsys", "DistributedSysLab_FS24", "ring_simple_2nodes_6gpus_job508813").glob("*.nsys-rep"))
    run = tmp_path / "run"
    run.mkdir()
    shutil.copy(rep, run / "report.bin")
    res = run_cli("analyze", str(run), "--out", str(tmp_path / "o"), "-q")
    assert res.returncode == 2, res.stderr
    assert "1 file(s), none a recognised trace or log: Nsight Systems report: export it with `nsys export --type " \
        "sqlite`" in one_line(res.stderr)


def test_unknown_detector_setting_is_exit_2(tmp_path: Path):
    res = run_cli("analyze", str(tmp_path), "--out", str(tmp_path.parent / "o2"), "--set", "nosuch.x=1")
    assert res.returncode == 2 and "unknown detector" in res.stderr


def test_unknown_option_and_missing_argument_are_exit_2_without_traceback(tmp_path: Path):
    for args in (("analyze", str(tmp_path), "--bogus"), ("analyze",), ("nosuchcommand",)):
        res = run_cli(*args)
        assert res.returncode == 2, args
        assert "Traceback" not in res.stderr and "Error" in res.stderr, args


# --- issue #13: outputs, exits, interrupts, markup ----------------------------------------------------

SAMPLE = ROOT / "sample_traces" / "ddp_straggler"


def one_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    assert len(lines) == 1, text
    assert "Traceback" not in text
    return lines[0]


def run_patched(patch: str, *args: str, **kw) -> subprocess.Popen | subprocess.CompletedProcess:
    """The real entry point, with ``patch`` (Python source) applied first: to make a bug or a slow phase."""
    code = f"{patch}\nimport sys\nsys.argv = ['forensics', *{list(args)!r}]\nfrom forensics.cli import main\nmain()\n"
    if kw.pop("background", False):
        return subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, **kw)


@pytest.mark.parametrize("make_out,expect", [
    (lambda t: (t / "f.txt").write_text("x") and t / "f.txt", "exists and is not a folder"),
    (lambda t: Path("/usr/share/forensics-out"), "system folder"),
    (lambda t: Path("/"), "system folder"),
    (lambda t: (t / "f.txt").write_text("x") and t / "f.txt" / "sub", "is not a folder"),
])
def test_bad_out_is_exit_2_one_line_before_parsing(tmp_path: Path, make_out, expect: str):
    out = make_out(tmp_path)
    touched = tmp_path / "parsing-started"
    # parsing would leave a mark: the check must refuse --out before it
    patch = (f"import pathlib, forensics.pipeline as an\nreal = an.load\n"
             f"def load(*a, **k):\n    pathlib.Path({str(touched)!r}).touch()\n    return real(*a, **k)\nan.load = "
             f"load")
    res = run_patched(patch, "analyze", str(SAMPLE), "--out", str(out))
    assert res.returncode == 2, res.stderr
    assert expect in one_line(res.stderr)
    assert res.stdout == "" and not touched.exists()  # refused before parsing: no timing needed


def test_out_file_given_to_frames_and_triage_too(tmp_path: Path):
    (tmp_path / "f").write_text("x")
    for cmd in (("frames", str(SAMPLE)), ("triage", str(SAMPLE.parent))):
        res = run_cli(*cmd, "--out", str(tmp_path / "f"))
        assert res.returncode == 2 and "exists and is not a folder" in one_line(res.stderr), cmd


def test_version_help_and_workers(tmp_path: Path):
    from importlib.metadata import version

    res = run_cli("--version")
    assert res.returncode == 0 and res.stdout.strip() == f"forensics {version('trace-forensics')}"
    for cmd in ((), ("analyze",), ("frames",), ("triage",), ("simulate",), ("rules",)):
        res = run_cli(*cmd, "-h")
        assert res.returncode == 0 and "Usage" in res.stdout, cmd
    res = run_cli("analyze", str(SAMPLE), "--out", str(tmp_path / "o"), "--workers", "0")
    assert res.returncode == 2 and "--workers" in res.stderr and not (tmp_path / "o").exists()


def test_write_error_is_exit_2_and_keeps_previous_outputs(tmp_path: Path):
    out = tmp_path / "o"
    before = write_old_outputs(out)
    patch = ("import errno, os, forensics.base.outputs as o\n"
             "def full(path): raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))\n"
             "o._fsync_file = full")
    res = run_patched(patch, "analyze", str(SAMPLE), "--out", str(out), "-q")
    assert res.returncode == 2, res.stderr
    assert "No space left on device" in one_line(res.stderr)
    assert folder_files(out) == before


def test_internal_error_is_exit_3_with_phase_file_and_crash_txt(tmp_path: Path):
    out = tmp_path / "o"
    # a bug below the real classify(): the traceback runs through discovery with the file at hand
    patch = ("import forensics.parsers.discovery as d\n"
             "real = d.read_head\n"
             "def read_head(path, n):\n"
             "    if str(path).endswith('dmesg.log'): raise ZeroDivisionError('boom')\n"
             "    return real(path, n)\n"
             "d.read_head = read_head")
    res = run_patched(patch, "analyze", str(SAMPLE), "--out", str(out), "-q", "--fail-on", "never")
    assert res.returncode == 3, res.stderr
    line = one_line(res.stderr)
    assert "internal error during discover" in line and "kernel/hgx-5200/dmesg.log" in line
    assert "ZeroDivisionError" in line
    crash = (out / "crash.txt").read_text()
    assert "Traceback" in crash and "ZeroDivisionError: boom" in crash and "in read_head" in crash
    assert sorted(p.name for p in out.iterdir()) == ["crash.txt"]  # no report that looks complete


def test_bug_in_a_detector_or_renderer_names_the_phase(tmp_path: Path):
    patch = ("import dataclasses, forensics.detectors as d\n"
             "d.load_all()\n"
             "def bad(ctx, cfg): raise KeyError('oops')\n"
             "d.REGISTRY['straggler'] = dataclasses.replace(d.REGISTRY['straggler'], func=bad)")
    res = run_patched(patch, "analyze", str(SAMPLE), "--out", str(tmp_path / "a"), "-q")
    assert res.returncode == 3 and "internal error during detect of detector straggler" in one_line(res.stderr)
    patch = "import forensics.reports.markdown as m\ndef bad(a, top=20): raise ValueError('md')\nm.render = bad"
    res = run_patched(patch, "analyze", str(SAMPLE), "--out", str(tmp_path / "b"), "-q")
    assert res.returncode == 3 and "internal error during render" in one_line(res.stderr)
    assert "ValueError: md" in (tmp_path / "b" / "crash.txt").read_text()


# How the signal leaves the detectors phase: as itself, or wrapped in pyo3's PanicException (a BaseException), as
# when a Ctrl-C lands in a Python call Polars' Rust code made and unwraps (a Categorical's check inside
# ``df.dtypes``, seen in CI); that one used to end the run in Python's own traceback and exit 1.
_SURFACES = {
    "itself": "    time.sleep(600)\n",
    "polars_panic": ("    try:\n        time.sleep(600)\n"
                     "    except KeyboardInterrupt as exc:\n"
                     "        raise pe.PanicException('called unwrap on KeyboardInterrupt') from exc\n"),
}


@pytest.mark.parametrize("surfaces", sorted(_SURFACES))
@pytest.mark.parametrize("sig,code,word", [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "terminated")])
def test_signal_is_one_line_and_leaves_previous_outputs(tmp_path: Path, sig: int, code: int, word: str, surfaces: str):
    out = tmp_path / "o"
    before = write_old_outputs(out)
    ready = tmp_path / "ready"
    # the detectors phase waits (as a slow one would); the signal arrives while it runs
    patch = ("import time, pathlib, polars.exceptions as pe, forensics.detectors as d\n"
             f"def slow(*a, **k):\n    pathlib.Path({str(ready)!r}).touch()\n{_SURFACES[surfaces]}"
             "d.run_detectors = slow\n"
             "import forensics.pipeline as an\nan.run_detectors = slow")
    proc = run_patched(patch, "analyze", str(SAMPLE), "--out", str(out), "-q", background=True)
    deadline = time.monotonic() + 60
    while not ready.exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    proc.send_signal(sig)
    stdout, stderr = proc.communicate(timeout=60)  # a hang guard: the signal, not a clock, ends the run
    assert proc.returncode == code, stderr
    assert one_line(stderr).startswith(f"{word}: during detect")
    assert stdout == ""
    assert folder_files(out) == before  # no new output, nothing half-written, no temporary file


def test_a_polars_panic_without_a_signal_is_an_internal_error(tmp_path: Path):
    patch = ("import polars.exceptions as pe, forensics.detectors as d\n"
             "def bad(*a, **k):\n    raise pe.PanicException('index out of bounds')\n"
             "d.run_detectors = bad\nimport forensics.pipeline as an\nan.run_detectors = bad")
    res = run_patched(patch, "analyze", str(SAMPLE), "--out", str(tmp_path / "o"), "-q")
    assert res.returncode == 3, res.stderr
    assert "internal error during detect" in one_line(res.stderr) and "Traceback" not in res.stderr
    assert "PanicException: index out of bounds" in (tmp_path / "o" / "crash.txt").read_text()


HOSTILE = "a[b]<script>|x`y`[red]z"  # rich would print "a<script>|x`y`z" in bold red


def test_hostile_file_names_are_text_everywhere(tmp_path: Path):
    run = tmp_path / "run"
    shutil.copytree(SAMPLE, run)
    (run / f"{HOSTILE}.pt.trace.json").write_text('{"traceEvents": [')  # damaged: listed on stderr and in reports
    out = tmp_path / "o"
    res = run_cli("analyze", str(run), "--out", str(out), "--fail-on", "never")
    assert res.returncode == 0, res.stderr
    assert "Traceback" not in res.stderr
    assert f"{HOSTILE}.pt.trace.json" in res.stderr  # printed as written, brackets included
    md = (out / "summary.md").read_text()
    assert "<script>" not in md and "\\<script\\>" in md and "\\|x\\`y\\`" in md
    page = (out / "report.html").read_text()
    assert HOSTILE not in page and "a[b]&lt;script&gt;|x`y`[red]z" in page


def test_hostile_out_and_run_dir_names_reach_the_terminal_as_text(tmp_path: Path):
    run = tmp_path / f"run{HOSTILE}"
    shutil.copytree(SAMPLE, run)
    out = tmp_path / f"out{HOSTILE}"
    res = run_cli("analyze", str(run), "--out", str(out), "-q", "--fail-on", "never")
    assert res.returncode == 0, res.stderr
    assert f"Report: {out}" in res.stdout
    res = run_cli("analyze", str(run), "--out", str(run / "x"))
    assert res.returncode == 2 and f"--out {run / 'x'} is inside RUN_DIR" in one_line(res.stderr)


def test_single_file_run_dir_passes_the_cli_checks(tmp_path: Path):
    src = next(SAMPLE.glob("profiler/*.pt.trace.json.gz"))
    trace = tmp_path / "in" / src.name  # a copy: the analysis runs and writes beside it, never into the sample
    trace.parent.mkdir()
    trace.write_bytes(src.read_bytes())
    res = run_cli("analyze", str(trace), "--out", str(trace.parent / "o"))
    # a file is not a folder: an --out beside it is fine, the checks do not call RUN_DIR a missing folder
    assert "no such file or directory" not in res.stderr and "inside RUN_DIR" not in res.stderr
    res = run_cli("analyze", str(tmp_path / "missing.json"), "--out", str(tmp_path / "o"))
    assert res.returncode == 2 and "missing.json: no such file or directory" in one_line(res.stderr)


def test_frames_write_error_is_exit_2_and_keeps_previous_parquet(tmp_path: Path):
    out = tmp_path / "frames"
    out.mkdir()
    (out / "kernels.parquet").write_bytes(b"previous")
    # Polars reports its own write errors (not OSError): the disk fills while it writes
    patch = ("import polars as pl\n"
             "def full(self, path, *a, **k): raise pl.exceptions.ComputeError('No space left on device (os error "
             "28)')\n"
             "pl.DataFrame.write_parquet = full")
    res = run_patched(patch, "frames", str(SAMPLE), "--out", str(out), "-q")
    assert res.returncode == 2, res.stderr
    assert "No space left on device" in one_line(res.stderr)
    assert folder_files(out) == {"kernels.parquet": b"previous"}


def test_bus_ids_are_not_emoji_codes_in_the_verdict(tmp_path: Path):
    # the straggler's GPU is 0000:ab:00.0 (the simulator's truth); rich turns ":ab:" into an emoji unless told not to
    truth = json.loads((ROOT / "sample_traces" / "ddp_straggler.truth.json").read_text())
    res = run_cli("analyze", str(ROOT / "sample_traces" / "ddp_straggler"), "--out", str(tmp_path / "o"))
    assert res.returncode == 0, res.stderr
    assert "0000:ab:00.0" in json.dumps(truth)
    assert "0000:ab:00.0" in res.stdout and "\U0001f18e" not in res.stdout


def test_polars_allocator_gets_few_arenas_unless_the_user_chose():
    """The CLI's process (and its parser workers) run Polars' jemalloc with one arena per eight cores, at least one;
    a value the user set is left alone."""
    code = ("import os, sys; sys.argv = ['forensics', '--version']\n"
            "from forensics.cli import main\n"
            "try:\n    main()\nexcept SystemExit:\n    pass\n"
            "print(os.environ.get('_RJEM_MALLOC_CONF'), os.cpu_count())")
    env = {k: v for k, v in os.environ.items() if k != "_RJEM_MALLOC_CONF"}
    conf, cpus = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                                check=True).stdout.split()[-2:]
    assert conf == f"narenas:{max(1, int(cpus) // 8)}"
    env["_RJEM_MALLOC_CONF"] = "narenas:3"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True).stdout
    assert out.split()[-2] == "narenas:3"
    from forensics.cli import _jemalloc_conf

    assert [_jemalloc_conf(n) for n in (1, 2, 8, 15, 16, 64)] == ["narenas:1"] * 4 + ["narenas:2", "narenas:8"]


def test_start_up_imports_run_without_the_cyclic_collector_and_are_frozen():
    """The entry point and `analyze` import with the collector paused, then freeze what exists (start-up's objects
    live as long as the process); the collector runs again afterwards, and stays off if it was off."""
    code = ("import gc, sys; sys.argv = ['forensics', 'version']; from forensics.__main__ import main\n"
            "try:\n    main()\nexcept SystemExit:\n    pass\n"
            "print(gc.isenabled(), gc.get_freeze_count() > 1000)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split()[-2:] == ["True", "True"]
    import gc

    from forensics.base.lazy import imports_without_gc

    try:
        for enabled in (True, False):
            (gc.enable if enabled else gc.disable)()
            with imports_without_gc():
                assert not gc.isenabled()
            assert gc.isenabled() is enabled
    finally:
        gc.unfreeze()
        gc.enable()
