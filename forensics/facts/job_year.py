"""The job's year: year-less stamps (glog, syslog) are placed with it."""

from __future__ import annotations

from datetime import datetime, timezone

import polars as pl

from forensics.base.frames import JobFrames
from forensics.parsers.timestamps import glog_ns_expr


def job_year(frames: JobFrames) -> int | None:
    """The year of the job, for glog stamps that omit it: from trace steps, else placed kernel-log lines."""
    for name, col in (("steps", "start_ns"), ("kernel_events", "wall_ns")):
        t = frames[name][col].drop_nulls().min() if frames.has(name) and frames[name].height else None
        if t is not None:
            return datetime.fromtimestamp(int(t) / 1e9, tz=timezone.utc).year  # type: ignore[arg-type]
    return None


def placed(events: pl.DataFrame, year: int | None) -> pl.DataFrame:
    """``events`` (a frame with ``time_ns`` and ``stamp``, e.g. nccl_events) with each row's year-less glog stamp
    placed in ``year`` where the line had no dated stamp; rows with neither keep a null time."""
    if "stamp" not in events.columns or year is None or events["stamp"].null_count() == events.height:
        return events
    return events.with_columns(pl.coalesce("time_ns", glog_ns_expr(pl.col("stamp"), year)).alias("time_ns"))
