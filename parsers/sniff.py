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
    if text[:1] not in (b"{", b"["):
        return 0
    if any(key in head for key in _TRACE_KEYS):
        return 100
    if _JSON_EVENT.search(head):
        return 80
    return 0


def score_nsys(head: bytes) -> int:
    """Any SQLite database: the nsys parser tells an Nsight Systems export from other SQLite files."""
    return 100 if head.startswith(SQLITE_MAGIC) else 0


# `host:pid:tid [dev] NCCL INFO|WARN ...` anywhere in a line (launchers prefix their own tags). Found by
# its literal part, then the envelope before it is checked in a bounded window: a pattern starting
# with `\S+` would be tried at every byte of a long line (quadratic: 8.6 s on 100 KB of compact JSON).
_NCCL_TAG = re.compile(rb"\] NCCL (?:INFO|WARN|TRACE|ERROR)")
_ENVELOPE = re.compile(rb"\S:\d{1,10}:\d{1,10} \[[^\]\n]{0,64}\]$")
_ENVELOPE_WINDOW = 96
_MAX_CANDIDATES = 1000
# nccl-tests output is known by its parameters or its table's header; a table pasted alone (no parameter line, no
# `out-of-place` banner, as in NVIDIA/nccl-tests#256) still has the column names
_NCCL_OTHER = re.compile(rb"ProcessGroupNCCL|NCCL (?:INFO|WARN) |NCCL version \d|ncclCommInitRank|# "
                         rb"nccl-tests|#\s+out-of-place|#\s+size\s+count\s+type\s+(?:redop\s+)?(?:root\s+)?time\s+algbw")


def count_nccl_envelopes(text: bytes, cap: int = 40) -> int:
    """Lines with an NCCL envelope, counted up to ``cap``; time linear in ``len(text)``."""
    hits = tried = 0
    for m in _NCCL_TAG.finditer(text):
        end = m.start() + 1
        if _ENVELOPE.search(text, max(0, end - _ENVELOPE_WINDOW), end):
            hits += 1
            if hits >= cap:
                break
        tried += 1
        if tried >= _MAX_CANDIDATES:
            break
    return hits


def score_nccl_log(text: bytes) -> int:
    """NCCL envelope lines score highest; PyTorch ProcessGroupNCCL, RAS and nccl-tests output (no
    envelope) score by how many such lines there are, so a watchdog log with a few kernel-looking words
    still reads as NCCL."""
    hits = count_nccl_envelopes(text)
    if hits:
        return 50 + min(hits, 40)
    other = len(_NCCL_OTHER.findall(text))
    return 40 + min(other, 45) if other else 0


# Kernel-message markers anywhere in a line, and line prefixes (timestamp styles). Two patterns, so
# the first can skip ahead by its first characters: one alternation with `^` and `\b` in it is tried
# at every byte (0.5 s a MB).
_KERNEL_WORD = re.compile(
    rb"NVRM: |kernel: ?\[|kernel: |pcieport |mlx5_core|mlx5_ib|nvidia-nvswitch|SXid \(|Linux version \d|AER: |EDAC "
    rb"|mce: |"
    rb"Out of memory|invoked oom-killer|blocked for more than \d+ seconds|soft lockup|hard LOCKUP|"
    rb"\[Hardware Error\]|segfault at [0-9a-f]+ ip|temperature above threshold|detected NVSwitch (?:non-)?fatal error"
)
_KERNEL_PREFIX = re.compile(
    rb"^(?:\[\s*\d+\.\d+\] |\[\s*\+\d+\.\d+\] |<\d>\[|\d+,\d+,\d+,[-c];|Message from syslogd@|"
    rb"\[\w{3} \d{2} \d{4} [\d:]{8}\] \[[A-Z]+\] \[tid \d+\])",
    re.MULTILINE,
)
_WORD_BYTE = re.compile(rb"\w")


def _kernel_hits(text: bytes) -> int:
    """Kernel-message markers: each marker and each line prefix once (as one regex would find them)."""
    words = 0
    for m in _KERNEL_WORD.finditer(text):
        # `kernel:` only as a word of its own (was `\bkernel`)
        if m.group().startswith(b"kernel") and m.start() and _WORD_BYTE.match(text, m.start() - 1):
            continue
        words += 1
    return words + len(_KERNEL_PREFIX.findall(text))


def score_dmesg(text: bytes) -> int:
    """Kernel logs in any timestamp style; also the fabric-manager log. Scores by the number of lines
    that look like kernel messages, so a stray `kernel:` word in another log does not win."""
    hits = _kernel_hits(text)
    return 30 + min(hits, 60) if hits >= 1 else 0


_SMI_HEADER = re.compile(rb"^(?:Attached GPUs\s*:|GPU [0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:)", re.MULTILINE)
# Sections of `nvidia-smi -q` that people paste on their own (no header): ECC, remap, throttle reasons.
_SMI_SECTION = re.compile(
    rb"^ *(?:ECC Errors|Remapped Rows|Retired Pages|Clocks (?:Event|Throttle) Reasons|GPU Reset Status|"
    rb"Bank Remap Availability Histogram)\s*$|"
    rb"^ *(?:SRAM|DRAM) (?:Correctable|Uncorrectable)[\w -]{0,80}\s: |^ *HW (?:Power Brake |Thermal )?Slowdown\s+: ",
    re.MULTILINE,
)
# Matched on the lower-cased text (what IGNORECASE did, at a third of its cost); words and line
# starts apart, as for the kernel log.
_DCGM_WORD = re.compile(rb"dcgmi|diagnostic\s*\|\s*result|overall health\s*\||health monitor report")
_DCGM_LINE = re.compile(
    rb"^\|(?:-+\s*(?:deployment|integration|hardware|stress|metadata)\s*-+\+|"
    rb"[^|\n]*\|\s*(?:pass|fail|warning|skip)(?: - gpus?: [\d, ]+)?\s*\|)",
    re.MULTILINE,
)


def score_nvidia_smi(text: bytes) -> int:
    """nvidia-smi -q (whole or pasted sections) and dcgmi diag/health tables. Beats the kernel-log
    sniffer only on nvidia-smi structure, which kernel logs never have."""
    if b"=NVSMI LOG=" in text or _SMI_HEADER.search(text):
        return 120
    sections = len(_SMI_SECTION.findall(text))
    if sections >= 2:
        return 100 + min(sections, 20)
    lower = text.lower()
    return 110 if _DCGM_WORD.search(lower) or _DCGM_LINE.search(lower) else 0


# PyTorch Flight Recorder dumps: a pickle (torch's protocol 2; 4/5 when re-pickled by Python) whose first key is
# `version`, or JSON with the dump's keys. Told by content only; the parser checks every field.
_FR_KEYS = (b"pg_status", b"entries", b"pg_config", b"nccl_version", b"comm_lib_version")
_FR_JSON = re.compile(rb'"(?:pg_status|pg_config|nccl_version|comm_lib_version)"\s*:')
_FR_ENTRY_JSON = re.compile(rb'"(?:collective_seq_id|profiling_name|record_id)"\s*:')


def score_flight_recorder_pickle(head: bytes) -> int:
    """A Flight Recorder pickle: PROTO 2-5, a dict whose `version` key comes first, and one of the dump's keys."""
    if not (head[:1] == b"\x80" and head[1:2] in (b"\x02", b"\x03", b"\x04", b"\x05")):
        return 0
    if b"version" not in head[:64] or not any(k in head for k in _FR_KEYS):
        return 0
    return 150


def score_flight_recorder_json(head: bytes) -> int:
    """A Flight Recorder JSON dump: an object with `version` and the dump's keys (`pg_status`, `pg_config`, the
    library version), or `entries` holding Flight Recorder entries."""
    text = head.lstrip(b"\xef\xbb\xbf \t\r\n")
    if text[:1] != b"{" or b'"version"' not in head:
        return 0
    if _FR_JSON.search(head) or (b'"entries"' in head and _FR_ENTRY_JSON.search(head)):
        return 150
    return 0
