"""The job's year: year-less stamps (glog, syslog) are placed with it."""

from __future__ import annotations

from datetime import datetime, timezone

from forensics.base.frames import JobFrames


def job_year(frames: JobFrames) -> int | None:
    """The year of the job, for glog stamps that omit it: from trace steps, else placed kernel-log lines."""
    for name, col in (("steps", "start_ns"), ("kernel_events", "wall_ns")):
        t = frames[name][col].drop_nulls().min() if frames.has(name) and frames[name].height else None
        if t is not None:
            return datetime.fromtimestamp(int(t) / 1e9, tz=timezone.utc).year  # type: ignore[arg-type]
    return None
