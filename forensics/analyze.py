"""The pipeline: RUN_DIR -> sources and frames -> detectors -> an :class:`Analysis`.

Library code: no printing. Progress goes through the optional ``progress`` callback.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from forensics import frames as fr
from forensics.detectors import run_detectors
from forensics.errors import UsageError
from forensics.findings import Finding, Skipped, sort_findings
from forensics.frames import JobFrames
from forensics.parsers.discovery import ParsedSource, discover_and_parse, sources_frame

ProgressFn = Callable[[str, int, int], None]


@dataclass
class Analysis:
    run_dir: Path
    sources: pl.DataFrame
    frames: JobFrames
    findings: list[Finding] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)

    @property
    def readable(self) -> bool:
        """At least one source yielded data."""
        return self.sources.filter(pl.col("status").is_in(["ok", "partial"])).height > 0

    @property
    def ranks(self) -> list[int]:
        found: set[int] = set()
        for name in ("ranks", "sources"):
            found.update(r for r in self.frames[name]["rank"].drop_nulls().to_list())
        return sorted(found)

    @property
    def hosts(self) -> list[str]:
        found: set[str] = set()
        for name in ("ranks", "sources"):
            found.update(h for h in self.frames[name]["host"].drop_nulls().to_list())
        return sorted(found)

    @property
    def world_size(self) -> int | None:
        sizes = self.frames["ranks"]["world_size"].drop_nulls()
        return int(sizes.max()) if sizes.len() else None  # type: ignore[arg-type]


def collect_frames(parsed: list[ParsedSource]) -> tuple[pl.DataFrame, JobFrames]:
    """Merge every usable source's frames into one JobFrames."""
    parts: dict[str, list[pl.DataFrame]] = defaultdict(list)
    for item in parsed:
        if item.result.status in ("ok", "partial"):
            for name, df in item.result.frames.items():
                parts[name].append(df)
    sources = sources_frame(parsed)
    merged = {name: fr.concat(name, dfs) for name, dfs in parts.items()}
    merged["sources"] = sources
    return sources, JobFrames(merged, present=set(parts) | {"sources"})


def load(run_dir: Path, progress: ProgressFn | None = None, workers: int | None = None) -> tuple[pl.DataFrame, JobFrames]:
    if not (run_dir.is_dir() or run_dir.is_file()):
        raise UsageError(f"{run_dir}: no such directory or file")
    return collect_frames(discover_and_parse(run_dir, progress=progress, workers=workers))


def analyze(
    run_dir: Path,
    overrides: Mapping[str, Mapping[str, str]] | None = None,
    only: list[str] | None = None,
    progress: ProgressFn | None = None,
    workers: int | None = None,
) -> Analysis:
    sources, frames = load(run_dir, progress=progress, workers=workers)
    findings, skipped = run_detectors(frames, overrides=overrides, only=only)
    return Analysis(run_dir, sources, frames, sort_findings(findings), skipped)
