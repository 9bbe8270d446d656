"""What a parser is: a function from a file and its context (where it sits in RUN_DIR) to its result (frames, a
status and a one-line message)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl
from forensics.parsers.bounded_read import DEFAULT_MAX_DECOMPRESSED


@dataclass
class ParseResult:
    """What a parser made of one file. ``status`` is ok / partial / failed; ``message`` is one line."""

    frames: dict[str, pl.DataFrame] = field(default_factory=dict)
    status: str = "ok"
    message: str | None = None
    rank: int | None = None
    host: str | None = None
    # True when the file named no rank and the parser numbered its process(es) from 0: usable only
    # when it is the job's only trace (discovery decides, knowing the other files).
    rank_guessed: bool = False

    @classmethod
    def failed(cls, message: str) -> ParseResult:
        return cls(status="failed", message=message)


@dataclass(frozen=True)
class ParseContext:
    """Where a file sits: ``rel_path`` (relative to RUN_DIR, used as the frames' ``source``)."""

    run_dir: Path
    rel_path: str
    max_decompressed_bytes: int = DEFAULT_MAX_DECOMPRESSED


Parser = Callable[[Path, ParseContext], ParseResult]
