"""``nvidia-smi -q`` -> ``gpu_health``; ``dcgmi diag`` / ``dcgmi health`` tables -> ``gpu_diag``.

``nvidia-smi -q`` is a tree keyed by indentation: one block per ``GPU 00000000:BB:DD.F`` header.
Excerpts without a GPU header (a pasted ``ECC Errors`` or ``Clocks Throttle Reasons`` section) become
one GPU row with unknown bus id. Every layout of the research notes is read: ECC SRAM/DRAM
(R510-R535), R550 SRAM Parity/SEC-DED split and ``SRAM Threshold Exceeded``, Volta single/double bit,
Retired Pages, Remapped Rows with the bank histogram, GPU Reset Status, and ``Clocks Event Reasons``
(``Clocks Throttle Reasons`` before ~R535).

dcgmi tables wrap the right-hand cell mid-word at a fixed width: wrapped pieces are concatenated
as printed; a piece that starts with Pass/Fail/Warning/Skip is a new result of the same test.
"""

from __future__ import annotations

import re
import zlib
from pathlib import Path
from typing import Any

import polars as pl
from forensics.parsers.bounded_read import open_bounded
from forensics.parsers.result import ParseContext, ParseResult
from forensics.parsers.timestamps import ctime_ns

from forensics.base import frames as fr
from forensics.base.bus_ids import normalize_bus_id

_GPU_HDR = re.compile(r"^GPU (?P<bdf>[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7])\s*$")
_KV = re.compile(r"^(?P<indent> *)(?P<key>[^:]+?)\s*:\s?(?P<value>.*?)\s*$")
_SECTION = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z][^:|]*?)\s*$")
_INT = re.compile(r"^-?\d+")


def parse(path: Path, ctx: ParseContext) -> ParseResult:
    try:
        with open_bounded(path, ctx.max_decompressed_bytes) as fh:
            text = fh.read().decode("utf-8", errors="replace")
    except (OSError, EOFError, zlib.error) as exc:
        return ParseResult.failed(f"{ctx.rel_path}: unreadable: {exc}")
    except Exception as exc:
        return ParseResult.failed(f"{ctx.rel_path}: {exc}")
    return parse_text(text, ctx.rel_path)


def parse_text(text: str, source: str) -> ParseResult:
    lines = text.splitlines()
    frames: dict[str, pl.DataFrame] = {}
    notes: list[str] = []
    table_lines = sum(1 for ln in lines if ln.lstrip().startswith("|"))
    if table_lines:
        diag = _parse_dcgmi(lines, source)
        frames["gpu_diag"] = diag
        notes.append(f"{diag.height} dcgmi result rows")
    gpus, unknown = _parse_smi_q(lines)
    if gpus:
        df = pl.DataFrame(gpus, schema_overrides={"clock_reasons_active": pl.List(pl.String)}, strict=False)
        frames["gpu_health"] = fr.conform("gpu_health", df.with_columns(pl.lit(source).alias("source")))
        notes.append(f"{len(gpus)} GPU(s) from nvidia-smi -q")
    if not frames:
        return ParseResult.failed(f"{source}: neither nvidia-smi -q sections nor a dcgmi table found")
    msg = "; ".join(notes)
    if unknown:
        msg += f"; {unknown} line(s) not understood"
    return ParseResult(frames=frames, status="ok", message=msg)


# --- nvidia-smi -q ------------------------------------------------------------------------------


def _parse_smi_q(lines: list[str]) -> tuple[list[dict[str, Any]], int]:
    header: dict[str, str] = {}
    blocks: list[tuple[str | None, dict[tuple[str, ...], str]]] = []
    cur: dict[tuple[str, ...], str] | None = None
    stack: list[tuple[int, str]] = []
    unknown = 0
    for ln in lines:
        if not ln.strip() or ln.strip().startswith(("=", "[...]", "|", "+")):
            continue
        m = _GPU_HDR.match(ln)
        if m:
            cur = {}
            blocks.append((m.group("bdf"), cur))
            stack = []
            continue
        kv = _KV.match(ln)
        sec = None if kv and kv.group("value") != "" else _SECTION.match(ln)
        if kv is None and sec is None:
            unknown += 1
            continue
        indent = len((kv or sec).group("indent"))  # type: ignore[union-attr]
        key = (kv or sec).group("key").strip()  # type: ignore[union-attr]
        while stack and stack[-1][0] >= indent:
            stack.pop()
        if cur is None and indent == 0 and kv is not None and key.lower() in ("timestamp", "driver version",
                                                                              "cuda version", "attached gpus"):
            header[key.lower()] = kv.group("value")
            continue
        if cur is None:
            # a pasted section without a GPU header: one anonymous GPU
            cur = {}
            blocks.append((None, cur))
        path = tuple(k for _, k in stack) + (key,)
        if kv is not None and kv.group("value") != "":
            cur[path] = kv.group("value")
        else:
            stack.append((indent, key))
    snapshot = ctime_ns(header["timestamp"]) if "timestamp" in header else None
    rows = [
        _gpu_row(i if bdf is not None else None, bdf, kv, snapshot, header.get("driver version"))
        for i, (bdf, kv) in enumerate(blocks)
        if kv
    ]
    return rows, unknown


def _num(v: str | None) -> int | None:
    if v is None:
        return None
    m = _INT.match(v.strip())
    return int(m.group(0)) if m else None


def _flag(v: str | None) -> bool | None:
    if v is None:
        return None
    t = v.strip().lower()
    return True if t in ("yes", "active", "true") else False if t in ("no", "not active", "false") else None


def _find(kv: dict[tuple[str, ...], str], *suffix: str) -> str | None:
    """Value of the first key whose path ends with ``suffix`` (section nesting varies by excerpt)."""
    n = len(suffix)
    for path, v in kv.items():
        if tuple(p.lower() for p in path[-n:]) == suffix:
            return v
    return None


def _sum(*vals: int | None) -> int | None:
    present = [v for v in vals if v is not None]
    return sum(present) if present else None


def _gpu_row(index: int | None, bdf: str | None, kv: dict[tuple[str, ...], str], snapshot: int | None,
             driver: str | None) -> dict[str, Any]:
    row: dict[str, Any] = {"gpu_index": index,
                           "pci_bus_id": normalize_bus_id(bdf) or normalize_bus_id(_find(kv, "pci", "bus id")),
                           "snapshot_ns": snapshot, "driver_version": driver,
                           "uuid": _find(kv, "gpu uuid"), "serial": _find(kv, "serial number"),
                           "product": _find(kv, "product name")}
    for scope in ("volatile", "aggregate"):
        sram_ue = _num(_find(kv, "ecc errors", scope, "sram uncorrectable"))
        parity = _num(_find(kv, "ecc errors", scope, "sram uncorrectable parity"))
        secded = _num(_find(kv, "ecc errors", scope, "sram uncorrectable sec-ded"))
        row[f"ecc_{scope}_sram_ce"] = _num(_find(kv, "ecc errors", scope, "sram correctable"))
        row[f"ecc_{scope}_sram_ue"] = sram_ue if sram_ue is not None else _sum(parity, secded)
        row[f"ecc_{scope}_dram_ce"] = _num(_find(kv, "ecc errors", scope, "dram correctable"))
        dram_ue = _num(_find(kv, "ecc errors", scope, "dram uncorrectable"))
        if dram_ue is None:  # Volta layout: Double Bit > Total
            dram_ue = _num(_find(kv, "ecc errors", scope, "double bit", "total"))
        row[f"ecc_{scope}_dram_ue"] = dram_ue
    row["sram_threshold_exceeded"] = _flag(_find(kv, "sram threshold exceeded"))
    row["retired_pages_sbe"] = _num(_find(kv, "retired pages", "single bit ecc") or _find(kv, "single bit ecc",
                                                                                          "retired count"))
    row["retired_pages_dbe"] = _num(_find(kv, "retired pages", "double bit ecc") or _find(kv, "double bit ecc",
                                                                                          "retired count"))
    row["retired_pages_pending"] = _flag(_find(kv, "retired pages", "pending page blacklist")
                                         or _find(kv, "retired pages", "pending page retirement"))
    row["remapped_rows_ce"] = _num(_find(kv, "remapped rows", "correctable error"))
    row["remapped_rows_ue"] = _num(_find(kv, "remapped rows", "uncorrectable error"))
    row["remap_pending"] = _flag(_find(kv, "remapped rows", "pending"))
    row["remap_failure"] = _flag(_find(kv, "remapped rows", "remapping failure occurred"))
    row["remap_banks_none"] = _num(_find(kv, "bank remap availability histogram", "none"))
    row["reset_required"] = _flag(_find(kv, "gpu reset status", "reset required"))
    row["drain_and_reset"] = _flag(_find(kv, "gpu reset status", "drain and reset recommended"))
    reasons: list[str] = []
    section = None
    for path, v in kv.items():
        for _i, part in enumerate(path[:-1]):
            if part.lower() in ("clocks event reasons", "clocks throttle reasons"):
                section = part
                if v.strip().lower() == "active":
                    reasons.append(path[-1])
                break
    row["clock_reasons_active"] = reasons if section else None
    row["sm_clock_mhz"] = _num(_find(kv, "clocks", "sm"))
    row["temperature_c"] = _num(_find(kv, "temperature", "gpu current temp"))
    return row


# --- dcgmi ----------------------------------------------------------------------------------------

_RESULT = re.compile(r"^(?P<res>Pass|Fail|Warn(?:ing)?|Skip|Error|Healthy|Failure)\b(?:\s*-\s*(?P<rest>.*))?", re.I)
_GPUS = re.compile(r"GPUs?:\s*(?P<list>[\d,\s]+)")
_GPU_IN_MSG = re.compile(r"\bGPU (?P<n>\d+)\b")
_SECTION_ROW = re.compile(r"^\|-+\s*(?P<name>[A-Za-z][\w /]*?)\s*-+\+")


def _parse_dcgmi(lines: list[str], source: str) -> pl.DataFrame:
    tool = "dcgmi_health" if any("Overall Health" in ln or "Health Monitor" in ln for ln in lines) else "dcgmi_diag"
    rows = [row for e in _dcgmi_entries(lines) for row in _dcgmi_rows(e, tool)]
    if not rows:
        return fr.empty("gpu_diag")
    return fr.conform("gpu_diag", pl.DataFrame(rows).with_columns(pl.lit(source).alias("source")))


def _dcgmi_entries(lines: list[str]) -> list[dict[str, Any]]:
    """One entry per table cell pair: test, section, line, right (continuation lines joined), gpu_ctx."""
    entries: list[dict[str, Any]] = []
    section: str | None = None
    gpu_ctx: int | None = None
    for lineno, ln in enumerate(lines, start=1):
        s = ln.rstrip()
        if not s.strip():
            section = None  # a blank line ends a table; the next excerpt may have no section header
            continue
        if not s.startswith("|"):
            continue
        m = _SECTION_ROW.match(s)
        if m:
            section = m.group("name").strip()
            continue
        cells = s.strip("|").split("|")
        if len(cells) >= 2:
            gpu_ctx = _dcgmi_cell(entries, cells[0].strip(), cells[1], section, lineno, gpu_ctx)
    return entries


def _dcgmi_cell(entries: list[dict[str, Any]], left: str, right: str, section: str | None, lineno: int,
                gpu_ctx: int | None) -> int | None:
    """Add one `| left | right |` row to ``entries``; returns the GPU the following rows belong to."""
    right = right[1:] if right.startswith(" ") else right
    right = right.rstrip()
    if left in ("Diagnostic", "") and right.strip() == "Result":
        return gpu_ctx
    if left:
        name = left
        if left.startswith("->"):
            name = left[2:].strip()
            if name.isdigit():
                gpu_ctx = int(name)
                name = "GPU"
        entries.append({"test": name, "section": section, "line": lineno, "right": right, "gpu_ctx": gpu_ctx})
    elif entries:
        if _RESULT.match(right.strip()):
            prev = entries[-1]
            entries.append({**prev, "line": lineno, "right": right.strip()})
        else:
            entries[-1]["right"] += right
    return gpu_ctx


def _dcgmi_rows(e: dict[str, Any], tool: str) -> list[dict[str, Any]]:
    """gpu_diag rows of one entry: one per GPU a result names, else one message row."""
    text = e["right"].strip()
    m = _RESULT.match(text)
    test = e["test"]
    if m:
        res = m.group("res").lower()
        res = {"warn": "warning", "healthy": "pass", "failure": "fail"}.get(res, res)
        rest = m.group("rest") or ""
        g = _GPUS.search(rest)
        gpus = [int(x) for x in re.findall(r"\d+", g.group("list"))] if g else [None]
        return [{"line": e["line"], "tool": tool, "section": e["section"], "test": test,
                 "result": res, "gpu_index": gpu if gpu is not None else e["gpu_ctx"],
                 "message": text} for gpu in gpus]
    res = {"error": "error", "warning": "warning"}.get(test.lower(), "info")
    gm = _GPU_IN_MSG.search(text)
    return [{"line": e["line"], "tool": tool, "section": e["section"], "test": test, "result": res,
             "gpu_index": int(gm.group("n")) if gm else e["gpu_ctx"], "message": text}]
