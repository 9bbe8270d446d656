"""Progress on stderr covers every phase with its count (issue 16.7); the library reports through a
callback and never prints."""

from __future__ import annotations

import re

from forensics.detectors import load_all
from forensics.pipeline import analyze
from tests.conftest import ROOT, run_cli

SAMPLE = ROOT / "sample_traces" / "ddp_straggler"


def test_analyze_reports_each_phase_in_order_through_the_callback_and_prints_nothing(capsys):
    calls: list[tuple[str, str, int, int]] = []
    analysis = analyze(SAMPLE, workers=1, progress=lambda *a: calls.append(a))
    phases = [p for i, (p, *_) in enumerate(calls) if i == 0 or calls[i - 1][0] != p]
    assert phases == ["discover", "parse", "match", "detect"]
    files = sorted(p for p in SAMPLE.rglob("*") if p.is_file())
    assert ("discover", "", len(files), len(files)) in calls
    # discovery names each file before classifying it (what a crash at that moment was handling)
    found = [c for c in calls if c[0] == "discover" and c[1]]
    assert [c[1] for c in found] == sorted(p.relative_to(SAMPLE).as_posix() for p in files)
    assert [c[2] for c in found] == list(range(len(files)))
    parsed = [c for c in calls if c[0] == "parse"]
    assert [c[2] for c in parsed] == list(range(len(files) + 1)) and {c[3] for c in parsed} == {len(files)}
    assert ("match", "", analysis.context.match.instances.height, analysis.context.match.instances.height) in calls
    assert [c[1] for c in calls if c[0] == "detect" and c[1]] == list(load_all())
    assert capsys.readouterr() == ("", "")


def test_cli_prints_one_line_per_phase_with_its_count(tmp_path):
    res = run_cli("analyze", str(SAMPLE), "--out", str(tmp_path / "o"), "--fail-on", "never")
    assert res.returncode == 0, res.stderr
    lines = dict(re.findall(r"^(\w+): (\d+) ", res.stderr, flags=re.M))
    n_files = sum(1 for p in SAMPLE.rglob("*") if p.is_file())
    assert lines == {"discover": str(n_files), "parse": str(n_files), "match": lines.get("match"),
                     "detect": str(len(load_all())), "render": "3",
                     "write": str(sum(1 for p in (tmp_path / "o").iterdir() if p.is_file()))}, res.stderr
    assert int(lines["match"]) > 0  # the straggler sample has NCCL all-reduces on every rank
    quiet = run_cli("analyze", str(SAMPLE), "--out", str(tmp_path / "q"), "--fail-on", "never", "-q")
    assert quiet.stderr == ""
