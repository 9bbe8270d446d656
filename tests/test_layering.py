"""Data code never depends on rendering: only the CLI imports forensics.reports."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import ROOT

ALLOWED = {Path("forensics/cli.py")}


def _imports(source: str) -> list[str]:
    """Every module an import statement names (``from a import b`` gives a and a.b; relative keep dots)."""
    names: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = "." * node.level + (node.module or "")
            sep = "" if base.endswith(".") else "."
            names += [base] + [f"{base}{sep}{a.name}" for a in node.names]
    return names


def _is_reports(name: str, path: Path) -> bool:
    if name.startswith("."):  # relative import: resolve against the file's package folder
        level = len(name) - len(name.lstrip("."))
        pkg = path.relative_to(ROOT).parent.parts
        pkg = pkg[: len(pkg) - (level - 1)] if level > 1 else pkg
        name = ".".join([*pkg, name.lstrip(".")]).strip(".")
    parts = name.split(".")
    return parts[:2] == ["forensics", "reports"] or parts[0] == "reports"


def test_only_the_cli_imports_reports():
    offenders = []
    for folder in ("forensics", "parsers"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT)
            if rel in ALLOWED:
                continue
            bad = sorted({n for n in _imports(path.read_text(encoding="utf-8")) if _is_reports(n, path)})
            if bad:
                offenders.append(f"{rel}: {', '.join(bad)}")
    assert not offenders, "data code imports rendering:\n" + "\n".join(offenders)


def test_the_scan_sees_each_import_form():
    probe = ROOT / "forensics" / "_layering_probe.py"
    for line in ("from forensics.reports import markdown", "import forensics.reports.html", "from forensics import reports",
                 "from .. import reports"):
        probe_names = [n for n in _imports(line) if _is_reports(n, probe)]
        assert probe_names, line
    assert not [n for n in _imports("from forensics import triage") if _is_reports(n, probe)]
