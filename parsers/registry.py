"""Source kinds: how each is recognised and which parser turns it into frames.

Parsers are referenced by import path and imported lazily, so a kind whose parser is not
installed yet (or fails to import) is reported, not crashed on.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

from forensics.parsers import sniff
from forensics.parsers.common import Parser


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
    SourceKind("flight_recorder", sniff.score_flight_recorder_json, "forensics.parsers.flight_recorder:parse", text=False),
)

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
