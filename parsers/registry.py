"""Source kinds: how each is recognised and which parser turns it into frames.

Parsers are referenced by import path and imported lazily, so a kind whose parser is not
installed yet (or fails to import) is reported, not crashed on.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

from forensics.parsers import sniff
from forensics.parsers.result import Parser


def _lazy_score(target: str) -> Callable[[bytes], int]:
    """A sniffer imported on its first call ("module:function"): the last-words and framework-log scanners pull in
    their parsers (and the NCCL log's), which a job of traces alone never sniffs with."""
    module_name, _, name = target.partition(":")

    def score(data: bytes) -> int:
        fn: Callable[[bytes], int] = getattr(importlib.import_module(module_name), name)
        return fn(data)

    return score


@dataclass(frozen=True)
class SourceKind:
    kind: str
    # Scores bytes: the decompressed head for binary/JSON kinds, head + tail for text kinds.
    score: Callable[[bytes], int]
    parser: str  # "module:function"
    text: bool


KINDS: tuple[SourceKind, ...] = (
    SourceKind("nsys", sniff.score_nsys, "forensics.parsers.nsys:parse", text=False),
    SourceKind("kineto", sniff.score_kineto, "forensics.parsers.kineto:parse", text=False),
    SourceKind("nvidia_smi", sniff.score_nvidia_smi, "forensics.parsers.nvidia_smi:parse", text=True),
    SourceKind("nccl_log", sniff.score_nccl_log, "forensics.parsers.nccl_log:parse", text=True),
    SourceKind("dmesg", sniff.score_dmesg, "forensics.parsers.kernel_log:parse", text=True),
    SourceKind("flight_recorder", sniff.score_flight_recorder_json, "forensics.parsers.flight_recorder:parse",
               text=False),
    # scores below every other text kind but framework_log: a file another sniffer claims is read for last words
    # beside its own parser (ALSO_READ)
    SourceKind("job_log", _lazy_score("forensics.parsers.lastwords:score_job_log"), "forensics.parsers.lastwords:parse",
               text=True),
    # below that: a rank's output with checkpoint saves and nothing else forensics reads
    SourceKind("framework_log", _lazy_score("forensics.parsers.frameworks:score_framework_log"),
               "forensics.parsers.frameworks:parse", text=True),
)

#: Kinds whose files are also read by other scanners after their own parser ("module:function", called in order
#: as ``scan(path, ctx, rank, host) -> (frames, note, damaged)``): a rank's stdout is an NCCL log and holds the
#: job's last words and its framework's checkpoint saves too. The file keeps one row in ``run.sources`` (its kind,
#: its parser's status); a scan's frames join the file's, its note is added to the row's message, and damage it
#: found makes an ok row partial.
ALSO_READ: dict[str, tuple[str, ...]] = {
    "nccl_log": ("forensics.parsers.lastwords:scan", "forensics.parsers.frameworks:scan"),
    "job_log": ("forensics.parsers.frameworks:scan",),
}

BY_KIND = {k.kind: k for k in KINDS}


def load_parser(kind: str) -> Parser | None:
    """The parse function for ``kind``, or None when no parser for it exists yet."""
    module_name, _, func = BY_KIND[kind].parser.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name == module_name:
            return None
        raise
    return getattr(module, func, None)
