"""#29 item 3: a command imports only what it uses. Each command runs in a fresh interpreter through the entry point
(`python -m forensics`), and the test reads which modules it imported: what, not how long (the time is printed by
benchmarks/startup.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

RUNNER = """
import json, runpy, sys
out, sys.argv = sys.argv[1], ["forensics", *sys.argv[2:]]
try:
    runpy.run_module("forensics", run_name="__main__", alter_sys=True)
except SystemExit as exc:
    code = exc.code
else:
    code = 0
with open(out, "w") as fh:
    # a module deferred by forensics.base.lazy and never used did not run: not imported
    json.dump({"code": code, "modules": sorted(m for m, mod in sys.modules.items()
                                               if type(mod).__name__ != "_Deferred")}, fh)
"""


def imports_of(tmp_path: Path, *args: str) -> tuple[set[str], str]:
    """The top-level packages and forensics modules ``forensics ARGS`` imported, and its stdout."""
    record = tmp_path / "modules.json"
    res = subprocess.run([sys.executable, "-c", RUNNER, str(record), *args], capture_output=True, text=True,
                         cwd=tmp_path)
    done = json.loads(record.read_text())
    assert done["code"] in (0, None), (done["code"], res.stderr)
    modules = set(done["modules"])
    return {m.split(".")[0] for m in modules} | {m for m in modules if m.startswith("forensics.")}, res.stdout


ANALYSIS = {"polars", "orjson", "forensics.pipeline", "forensics.parsers.discovery", "forensics.detectors"}
REPORTS = {"plotly", "jinja2", "narwhals", "pyarrow", "forensics.reports.html"}


def test_version_imports_no_command_line_machinery_and_no_analysis(tmp_path: Path):
    mods, stdout = imports_of(tmp_path, "--version")
    assert stdout.strip().startswith("forensics ")
    assert not mods & ({"typer", "rich", "click", "forensics.cli"} | ANALYSIS | REPORTS)


@pytest.mark.parametrize("args", [["--help"], ["analyze", "--help"], ["triage", "--help"]])
def test_help_imports_no_analysis_and_no_reports(tmp_path: Path, args: list[str]):
    mods, stdout = imports_of(tmp_path, *args)
    assert "Usage" in stdout
    assert "typer" in mods and not mods & (ANALYSIS | REPORTS)
    # typer's rich help formatter imports rich.markdown and rich.traceback for features we do not use
    assert not mods & {"markdown_it", "pygments"}


def test_a_usage_error_imports_neither_markdown_nor_pygments(tmp_path: Path):
    record = tmp_path / "modules.json"
    res = subprocess.run([sys.executable, "-c", RUNNER, str(record), "analyze", "--no-such-option"],
                         capture_output=True, text=True, cwd=tmp_path)
    done = json.loads(record.read_text())
    assert done["code"] == 2 and "No such option" in res.stderr
    assert not {m.split(".")[0] for m in done["modules"]} & {"markdown_it", "pygments"}


ENTRY = "import sys; from forensics.cli import {}; sys.argv[0] = 'forensics'; {}()"


@pytest.mark.parametrize("args", [["--help"], ["analyze", "--help"], ["simulate", "--help"], ["analyze"],
                                  ["analyze", "--nope"]])
@pytest.mark.parametrize("color", ["", "1"])
def test_help_and_usage_errors_read_as_typer_writes_them(tmp_path: Path, args: list[str], color: str):
    """The entry point's help formatter without rich.markdown and rich.traceback writes what typer's own writes
    (the app called directly, without :func:`forensics.cli.main`), colours included."""
    env = {**os.environ, "COLUMNS": "100", "FORCE_COLOR": color, "TERM": "xterm-256color"}
    shown = [subprocess.run([sys.executable, *how, *args], capture_output=True, text=True, cwd=tmp_path, env=env)
             for how in (["-c", ENTRY.format("main", "main")], ["-c", ENTRY.format("app", "app")])]
    assert (shown[0].returncode, shown[0].stdout, shown[0].stderr) == \
        (shown[1].returncode, shown[1].stdout, shown[1].stderr)
    assert "Usage" in shown[0].stdout + shown[0].stderr


def test_the_deferred_markdown_and_traceback_still_work(tmp_path: Path):
    """Were a help text ever written in Markdown, or a pretty traceback shown, the stand-ins import the real class."""
    code = """
import io, sys
import typer
from forensics.cli import _defer_help_imports
_defer_help_imports()
from typer import rich_utils
assert "rich.markdown" not in sys.modules and "pygments" not in sys.modules
from rich.console import Console
out = io.StringIO()
Console(file=out, width=40).print(rich_utils.Markdown("# Title"))
try:
    1 / 0
except ZeroDivisionError as exc:
    tb = rich_utils.Traceback.from_exception(type(exc), exc, exc.__traceback__)
import rich.markdown, rich.traceback
assert isinstance(tb, rich.traceback.Traceback) and "rich.markdown" in sys.modules
print(out.getvalue().strip())
"""
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "Title" or "Title" in res.stdout and "#" not in res.stdout


@pytest.mark.parametrize("args", [["rules", "straggler"], ["rules", "--format", "md"]])
def test_rules_imports_the_detectors_but_no_polars_reports_parsing_or_ray(tmp_path: Path, args: list[str]):
    """`rules` prints declarations: the detectors, facts and frames modules run no Polars code at import (a
    module-level Polars expression or dtype would load it here: make it a function, or a frames.Dtype)."""
    mods, stdout = imports_of(tmp_path, *args)
    assert "straggler" in stdout and "forensics.detectors.straggler" in mods
    assert "forensics.detectors.gpu_idle" in mods and "forensics.facts.context" in mods
    assert not mods & (REPORTS | {"polars", "pyarrow", "numpy", "ray", "forensics.pipeline",
                                  "forensics.parsers.discovery", "forensics.fleet", "forensics.simulate",
                                  "forensics.diff"})


def test_a_deferred_module_runs_at_its_first_use(tmp_path: Path):
    code = """
import sys
from forensics.base.lazy import defer_import
defer_import("colorsys")
import colorsys
assert "rgb_to_hsv" not in vars(colorsys)  # not run yet
assert colorsys.rgb_to_hsv(1.0, 0.0, 0.0) == (0.0, 1.0, 1.0)
from colorsys import hls_to_rgb
assert hls_to_rgb is colorsys.hls_to_rgb is sys.modules["colorsys"].hls_to_rgb
assert type(sys.modules["colorsys"]).__name__ == "module"
defer_import("no_such_module_here")
assert "no_such_module_here" not in sys.modules
"""
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert res.returncode == 0, res.stderr


def test_simulate_list_imports_no_polars(tmp_path: Path):
    mods, stdout = imports_of(tmp_path, "simulate", "--list")
    assert "ddp_straggler" in stdout
    assert not mods & ((ANALYSIS - {"orjson"}) | REPORTS)  # the simulator writes its JSON with orjson


def test_analyze_imports_neither_pyarrow_nor_ray_nor_the_other_commands(tmp_path: Path):
    mods, _ = imports_of(tmp_path, "analyze", str(ROOT / "sample_traces" / "xid79" / "kernel"), "--out",
                         str(tmp_path / "out"), "-q", "--fail-on", "never")
    assert (tmp_path / "out" / "report.html").exists()
    assert ANALYSIS <= mods
    assert not mods & {"pyarrow", "ray", "pandas", "forensics.fleet", "forensics.simulate", "forensics.diff"}


def test_analyze_of_a_trace_imports_no_parser_of_another_kind(tmp_path: Path):
    trace = next((ROOT / "sample_traces" / "ddp_straggler").rglob("*.json*"))
    mods, _ = imports_of(tmp_path, "analyze", str(trace), "--out", str(tmp_path / "out"), "-q", "--fail-on", "never")
    assert (tmp_path / "out" / "findings.json").exists() and "forensics.parsers.kineto" in mods
    others = {"forensics.parsers.nccl_log", "forensics.parsers.lastwords", "forensics.parsers.frameworks",
              "forensics.parsers.kernel_log", "forensics.parsers.nsys", "forensics.parsers.flight_recorder",
              "forensics.parsers.nvidia_smi"}
    assert not mods & others, mods & others
    # the report's figures are written without plotly.io's JSON and HTML writers (narwhals, plotly's validators)
    assert (tmp_path / "out" / "report.html").exists() and "narwhals" not in mods


def test_triage_writes_its_dataset_without_pyarrow(tmp_path: Path):
    """pyarrow (1,500 modules with numpy) was imported only to put the metadata into triage.parquet."""
    import shutil

    import polars as pl

    jobs = tmp_path / "jobs"
    shutil.copytree(ROOT / "sample_traces" / "xid79", jobs / "a")
    mods, _ = imports_of(tmp_path, "triage", str(jobs), "--out", str(tmp_path / "out"), "-q")
    assert "forensics.fleet.triage" in mods and not mods & {"pyarrow", "numpy"}
    assert "forensics.reports.triage_html" in mods and "narwhals" not in mods  # no plotly graph objects
    meta = pl.read_parquet_metadata(tmp_path / "out" / "triage.parquet")
    assert meta["forensics.schema"] == "docs/triage.md (triage.parquet)" and meta["forensics.version"]
    assert pl.read_parquet(tmp_path / "out" / "triage.parquet")["job_id"].to_list() == ["a"]


def test_diff_imports_no_plotly_graph_objects(tmp_path: Path):
    """diff.html's waterfall is a plain figure: plotly's graph objects (validators, narwhals) are not imported."""
    run = ROOT / "sample_traces" / "ddp_straggler"
    mods, _ = imports_of(tmp_path, "diff", str(run), str(run), "--out", str(tmp_path / "out"), "-q")
    assert (tmp_path / "out" / "diff.html").exists() and "forensics.reports.diff_html" in mods
    assert "narwhals" not in mods
