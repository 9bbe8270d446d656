"""timeline.json.gz: the job's GPU activity as one Chrome / Perfetto trace (JSON trace event format).

All ranks are merged on the job's common clock: each rank's times minus its offset
(``JobContext.clock_offsets``, from how matched collectives end together; 0 where unknown), written in µs
from ``otherData.t0_ns`` (the earliest event). One process per rank (``pid`` = rank, named
``host/rank N/GPU`` by a ``process_name`` metadata event, sorted by rank); its threads are the profiler
steps, one per CUDA stream (compute, memcpy, memset) and one per communicator (NCCL kernels of a
process group: ``NCCL <type> pg <name>``). Findings are instant events on the track ``findings`` of each
culprit rank (on a job-wide ``findings`` process when a finding names no rank). With Flight Recorder dumps,
each rank's last completed collective is an instant event on its ``flight recorder`` track (the only events
when the job left dumps and no traces).

Window: the worst step (largest median step time over ranks) with ``steps`` steps either side (default 1).
Size bound: at most ``max_events`` kernel slices. Over it, the kernels of each stream are merged into busy
intervals (gaps under :data:`MERGE_GAP_NS` bridged, ``busy: N kernels``); if still over, whole ranks are
left out, culprits and the lowest ranks kept first. ``otherData`` says what was done.
"""

from __future__ import annotations

import gzip
from typing import TYPE_CHECKING, Any

import orjson
import polars as pl
from forensics.reports.labels import culprit_ranks, gpu_labels
from forensics.reports.view_timeline import pick_steps

from forensics import __version__

if TYPE_CHECKING:
    from forensics.facts.context import JobContext
    from forensics.pipeline import Analysis

MAX_EVENTS = 200_000
MERGE_GAP_NS = 10_000
NAME_CHARS = 160
STEPS_TID = 0
FINDINGS_TID = 1
FINDINGS_PID = -1
FR_TID = 2
KERNEL_SCHEMA = {"rank": pl.Int32, "track": pl.String, "name": pl.String, "cat": pl.String, "start_ns": pl.Int64,
                 "end_ns": pl.Int64, "n": pl.UInt32}


def window_steps(ctx: JobContext, around: int) -> list[int]:
    """The worst step and ``around`` steps either side (by position among the job's step numbers)."""
    worst = pick_steps(ctx)
    if not worst:
        return []
    numbers = sorted(set(ctx.steps["step"].to_list()))
    i = numbers.index(worst[0][0])
    return numbers[max(0, i - around): i + around + 1]


def _kernels(ctx: JobContext, windows: pl.DataFrame) -> pl.DataFrame:
    """Every kernel overlapping a rank's window, with its track: the communicator for NCCL, else the stream."""
    k = ctx.frames["kernels"].select("rank", "stream", "name", "class", "start_ns", "end_ns").filter(
        pl.col("rank").is_not_null()).with_columns(pl.col("rank").cast(pl.Int32))
    comm = ctx.match.kernels.select(pl.col("rank").cast(pl.Int32), "start_ns", "end_ns", "stream",
                                    (pl.lit("NCCL ") + pl.col("pg_type") + " pg "
                                     + pl.col("pg_name").fill_null("?")).alias("_pg"))
    k = k.join(comm, on=["rank", "start_ns", "end_ns", "stream"], how="left").join(windows, on="rank")
    k = k.filter((pl.col("end_ns") >= pl.col("w_start")) & (pl.col("start_ns") <= pl.col("w_end")))
    track = pl.coalesce("_pg", pl.lit("stream ") + pl.col("stream").cast(pl.String).fill_null("?"))
    name = pl.col("name").cast(pl.String).fill_null("?").str.slice(0, NAME_CHARS)  # Categorical in the frames
    return k.select("rank", track.alias("track"), name,
                    pl.col("class").cast(pl.String).alias("cat"), "start_ns", "end_ns",
                    pl.lit(1, pl.UInt32).alias("n")).unique().cast(KERNEL_SCHEMA)  # type: ignore[arg-type]


def merge_busy(k: pl.DataFrame, gap_ns: int = MERGE_GAP_NS) -> pl.DataFrame:
    """Non-NCCL kernels of one track merged into busy intervals (gaps under ``gap_ns`` bridged); NCCL kept."""
    nccl = k.filter(pl.col("cat") == "comm")
    rest = k.filter(pl.col("cat") != "comm").sort("rank", "track", "start_ns")
    prev = pl.col("end_ns").cum_max().shift(1).over(["rank", "track"])
    rest = rest.with_columns((prev.is_null()
                              | (pl.col("start_ns") > prev + gap_ns)).cum_sum().over(["rank", "track"]).alias("_b"))
    merged = rest.group_by("rank", "track", "_b").agg(
        pl.col("name").first(), pl.col("cat").first(), pl.col("start_ns").min(), pl.col("end_ns").max(),
        pl.col("n").sum())
    merged = merged.with_columns(pl.when(pl.col("n") > 1).then(pl.lit("busy: ") + pl.col("n").cast(pl.String)
                                                               + " kernels")
                                 .otherwise(pl.col("name")).alias("name"))
    return pl.concat([nccl, merged.select(nccl.columns).cast(KERNEL_SCHEMA)], how="vertical")  # type: ignore[arg-type]


def bound(k: pl.DataFrame, max_events: int, priority: list[int]) -> tuple[pl.DataFrame, dict[str, Any]]:
    """At most ``max_events`` rows: merged first, then whole ranks dropped (``priority`` ranks kept first)."""
    note: dict[str, Any] = {"kernels_in_window": k.height, "cap": max_events, "merged": False, "ranks_dropped": 0}
    if k.height <= max_events:
        return k, note
    k = merge_busy(k)
    note["merged"] = True
    if k.height <= max_events:
        return k, note
    counts = k.group_by("rank").len()
    order = {r: i for i, r in enumerate(priority)}
    counts = counts.with_columns(pl.col("rank").replace_strict(order,
                                                               default=len(order) + pl.col("rank").cast(pl.Int64),
                                                               return_dtype=pl.Int64).alias("_o")).sort("_o")
    keep = counts.filter(pl.col("len").cum_sum() <= max_events)["rank"]
    note["ranks_dropped"] = counts.height - keep.len()
    return k.filter(pl.col("rank").is_in(keep.to_list())), note


def _offsets(ctx: JobContext) -> pl.DataFrame:
    return ctx.clock_offsets.by_rank.select(pl.col("rank").cast(pl.Int32), "offset_ns")


def _tids(k: pl.DataFrame) -> pl.DataFrame:
    """rank, track, tid: NCCL tracks first, then streams, numbered from 2 per rank (0 steps, 1 findings)."""
    t = k.select("rank", "track").unique().sort("rank", pl.col("track").str.starts_with("NCCL").not_(), "track")
    return t.with_columns((pl.int_range(pl.len()).over("rank") + 2).cast(pl.Int64).alias("tid"))


def _meta(pid: int, tid: int | None, what: str, value: Any) -> dict[str, Any]:
    ev: dict[str, Any] = {"ph": "M", "pid": pid, "tid": tid if tid is not None else 0, "ts": 0, "name": what,
                          "args": {"name" if what.endswith("name") else "sort_index": value}}
    return ev


def _slices(k: pl.DataFrame, t0: int) -> list[dict[str, Any]]:
    rows = k.select("name", "cat", ((pl.col("start_ns") - t0) / 1e3).round(3).alias("ts"),
                    ((pl.col("end_ns") - pl.col("start_ns")) / 1e3).round(3).clip(lower_bound=0).alias("dur"),
                    pl.col("rank").cast(pl.Int64).alias("pid"), "tid", "n")
    return [{"ph": "X", "name": r["name"], "cat": r["cat"], "ts": r["ts"], "dur": r["dur"], "pid": r["pid"],
             "tid": r["tid"],
             **({"args": {"kernels": r["n"]}} if r["n"] > 1 else {})} for r in rows.iter_rows(named=True)]


def _finding_events(analysis: Analysis, ranks: set[int], at_us: float) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for f in analysis.findings:
        pids = sorted(r for r in f.ranks if r in ranks) or [FINDINGS_PID]
        args = {"id": f.id, "severity": f.severity.value, "summary": f.summary[:500], "scope": f.scope}
        out += [{"ph": "i", "s": "t", "name": f"[{f.severity.value}] {f.title}", "cat": "finding", "ts": at_us,
                 "pid": p, "tid": FINDINGS_TID, "args": args} for p in pids]
    return out


def trace_events(analysis: Analysis, around: int = 1, max_events: int = MAX_EVENTS) -> dict[str, Any]:
    """The trace as a dict (``traceEvents``, ``displayTimeUnit``, ``otherData``)."""
    ctx = analysis.context
    steps = window_steps(ctx, around)
    other: dict[str, Any] = {"tool": "forensics", "version": __version__, "steps": steps,
                             "clock": "common clock: each rank's times minus its estimated offset; ts in us from t0_ns"}
    if not steps:
        fr = _fr_events(ctx, None)
        if fr:
            other.update(t0_ns=fr[0], events=len(fr[1]), flight_recorder="each rank's last completed collective")
            return {"traceEvents": fr[1], "displayTimeUnit": "ms", "otherData": other}
        other["empty"] = "no GPU kernels with a known rank"
        return {"traceEvents": [], "displayTimeUnit": "ms", "otherData": other}
    win = ctx.step_windows.filter(pl.col("step").is_in(steps)).group_by("rank").agg(
        pl.col("w_start").min(), pl.col("w_end").max()).with_columns(pl.col("rank").cast(pl.Int32))
    culprits = culprit_ranks(analysis)
    k, note = bound(_kernels(ctx, win), max_events, culprits)
    off = _offsets(ctx)
    shift = [pl.col(c) - pl.col("offset_ns").fill_null(0) for c in ("start_ns", "end_ns")]
    k = k.join(off, on="rank", how="left").with_columns(shift).drop("offset_ns")
    st = ctx.frames["steps"].filter(pl.col("step").is_in(steps) & pl.col("rank").is_in(k["rank"].unique().to_list()))
    st = st.with_columns(pl.col("rank").cast(pl.Int32)).join(off, on="rank", how="left").with_columns(shift)
    starts = [int(v) for v in (k["start_ns"].min(), st["start_ns"].min()) if v is not None]  # type: ignore[arg-type]
    t0 = min(starts, default=0)
    k = k.join(_tids(k), on=["rank", "track"])
    steps_ev = st.select(pl.lit("ProfilerStep#").alias("_p") + pl.col("step").cast(pl.String),
                         pl.lit("step").alias("cat"), "start_ns", "end_ns", "rank",
                         pl.lit(STEPS_TID, pl.Int64).alias("tid"),
                         pl.lit(1, pl.UInt32).alias("n")).rename({"_p": "name"})
    events = _process_meta(ctx, k) + _slices(steps_ev, t0) + _slices(k, t0)
    worst = st.filter(pl.col("step") == pick_steps(ctx)[0][0])["start_ns"].min()
    at_us = round((int(worst) - t0) / 1e3, 3) if worst is not None else 0.0  # type: ignore[arg-type]
    events += _finding_events(analysis, set(k["rank"].unique().to_list()), at_us)
    fr = _fr_events(ctx, t0)
    events += fr[1] if fr else []
    if any(e["pid"] == FINDINGS_PID for e in events):
        events.append(_meta(FINDINGS_PID, None, "process_name", "findings (no rank named)"))
    other.update(note, t0_ns=t0, events=len(events), ranks=k["rank"].n_unique())
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": other}


def _fr_marks(ctx: JobContext) -> pl.DataFrame:
    """Per rank: its last completed collective (the latest over its groups, from the Flight Recorder counters) and
    when: the entry's completion time when the dump holds it, else the enqueue time of the first pending entry
    (dumps written with onlyActive keep no completed entries). rank, pg_name, pg_desc, seq, at_ns, how."""
    st = ctx.frames["fr_pg_status"].filter(pl.col("last_completed") >= 0)
    e = ctx.frames["fr_entries"].lazy()  # lazily: the few columns read, not copies of millions of entries
    done = e.filter(pl.col("completed_ns").is_not_null()).select(
        "rank", "pg_id", pl.col("collective_seq").alias("last_completed"), pl.col("completed_ns").alias("_done"))
    nxt = e.select("rank", "pg_id", (pl.col("collective_seq") - 1).alias("last_completed"),
                   pl.col("created_ns").alias("_next"))
    keys = ["rank", "pg_id", "last_completed"]
    m = st.lazy().join(done.unique(keys), on=keys, how="left").join(nxt.unique(keys), on=keys, how="left").with_columns(
        pl.coalesce("_done", "_next").alias("at_ns"),
        pl.when(pl.col("_done").is_not_null()).then(pl.lit("completed")).otherwise(pl.lit("next enqueued"))
        .alias("how"))
    return m.drop_nulls("at_ns").sort("at_ns").group_by("rank").agg(pl.all().last()).select(
        pl.col("rank").cast(pl.Int32), "pg_name", "pg_desc", pl.col("last_completed").alias("seq"), "at_ns", "how"
    ).collect()


def _fr_events(ctx: JobContext, t0: int | None) -> tuple[int, list[dict[str, Any]]] | None:
    """Instant events ``FR last completed`` on each rank's ``flight recorder`` track; None without dumps."""
    marks = _fr_marks(ctx) if ctx.frames.has("fr_pg_status") else pl.DataFrame()
    if marks.height == 0:
        return None
    base = t0 if t0 is not None else int(marks["at_ns"].min())  # type: ignore[arg-type]
    events: list[dict[str, Any]] = []
    for r in marks.iter_rows(named=True):
        events += [_meta(r["rank"], FR_TID, "thread_name", "flight recorder"),
                   {"ph": "i", "s": "t", "name": f"FR last completed: {r['pg_desc'] or 'PG ' + str(r['pg_name'])} "
                    f"#{r['seq']}", "cat": "flight_recorder", "ts": round((r["at_ns"] - base) / 1e3, 3),
                    "pid": r["rank"], "tid": FR_TID, "args": {"pg_name": r["pg_name"], "seq": r["seq"],
                                                               "time": r["how"]}}]
    return base, events


def _process_meta(ctx: JobContext, k: pl.DataFrame) -> list[dict[str, Any]]:
    labels = gpu_labels(ctx)
    ranks = sorted(k["rank"].unique().to_list())
    gpu = dict(labels.select("rank", "gpu").iter_rows())
    host = dict(labels.select("rank", "host").iter_rows())
    events: list[dict[str, Any]] = []
    for r in ranks:
        dev = str(gpu.get(r) or "").removeprefix(f"{host.get(r)}:") or "?"
        events += [_meta(r, None, "process_name", f"{host.get(r) or '?'}/rank {r}/GPU {dev}"),
                   _meta(r, None, "process_sort_index", r),
                   _meta(r, STEPS_TID, "thread_name", "steps"), _meta(r, FINDINGS_TID, "thread_name", "findings")]
    for r, track, tid in k.select("rank", "track", "tid").unique().sort("rank", "tid").iter_rows():
        events += [_meta(r, tid, "thread_name", track), _meta(r, tid, "thread_sort_index", tid)]
    return events


def render(analysis: Analysis, around: int = 1, max_events: int = MAX_EVENTS) -> bytes:
    """timeline.json.gz's bytes (gzip, no timestamp in the header: the same input gives the same file)."""
    doc = trace_events(analysis, around, max_events)
    return gzip.compress(orjson.dumps(doc), mtime=0)
