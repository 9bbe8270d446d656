"""Which of the job's own words is its first failure, and when each happened.

Times: an event's own stamp; a year-less glog stamp placed in the job's year (the year of any dated
line of the last words; unplaced without one); for an event with no time, the launcher's record of the
same rank (torchrun's failure table: `time_from` launcher). Order: the earliest timed failure; when no
failure has a time, the first in (file, line) order.
"""

from __future__ import annotations

from datetime import datetime, timezone

import polars as pl

#: rank-level failures a job dies of (a traceback cut off before its exception line counts only when
#: nothing else is known)
FAILURE_EVENTS = ("exception", "error_line")
VICTIM_CLASSES = ("nccl_remote", "nccl_system", "nccl_internal", "nccl_cuda", "nccl_usage", "dist_error")
SCHEDULER_STOPS = ("time_limit", "preempted", "node_fail", "requeue", "cancelled", "cancelled_other")
POD_FAILURES = ("oom_killed", "evicted", "error", "gpu_unhealthy", "node_oom")


def _year(lw: pl.DataFrame) -> int | None:
    t = lw["time_ns"].drop_nulls()
    if t.len() == 0:
        return None
    return datetime.fromtimestamp(int(t.min()) / 1e9, tz=timezone.utc).year  # type: ignore[arg-type]


def _glog_ns(stamp: str | None, year: int | None) -> int | None:
    if not stamp or year is None:
        return None
    try:
        dt = datetime.strptime(f"{year}{stamp[:4]} {stamp[5:13]}", "%Y%m%d %H:%M:%S").replace(tzinfo=timezone.utc)
    except ValueError:
        return None
    frac = stamp[14:] if len(stamp) > 14 else ""
    return int(dt.timestamp()) * 1_000_000_000 + (int(frac.ljust(9, "0")[:9]) if frac.isdigit() else 0)


def timed(lw: pl.DataFrame, fallback_year: int | None = None) -> pl.DataFrame:
    """``last_words`` with ``t_ns`` (its time, glog stamps placed, launcher record for untimed rank events)
    and ``t_from`` (how it was found), and an ``order`` column (file, line)."""
    year = _year(lw) or fallback_year  # the last words' own dated lines, else the job's (traces, kernel logs)
    t = [r if r is not None else _glog_ns(s, year) for r, s in zip(lw["time_ns"].to_list(), lw["stamp"].to_list())]
    out = lw.with_columns(pl.Series("t_ns", t, dtype=pl.Int64), pl.col("time_from").alias("t_from"),
                          pl.int_range(pl.len()).alias("order"))
    launch = (out.filter((pl.col("event") == "launcher_failure") & pl.col("rank").is_not_null() & pl.col("t_ns").is_not_null())
              .group_by("rank").agg(pl.col("t_ns").min().alias("_lt"), pl.col("host").drop_nulls().first().alias("_lh")))
    if launch.height:
        out = out.join(launch, on="rank", how="left").with_columns(
            pl.when(pl.col("t_ns").is_null() & pl.col("_lt").is_not_null()).then(pl.lit("launcher"))
            .otherwise(pl.col("t_from")).alias("t_from"),
            pl.col("t_ns").fill_null(pl.col("_lt")), pl.col("host").fill_null(pl.col("_lh"))).drop("_lt", "_lh")
    return out.sort("order")


def failures(t: pl.DataFrame) -> pl.DataFrame:
    """The ranks' own failures, first first: errors and exceptions, then launcher exits and pod deaths
    where no rank said more; cut-off tracebacks only when there is nothing else."""
    own = t.filter(pl.col("event").is_in(FAILURE_EVENTS) & (pl.col("role") == "rank")
                   & ~pl.col("cls").is_in(["truncated", *VICTIM_CLASSES]))
    if own.height == 0:
        own = t.filter(((pl.col("event") == "launcher_failure") & (pl.col("exit_code").fill_null(1) != 0))
                       | ((pl.col("event") == "pod") & pl.col("cls").is_in(POD_FAILURES))
                       | ((pl.col("event") == "task_exit") & (pl.col("exit_code").fill_null(1) != 0))
                       | ((pl.col("event") == "scheduler") & (pl.col("cls") == "step_oom")))
    if own.height == 0 and not t.filter(pl.col("cls").is_in(VICTIM_CLASSES)).height:
        own = t.filter((pl.col("event") == "exception") & (pl.col("role") == "rank") & (pl.col("cls") == "truncated"))
    return first_order(own)


def first_order(df: pl.DataFrame) -> pl.DataFrame:
    """By time (ties: the launcher's first observed failure, then file order). A file is written in order, so an
    untimed row sorts at the time of the next timed row of its file (a bound: it happened no later); rows of a
    file with no time at all come after the timed ones."""
    key = pl.col("t_ns").backward_fill().over("source", order_by="order")
    return df.with_columns(key.alias("_k")).sort(
        [pl.col("_k").is_null(), "_k", pl.col("first_observed").fill_null(False).not_(), "order"],
        nulls_last=True).drop("_k")


def scheduler_stops(t: pl.DataFrame) -> pl.DataFrame:
    stops = t.filter(((pl.col("event") == "scheduler") & pl.col("cls").is_in(SCHEDULER_STOPS))
                     | ((pl.col("event") == "pod") & (pl.col("cls") == "preempted")))
    return first_order(stops)
