"""Shared helpers for the kernel-log / GPU-health tests: parse one sample file, run gpu_hw_error or node_health on
it."""

from __future__ import annotations

import calendar

import orjson
import polars as pl
from forensics.parsers.result import ParseResult

from forensics.base.findings import Finding
from forensics.base.frames import JobFrames
from forensics.detectors import run_detectors
from forensics.facts.context import JobContext
from tests.conftest import shared_path

T0 = calendar.timegm((2025, 3, 1, 10, 0, 0, 0, 0, 0)) * 10**9  # 2025-03-01T10:00:00Z


def iso(sec: float) -> str:
    """``sec`` seconds after T0 as a journalctl short-iso-precise timestamp."""
    whole = int(sec)
    h, m, s = 10 + whole // 3600, whole // 60 % 60, whole % 60
    return f"2025-03-01T{h:02d}:{m:02d}:{s:02d}.{int(round((sec - whole) * 1e6)):06d}+00:00"


def journal(lines: list[tuple[str, float, str]]) -> str:
    """(host, seconds after T0, kernel message) -> journalctl -o short-iso-precise text."""
    return "".join(f"{iso(t)} {h} kernel: {m}\n" for h, t, m in lines)


def kernel_frame(text: str, source: str) -> pl.DataFrame:
    """The kernel_events frame of a kernel-log text."""
    from forensics.parsers.kernel_log import parse_text

    return parse_text(text, source).frames["kernel_events"]


def parse_sample(name: str) -> ParseResult:
    """Parse ``dmesg/<name>`` with the parser its content selects (kernel log or nvidia-smi/dcgmi)."""
    from forensics.parsers.discovery import classify, parse_one

    path = shared_path("dmesg", name)
    item = parse_one(classify(path, name), path.parent)
    assert item.result.status in ("ok", "partial"), item.result.message
    return item.result


def events(name: str) -> pl.DataFrame:
    return parse_sample(name).frames["kernel_events"]


def fields(df: pl.DataFrame) -> list[dict]:
    return [orjson.loads(f) for f in df["fields"].to_list()]


def kind_counts(df: pl.DataFrame) -> dict[str, int]:
    return {str(k): int(v) for k, v in df.group_by("kind").len().iter_rows()}


def detect(frames: dict[str, pl.DataFrame], detector: str = "gpu_hw_error", **settings: str) -> list[Finding]:
    job = JobFrames(frames)
    overrides = {detector: {k: str(v) for k, v in settings.items()}} if settings else None
    found, skipped = run_detectors(JobContext(job), overrides=overrides, only=[detector])
    assert not skipped, skipped
    return found


def sample_findings(name: str, detector: str = "gpu_hw_error", **settings: str) -> list[Finding]:
    return detect(parse_sample(name).frames, detector, **settings)


def host_findings(name: str, **settings: str) -> list[Finding]:
    """node_health's findings on one sample (host-side faults)."""
    return sample_findings(name, "node_health", **settings)
