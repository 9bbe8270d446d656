"""The job's last words as plain data for report.html and summary.md: per failing rank its traceback, the
launcher's failure table, the scheduler's messages, the stack groups. Input text stays text here; the
templates (autoescape) and md_text escape it."""

from __future__ import annotations

from typing import Any

import polars as pl

from forensics.base.findings import Finding
from forensics.detectors import kind_of as declared_kind
from forensics.detectors.last_words import APP_FAILURE, SCHEDULER_STOP
from forensics.detectors.last_words.stacks import group_stacks
from forensics.detectors.last_words.texts import first_line
from forensics.incidents.model import fmt_time
from forensics.pipeline import Analysis

MAX_RANKS = 64
MAX_TRACEBACK_LINES = 80
MAX_ROWS = 200


def first_failure(analysis: Analysis) -> Finding | None:
    """The first failure (or the scheduler's stop) the last-words detector found, by its declared kinds."""
    return next((f for f in analysis.findings if declared_kind(f) in (APP_FAILURE, SCHEDULER_STOP)), None)


def _who(row: dict[str, Any]) -> str:
    if row.get("rank") is not None:
        return f"rank {row['rank']}"
    if row.get("local_rank") is not None:
        return f"local rank {row['local_rank']}"
    return "rank not printed"


def _clip_lines(text: str | None, limit: int = MAX_TRACEBACK_LINES) -> str:
    lines = (text or "").splitlines()
    return "\n".join(lines[:limit] + ([f"... {len(lines) - limit} more line(s) in the frames"] if len(lines) > limit else []))


def rank_failures(lw: pl.DataFrame) -> list[dict[str, Any]]:
    """One entry per failing process (rank, local rank, file): its first own failure with its traceback."""
    own = lw.filter(pl.col("event").is_in(["exception", "error_line"]) & (pl.col("role") == "rank"))
    if own.height == 0:
        return []
    firsts = own.sort("time_ns", "source", "line", nulls_last=True).unique(
        ["rank", "local_rank", "source"], keep="first", maintain_order=True).head(MAX_RANKS)
    out = []
    for r in firsts.iter_rows(named=True):
        when = fmt_time(r["time_ns"])
        out.append({"who": _who(r), "host": r.get("host"), "where": f"{r['source']}:{r['line']}",
                    "time": f"{when} UTC ({r['time_from']})" if when else (r.get("stamp") or "no time"),
                    "cls": r["cls"], "first_line": first_line(r), "user_frame": r.get("user_frame"),
                    "traceback": _clip_lines(r.get("traceback") or r.get("message"))})
    return out


def launcher_table(lw: pl.DataFrame) -> pl.DataFrame:
    rows = lw.filter(pl.col("event") == "launcher_failure")
    return rows.select("rank", "local_rank", "host", "pid", "exit_code", "signal", "first_observed",
                       pl.col("time_ns").map_elements(fmt_time, return_dtype=pl.String).alias("time (UTC)"),
                       pl.format("{}:{}", "source", "line").alias("where")).head(MAX_ROWS)


def scheduler_lines(lw: pl.DataFrame) -> list[str]:
    rows = lw.filter(pl.col("event").is_in(["scheduler", "task_exit", "pod", "launcher_stopped", "restart"]))
    rows = rows.unique(["event", "cls", "message"], keep="first", maintain_order=True).head(24)
    return [f"{r['source']}:{r['line']}: {r['message']}" for r in rows.iter_rows(named=True)]


def stack_groups(stacks: pl.DataFrame) -> pl.DataFrame:
    if stacks.height == 0:
        return pl.DataFrame()
    g = group_stacks(stacks, 0.5)
    return g.groups.select("where", pl.col("n").alias("count"),
                           pl.col("member").list.head(16).list.join(", ").alias("members"), "stack").head(MAX_ROWS)


def summary(analysis: Analysis) -> dict[str, Any] | None:
    """Everything the report's "Last words" section shows; None when the job said nothing."""
    lw, st = analysis.frames["last_words"], analysis.frames["stacks"]
    if lw.height == 0 and st.height == 0:
        return None
    return {"first": first_failure(analysis), "ranks": rank_failures(lw), "launcher": launcher_table(lw),
            "scheduler": scheduler_lines(lw), "stacks": stack_groups(st),
            "sigterms": lw.filter(pl.col("event") == "launcher_signal").height}
