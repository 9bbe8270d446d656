"""Content sniffers: what a file is, from its first (and, for text, last) bytes, never its name.

Each ``score_*`` returns a confidence score (0 = not this kind); the registry picks the highest.
"""

from __future__ import annotations

import re

SQLITE_MAGIC = b"SQLite format 3\x00"

_TRACE_KEYS = (b'"traceEvents"', b'"schemaVersion"', b'"deviceProperties"', b'"distributedInfo"')
_JSON_EVENT = re.compile(rb'"ph"\s*:\s*"[A-Za-z]"')


def is_binary(head: bytes) -> bool:
    return b"\x00" in head[:8192]


def score_kineto(head: bytes) -> int:
    """Kineto / Chrome trace JSON: an object with traceEvents, or a bare array of trace events."""
    text = head.lstrip(b"\xef\xbb\xbf \t\r\n")
    if not text[:1] in (b"{", b"["):
        return 0
    if any(key in head for key in _TRACE_KEYS):
        return 100
    if _JSON_EVENT.search(head):
        return 80
    return 0


def score_nsys(head: bytes) -> int:
    """Any SQLite database: the nsys parser tells an Nsight Systems export from other SQLite files."""
    return 100 if head.startswith(SQLITE_MAGIC) else 0


# `host:pid:tid [dev] NCCL INFO|WARN ...` anywhere in a line (launchers prefix their own tags).
_NCCL_LINE = re.compile(rb"\S+:\d+:\d+ \[[^\]]*\] NCCL (?:INFO|WARN|TRACE|ERROR)")
_NCCL_OTHER = re.compile(rb"ProcessGroupNCCL|NCCL (?:INFO|WARN) |NCCL version \d|ncclCommInitRank|# nccl-tests|#\s+out-of-place")


def score_nccl_log(text: bytes) -> int:
    """NCCL envelope lines score highest; PyTorch ProcessGroupNCCL, RAS and nccl-tests output (no
    envelope) score by how many such lines there are, so a watchdog log with a few kernel-looking words
    still reads as NCCL."""
    hits = len(_NCCL_LINE.findall(text))
    if hits:
        return 50 + min(hits, 40)
    other = len(_NCCL_OTHER.findall(text))
    return 40 + min(other, 45) if other else 0


_KERNEL_LINE = re.compile(
    rb"NVRM: (?:Xid|GPU at|Xid)|NVRM: |\bkernel: |pcieport |mlx5_core|mlx5_ib|"
    rb"^\[\s*\d+\.\d+\] |^<\d>\[|Linux version \d|AER: |EDAC |mce: |Out of memory|nvidia-nvswitch|"
    rb"SXid|fabricmanager|nv-fabricmanager|hung_task|soft lockup|Hardware Error",
    re.MULTILINE,
)


def score_dmesg(text: bytes) -> int:
    hits = len(_KERNEL_LINE.findall(text))
    return 30 + min(hits, 60) if hits >= 1 else 0


_SMI_HEADER = re.compile(rb"=+NVSMI LOG=+|^Attached GPUs\s*:|^GPU [0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:", re.MULTILINE)
_DCGM = re.compile(rb"dcgmi|Diagnostic\s*\|\s*Result|\+-{5,}.*\+\s*\n\|\s*Health", re.IGNORECASE)


def score_nvidia_smi(text: bytes) -> int:
    if _SMI_HEADER.search(text):
        return 120
    return 110 if _DCGM.search(text) else 0
