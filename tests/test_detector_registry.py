"""Meta-tests every registered detector must pass."""

from __future__ import annotations

import dataclasses

import pytest

from forensics.base.frames import JobFrames
from forensics.detectors import DOC_SECTIONS, load_all, run_detectors
from forensics.facts.context import JobContext
from tests.conftest import ROOT

REGISTRY = load_all()


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_documentation_has_every_section(name):
    doc = REGISTRY[name].doc
    assert [title for title, _ in doc.sections()] == list(DOC_SECTIONS)
    for title, text in [("summary", doc.summary), *doc.sections()]:
        assert len(text.split()) >= 5, f"{name}: '{title}' says too little"


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_config_is_a_frozen_dataclass_with_defaults(name):
    cfg = REGISTRY[name].config
    assert dataclasses.is_dataclass(cfg) and cfg.__dataclass_params__.frozen
    cfg()  # every threshold has a default


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_each_detector_has_trigger_clean_and_skip_tests(name):
    path = ROOT / "tests" / "detectors" / f"test_{name}.py"
    assert path.exists(), f"{name}: missing {path.relative_to(ROOT)}"
    text = path.read_text()
    for prefix in ("def test_triggers", "def test_clean", "def test_skipped"):
        assert prefix in text, f"{name}: {path.name} has no '{prefix}*' test"


def test_every_detector_skips_with_a_reason_on_an_empty_job():
    findings, skipped = run_detectors(JobContext(JobFrames({})))
    assert findings == []
    assert sorted(s.detector for s in skipped) == sorted(REGISTRY)
    assert all(s.reason for s in skipped)
