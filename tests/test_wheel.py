"""The built wheel installs one import package, `forensics`, with parsers/ and reports/ inside it (issue #12.2):
no top-level `parsers` or `reports` that would clash with other distributions in site-packages."""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from tests.conftest import ROOT

# what a source distribution needs to build: the project file, the readme it names, the three package folders,
# setup.py (the optional compiled Flight Recorder reader)
BUILD_INPUTS = ("pyproject.toml", "setup.py", "README.md", "forensics", "parsers", "reports")


def _build_wheel(tmp_path: Path) -> Path:
    # build from a clean copy so a stale build/ or *.egg-info in the checkout cannot leak into the wheel
    src = tmp_path / "src"
    for name in BUILD_INPUTS:
        path = ROOT / name
        if path.is_dir():
            skip = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "*.so")  # *.so: built here
            shutil.copytree(path, src / name, ignore=skip)
        else:
            src.mkdir(exist_ok=True)
            shutil.copy(path, src / name)
    out = tmp_path / "dist"
    res = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(src)],
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr
    (wheel,) = out.glob("*.whl")
    return wheel


def _py_files(folder: str) -> set[str]:
    return {p.relative_to(ROOT / folder).as_posix() for p in (ROOT / folder).rglob("*.py")}


def test_wheel_has_only_the_forensics_package(tmp_path: Path):
    # the name from [project] (a regex: tomllib is 3.11+ and the project supports 3.10); the version is declared
    # once, in forensics/__init__.py, and read from there by setuptools
    text = (ROOT / "pyproject.toml").read_text()
    assert re.search(r'^dynamic = \["version"\]$', text, re.M) and not re.search(r'^version = "', text, re.M)
    init = (ROOT / "forensics" / "__init__.py").read_text()
    project = {"name": re.search(r'^name = "([^"]+)"', text, re.M).group(1),
               "version": re.search(r'^__version__ = "([^"]+)"$', init, re.M).group(1)}
    dist = project["name"].replace("-", "_")
    wheel = _build_wheel(tmp_path)
    assert wheel.name.startswith(f"{dist}-{project['version']}-")
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names} == {"forensics", f"{dist}-{project['version']}.dist-info"}
    # every module of parsers/ and reports/ (listed from the checkout) sits under forensics/
    for folder in ("parsers", "reports"):
        inside = {n.removeprefix(f"forensics/{folder}/") for n in names
                  if n.startswith(f"forensics/{folder}/") and n.endswith(".py")}
        assert inside == _py_files(folder), folder
    # every module of forensics/ itself, subpackages included (a package missing from pyproject's list is lost)
    inside = {n.removeprefix("forensics/") for n in names if n.startswith("forensics/") and n.endswith(".py")}
    assert _py_files("forensics") <= inside
    assert "forensics/cli.py" in names and "forensics/schema/findings.schema.json" in names
    assert "forensics/base/data/xid_catalog.csv" in names
    # report.html's templates are package data
    templates = {p.name for p in (ROOT / "reports" / "templates").iterdir() if p.is_file()}
    assert templates and {n.removeprefix("forensics/reports/templates/") for n in names
                          if n.startswith("forensics/reports/templates/")} == templates
    # the compiled readers are built where this checkout's were (optional: absent without a compiler)
    for reader in ("fr_columns", "kineto_columns"):
        if importlib.util.find_spec(f"forensics.parsers.{reader}") is not None:
            assert any(re.fullmatch(rf"forensics/parsers/{reader}\..*\.so", n) for n in names), reader
            assert f"forensics/parsers/{reader}.pyi" in names
    entry_points = zipfile.ZipFile(wheel).read(f"{dist}-{project['version']}.dist-info/entry_points.txt").decode()
    assert "forensics = forensics.__main__:main" in entry_points
