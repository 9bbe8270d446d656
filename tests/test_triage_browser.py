"""triage.html in a real browser (Debian chromium via tests/browser.py): it renders offline, the figure is
drawn, names from the input stay text, and every job link opens that job's own report."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from tests.browser import open_page  # noqa: F401  (a pytest fixture)
from tests.conftest import ROOT

ODD = "odd|job`<img src=x onerror=alert(1)>[x]"


def test_triage_page_in_the_browser(open_page, tmp_path: Path):  # noqa: F811
    jobs = tmp_path / "jobs"
    shutil.copytree(ROOT / "sample_traces" / "xid79", jobs / "xid79")
    shutil.copytree(ROOT / "sample_traces" / "ddp_straggler", jobs / ODD)
    out = tmp_path / "t"
    res = subprocess.run([sys.executable, "-m", "forensics.cli", "triage", str(jobs), "--out", str(out), "-q",
                          "--workers", "1"], capture_output=True, text=True, cwd=ROOT)
    assert res.returncode == 0, res.stderr
    opened = open_page(out / "triage.html")
    page = opened.page
    assert page.locator("#fig-timeline .main-svg").count() >= 1  # plotly drew the figure, offline
    assert page.locator("#culprits td.culprit").all_inner_texts() == ["hgx-5200"]
    assert any(t.startswith(ODD) for t in page.locator("#jobs td.job").all_inner_texts())  # text, not a tag
    hrefs = page.locator("#jobs a.report").evaluate_all("els => els.map(e => e.href)")
    assert len(hrefs) == 2
    for href in hrefs:
        page.goto(href, wait_until="load")
        assert page.title().startswith("forensics")
    opened.assert_clean()
