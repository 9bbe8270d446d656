"""NCCL logs parsed as a batch: each file's lines read and dispatched to the grammars, rows settled into frames for
all files at once, ranks filled from each process's own lines."""

from __future__ import annotations

import re
import zlib
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl
from forensics.parsers.bounded_read import DecompressionLimitExceeded, LongLines, open_bounded, read_lines
from forensics.parsers.nccl_log.envelope import (
    COLL_NAMES,
    ENVELOPE,
    ENVELOPE_NOHOST,
    LAUNCHER_TAGS,
    MPI_TAG,
    VERSION,
    info_line,
    warn_line,
)
from forensics.parsers.nccl_log.nccl_tests import CMD_ENV, NT_PERF, nccl_tests_line
from forensics.parsers.nccl_log.pytorch import PT_ANY, PT_DESYNC, pytorch_line
from forensics.parsers.nccl_log.ras import NCCL_MATRIX, RAS_VERSION, ras_line
from forensics.parsers.nccl_log.rows import Acc, note_version
from forensics.parsers.result import ParseContext, ParseResult
from forensics.parsers.timestamps import line_stamp_ns

from forensics.base import frames as fr


@dataclass
class _File:
    acc: Acc
    lines: int
    error: str | None


class NcclBatch:
    """Several NCCL logs parsed as one: each file's lines are read on their own (``add``), the frames
    of all of them are built and their ranks filled at once, per file (``source``) (``finish``), so
    many small logs (one a rank) pay Polars' fixed costs once."""

    def __init__(self) -> None:
        self.files: list[_File] = []

    def add(self, path: Path, ctx: ParseContext) -> ParseResult | None:
        """Read one log: a failed result when nothing of it could be read, else None (see ``finish``)."""
        acc, n, error = _read(path, ctx)
        if n == 0 and error:
            return ParseResult.failed(error)
        _settle_rows(acc)
        self.files.append(_File(acc, n, error))
        return None

    def __len__(self) -> int:
        return len(self.files)

    def finish(self) -> tuple[list[ParseResult], dict[str, pl.DataFrame]]:
        """The result of every file ``add`` took (in order) and the frames of them all."""
        frames = _frames(self.files)
        procs = process_ranks(frames)
        frames = _fill_ranks(frames, procs)
        one = procs.filter(pl.len().over("source") == 1)  # one process, one GPU: the file is that rank's
        hosts, ranks = _file_facts(self.files, one)
        return [_result(f, hosts.get(f.acc.source, set()), ranks.get(f.acc.source, set())) for f in self.files], frames


def parse(path: Path, ctx: ParseContext) -> ParseResult:
    """One NCCL log (a batch of one)."""
    batch = NcclBatch()
    early = batch.add(path, ctx)
    if early is not None:
        return early
    results, frames = batch.finish()
    results[0].frames = frames
    return results[0]


def _read(path: Path, ctx: ParseContext) -> tuple[Acc, int, str | None]:
    """Every line of one file into a row accumulator: (rows, lines read, why reading stopped early)."""
    acc = Acc(ctx.rel_path)
    error: str | None = None
    long = LongLines()
    try:
        with open_bounded(path, ctx.max_decompressed_bytes) as fh:
            for n, raw in read_lines(fh, long):
                line = raw.decode("utf-8", "replace").rstrip("\r\n")
                try:
                    _line(acc, line, n)
                except Exception as exc:  # noqa: BLE001 -- bad input never aborts the file; it is counted
                    acc.counts["nccl_unknown"] += 1
                    acc.unknown_sample = acc.unknown_sample or f"line {n}: {exc}"
    except (OSError, EOFError, zlib.error, DecompressionLimitExceeded) as exc:
        error = f"{ctx.rel_path}: read stopped after line {long.lines}: {exc}"
    error = "; ".join(e for e in (error, long.note(ctx.rel_path)) if e) or None
    return acc, long.lines, error


def _result(f: _File, hosts: set[str], ranks: set[int]) -> ParseResult:
    acc, c = f.acc, f.acc.counts
    msg = (
        f"NCCL {acc.version or 'version unknown'}: {f.lines} lines, {c['nccl']} NCCL "
        f"({c['nccl_unknown']} not understood), {c['nccl_tests']} nccl-tests, {c['pytorch']} PyTorch, "
        f"{c['ras']} RAS, {c['other']} other"
    )
    if acc.unknown_sample:
        msg += f"; first not understood: {acc.unknown_sample[:160]}"
    return ParseResult(
        status="partial" if f.error else "ok",
        message=(f.error + "; " + msg) if f.error else msg,
        rank=next(iter(ranks)) if len(ranks) == 1 else None,
        host=next(iter(hosts)) if len(hosts) == 1 else None,
    )


def _file_facts(files: list[_File], one: pl.DataFrame) -> tuple[dict[str, set[str]], dict[str, set[int]]]:
    """Per file (source): the hosts its NCCL lines name, and the ranks its init lines, its timeouts
    and (a file of one process) that process name; read from the rows (a few per file: no queries)."""
    hosts: dict[str, set[str]] = defaultdict(set)
    ranks: dict[str, set[int]] = defaultdict(set)
    for f in files:
        rows = f.acc.rows
        hosts[f.acc.source] = {r["host"] for name in ("nccl_comms", "nccl_net", "nccl_channels")
                               for r in rows.get(name, []) if r.get("host") is not None}
        ranks[f.acc.source] = {r["rank"] for r in rows.get("nccl_comms", [])
                               if r.get("origin") == "init" and r.get("rank") is not None}
        ranks[f.acc.source] |= {r["rank"] for r in rows.get("collective_timeouts", []) if r.get("rank") is not None}
    for source, rank in one.select("source", "rank").iter_rows():
        ranks[source].add(rank)
    return hosts, ranks


def _line(acc: Acc, line: str, n: int) -> None:
    acc.current = line
    if "NCCL " not in line:  # fast path: most lines of a training log
        _other(acc, line, n)
        return
    m = ENVELOPE.search(line)
    host = None
    if m:
        host = m["host"]
        # nccl-tests row text glued in front (`... -1host:pid`): the root column swallowed a '-1'
        if re.match(r"^-\d+[A-Za-z]", host) and re.search(r"\s-\d+" + re.escape(host[2:]) + ":", line):
            host = host[2:]
    else:
        m = ENVELOPE_NOHOST.search(line)
    if m:
        acc.counts["nccl"] += 1
        acc.ras = False
        base: dict[str, Any] = {
            "host": host,
            "pid": int(m["pid"]) if host else None,
            "cuda_dev": int(m["dev"]) if m["dev"] is not None else None,
            "line": n,
            "time_ns": line_stamp_ns(line),
        }
        msg = m["msg"].rstrip()
        tag = MPI_TAG.search(line, 0, m.start())
        if tag and host:
            acc.launcher[(host, base["pid"], base["cuda_dev"])] = int(tag["rank"])
        if m["func"]:
            note_version(acc, lo="2.30")  # `file:line (function) NCCL WARN`
        if m["level"] in ("WARN", "ERROR"):
            known = warn_line(acc, base, msg, m["src"])
        else:
            known = info_line(acc, base, msg, m["src"])
        if not known:
            acc.counts["nccl_unknown"] += 1
            acc.unknown_sample = acc.unknown_sample or f"line {n}: {line.strip()}"
        return
    _other(acc, line, n)


#: a socket error of NCCL's without its envelope: the text ncclGetLastError() returns, which PyTorch prints after
#: `Last error:` in its ncclRemoteError / ncclSystemError exception
LAST_ERROR = re.compile(r"^(?:socketProgressOpt: |Net : )Call to (?:recv from|send to) \S+ failed : "
                        r"|^(?:socketProgress: |Net : )Connection closed by remote peer \S+")


def _bare_nccl(acc: Acc, text: str, n: int) -> bool:
    """NCCL text without its envelope: the body of `Enabled NCCL Func/Proto/Algo Matrix:` (2.24+), and NCCL's last
    error as PyTorch prints it after `Last error:` (the failing socket and its peer)."""
    if NCCL_MATRIX.match(text):
        acc.counts["nccl"] += 1
        return True
    if LAST_ERROR.match(text):
        acc.counts["nccl"] += 1
        warn_line(acc, {"host": None, "pid": None, "cuda_dev": None, "line": n, "time_ns": None}, text, None)
        return True
    return False


def _other(acc: Acc, line: str, n: int) -> None:
    text = LAUNCHER_TAGS.sub("", line).strip()
    if not text:
        acc.counts["other"] += 1
        return
    # PyTorch ProcessGroupNCCL
    if PT_ANY.search(line) or PT_DESYNC.search(line):
        acc.counts["pytorch"] += 1
        acc.ras = False
        pytorch_line(acc, line, n)
        return
    if _bare_nccl(acc, text, n):
        return
    rv = RAS_VERSION.match(text)
    if rv:
        acc.version = acc.version or rv["ver"]
        acc.ras = True
        acc.counts["ras"] += 1
        return
    vm = VERSION.search(text)
    if vm and text.startswith("NCCL version"):
        acc.version = acc.version or vm["ver"]
        acc.counts["nccl"] += 1  # the bare banner of <= 2.21
        return
    if acc.ras:
        acc.counts["ras"] += 1
        ras_line(acc, text, n)
        return
    if nccl_tests_line(acc, text, n):
        acc.counts["nccl_tests"] += 1
        return
    for cm in CMD_ENV.finditer(line):
        acc.add("nccl_env", host=None, pid=None, cuda_dev=None, line=n, var=cm["var"], value=cm["val"],
                origin="command")
    pm = NT_PERF.search(line)
    if pm:
        acc.perf = acc.perf or COLL_NAMES[pm.group(1)]
    acc.counts["other"] += 1


def _settle_rows(acc: Acc) -> None:
    """What only the whole file tells: whether bare number rows are nccl-tests results, the test's
    collective, the launcher's ranks, the 2.20+ layout, which variables a plugin set."""
    tail_lines = len({t["line"] for t in acc.tails}) + acc.tail_lines
    if acc.nt_seen:
        acc.rows["nccl_tests"].extend(acc.tails)
    else:  # bare number rows in a file without nccl-tests output are just text
        acc.counts["nccl_tests"] -= tail_lines
        acc.counts["other"] += tail_lines
    if acc.perf:
        for row in acc.rows.get("nccl_tests", []):
            row["collective"] = acc.perf
    for (h, p, d), r in acc.launcher.items():
        acc.rows["nccl_comms"].append({"source": acc.source, "host": h, "pid": p, "cuda_dev": d, "rank": r,
                                       "origin": "launcher"})
    if acc.rows.get("_layout"):
        _apply_layout(acc.rows["nccl_comms"], acc.rows["_layout"])
    env = acc.rows.get("nccl_env", [])
    plugin_vars = {r["var"] for r in env if r.get("origin") == "plugin" and r.get("var") is not None}
    for row in env:
        if row.get("var") in plugin_vars:
            row["origin"] = "plugin"


def _apply_layout(comms: list[dict[str, Any]], layout: list[dict[str, Any]]) -> None:
    """nnodes / localRanks from the 2.20+ layout lines onto the file's communicators, by (host, pid,
    comm), the last line winning; a communicator with an unknown key gets none."""
    by_key = {(r["host"], r["pid"], r["comm"]): (r["nnodes"], r["local_ranks"]) for r in layout}
    for row in comms:
        key = (row.get("host"), row.get("pid"), row.get("comm"))
        row["nnodes"], row["local_ranks"] = (None, None) if None in key else by_key.get(key, (None, None))


def _frames(files: list[_File]) -> dict[str, pl.DataFrame]:
    """The frames of every file's rows, built once."""
    out: dict[str, pl.DataFrame] = {}
    for name in ("nccl_comms", "nccl_net", "nccl_channels", "nccl_calls", "nccl_tuning", "nccl_env",
                 "nccl_events", "collective_timeouts", "nccl_tests"):
        out[name] = _rows_frame(name, [row for f in files for row in f.acc.rows.get(name, [])])
    out["nccl_files"] = _rows_frame("nccl_files", [_file_row(f) for f in files])
    return out


def _rows_frame(name: str, rows: list[dict[str, Any]]) -> pl.DataFrame:
    if not rows:
        return fr.empty(name)
    schema = fr.schema(name)
    return pl.DataFrame([{k: r.get(k) for k in schema} for r in rows], schema=schema, orient="row")


def _file_row(f: _File) -> dict[str, Any]:
    acc, c = f.acc, f.acc.counts
    return {
        "source": acc.source, "nccl_version": acc.version, "lines": f.lines, "nccl_lines": c["nccl"],
        "nccl_unknown": c["nccl_unknown"], "nccl_tests_lines": c["nccl_tests"], "pytorch_lines": c["pytorch"],
        "ras_lines": c["ras"], "other_lines": c["other"], "unknown_sample": acc.unknown_sample,
        "version_range": _range(acc),
    }


def _range(acc: Acc) -> str | None:
    """`2.20-2.22`, `>=2.24`, `<=2.18.1` from the line formats seen; null when nothing narrowed it."""
    lo = ".".join(map(str, acc.lo)) if acc.lo != (0,) else None
    hi = ".".join(map(str, acc.hi)) if acc.hi != (99,) else None
    if lo and hi:
        if acc.lo > acc.hi:  # formats of different eras: a custom build, or several NCCLs in one file
            return f"inconsistent: >={lo} and <={hi}"
        return lo if lo == hi else f"{lo}-{hi}"
    return f">={lo}" if lo else (f"<={hi}" if hi else None)


def process_ranks(frames: dict[str, pl.DataFrame]) -> pl.DataFrame:
    """Per file (source): (host, pid, cuda_dev) -> rank, from init lines (largest communicator wins)
    and, failing those, from the process's own side of its channel lines."""
    comms = frames["nccl_comms"].lazy().filter(pl.col("origin").is_in(["init", "launcher"]))
    init = comms.sort("nranks", descending=True, maintain_order=True).select(
        "source", "host", "pid", "cuda_dev", "rank", pl.lit(0).alias("prio"))
    ch = frames["nccl_channels"].lazy().select(
        "source", "host", "pid", "cuda_dev",
        pl.when(pl.col("direction") == "receive").then(pl.col("dst_rank")).otherwise(pl.col("src_rank")).alias("rank"),
        pl.lit(1).alias("prio"),
    )
    both = pl.concat([init, ch], how="vertical_relaxed").drop_nulls(["pid", "cuda_dev", "rank"])
    return (both.sort("prio", maintain_order=True)
            .unique(["source", "host", "pid", "cuda_dev"], keep="first", maintain_order=True)
            .drop("prio").collect())


def _fill_ranks(out: dict[str, pl.DataFrame], ranks: pl.DataFrame) -> dict[str, pl.DataFrame]:
    """A null rank of a line of a process whose rank its file tells (:func:`process_ranks`)."""
    if ranks.height == 0:
        return out
    ranks = ranks.rename({"rank": "_r"})
    for name in ("nccl_net", "nccl_channels", "nccl_calls", "nccl_tuning", "nccl_env", "nccl_events"):
        df = out[name]
        if df.height == 0:
            continue
        df = df.join(ranks, on=["source", "host", "pid", "cuda_dev"], how="left", nulls_equal=False,
                     maintain_order="left")
        out[name] = fr.conform(name, df.with_columns(pl.coalesce("rank", "_r").alias("rank")).drop("_r"))
    return out
