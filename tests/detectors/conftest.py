"""Fixtures of the detector tests."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from forensics.base.findings import Finding, Skipped
from forensics.base.frames import JobFrames
from forensics.detectors import run_detectors
from forensics.facts.context import JobContext

RunDetector = Callable[..., tuple[list[Finding], list[Skipped]]]


@pytest.fixture
def run_detector(request: pytest.FixtureRequest) -> RunDetector:
    """The detector a test module is named for (``tests/detectors/test_<name>.py``) run alone over frames, with
    settings overridden by keyword: ``run_detector(frames, min_z=4)`` -> (findings, skipped)."""
    name = request.module.__name__.rpartition(".")[2].removeprefix("test_")

    def run(frames: JobFrames, **settings: Any) -> tuple[list[Finding], list[Skipped]]:
        overrides = {name: {k: str(v) for k, v in settings.items()}} if settings else None
        return run_detectors(JobContext(frames), overrides=overrides, only=[name])

    return run
