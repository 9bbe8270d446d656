"""Every generated document is current: one check (`forensics docs --check`) for all of them."""

from __future__ import annotations

import json
import shutil

import jinja2
from forensics.reports import docs
from typer.testing import CliRunner

from forensics.cli import app
from tests.conftest import ROOT


def test_every_generated_document_is_current():
    assert sorted(docs.GENERATED) == ["docs/collectives.md", "docs/detectors.md", "docs/frames.md", "docs/incidents.md",
                                      "reports/templates/compiled.json"]
    stale = docs.stale(ROOT)
    shipped = json.loads((ROOT / "reports" / "templates" / "compiled.json").read_text())["jinja2"]
    if shipped != jinja2.__version__:  # another Jinja2 generates other code; the reports compile from source then
        stale.remove("reports/templates/compiled.json")
    assert stale == [], "a generated document is stale: run `forensics docs`"


def test_check_fails_on_a_stale_document_and_docs_rewrites_it(tmp_path):
    for rel in docs.GENERATED:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / rel, tmp_path / rel)
    frames_md = tmp_path / "docs" / "frames.md"
    frames_md.write_text(frames_md.read_text() + "hand edit\n")
    runner = CliRunner()
    res = runner.invoke(app, ["docs", "--check", "--root", str(tmp_path)])
    assert res.exit_code == 1 and "docs/frames.md" in res.output
    res = runner.invoke(app, ["docs", "--root", str(tmp_path)])
    assert res.exit_code == 0 and "docs/frames.md" in res.output
    assert frames_md.read_text() == (ROOT / "docs" / "frames.md").read_text()
    assert runner.invoke(app, ["docs", "--check", "--root", str(tmp_path)]).exit_code == 0
