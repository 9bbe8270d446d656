"""Per-chunk extraction: event dicts -> compact column buffers -> Polars frames.

Only the fields the canonical frames need are copied out of each event; the dicts are dropped with
their chunk. Times stay in the trace's own unit (µs, int or float) here and are converted to
integer ns in Polars, exactly (see ``us_to_ns``).
"""

from __future__ import annotations

from collections import Counter

import polars as pl

# Kineto category -> (table, normalised category). Legacy (2021) names map to today's.
GPU_CATS = {
    "kernel": "kernel", "Kernel": "kernel",
    "gpu_memcpy": "memcpy", "Memcpy": "memcpy",
    "gpu_memset": "memset", "Memset": "memset",
    "cuda_sync": "sync",
}
CPU_CATS = {
    "cpu_op": "cpu_op", "Operator": "cpu_op",
    "user_annotation": "user_annotation",
    "gpu_user_annotation": "gpu_user_annotation",
    "cuda_runtime": "cuda_runtime", "Runtime": "cuda_runtime",
    "cuda_driver": "cuda_driver",
    "python_function": "python_function", "Python": "python_function",
}
# Host-side ops whose args may carry collective metadata.
COMM_OP_PREFIXES = ("record_param_comms", "nccl:", "c10d::", "gloo:")

_GPU_COLS = (
    "kind", "name", "device", "stream", "ts", "dur", "correlation", "external_id", "grid", "block",
    "blocks_per_sm", "coll_raw", "in_nelems", "out_nelems", "dtype", "group_size", "pg_name",
    "pg_desc", "pg_ranks_raw", "seq",
)
_CPU_COLS = ("category", "name", "pid", "tid", "ts", "dur", "correlation", "external_id")
_COMM_COLS = (
    "pid", "tid", "name", "ts", "dur", "external_id", "coll_raw", "in_nelems", "out_nelems",
    "dtype", "group_size", "pg_name", "pg_desc", "pg_ranks_raw", "seq", "src_rank", "dst_rank",
    "pg_id",
)

_EMPTY: dict = {}


def _to_int(value: object) -> int | None:
    """Kineto ids are ints, but legacy traces write `"25738"` or `"stream 7"`."""
    if value.__class__ is int:
        return value  # type: ignore[return-value]
    if isinstance(value, str):
        digits = value.rsplit(" ", 1)[-1]
        if digits.lstrip("-").isdigit():
            return int(digits)
        return None
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


def _num(value: object) -> int | None:
    if value.__class__ is int:
        return value  # type: ignore[return-value]
    if isinstance(value, float) and value == value:
        return int(value)
    if isinstance(value, str) and value.lstrip("-").isdigit():
        return int(value)
    return None


def _text(value: object) -> str | None:
    if value is None:
        return None
    return value if isinstance(value, str) else str(value)


def us_to_ns(col: str) -> pl.Expr:
    """µs (int, or float with ns decimals) -> integer ns without float drift: the integer part is
    scaled exactly and only the fraction goes through a rounded multiplication."""
    whole = pl.col(col).floor()
    return whole.cast(pl.Int64) * 1000 + ((pl.col(col) - whole) * 1000).round().cast(pl.Int64)


class Extractor:
    """Feeds on chunks of event dicts; keeps only Polars frames between chunks."""

    def __init__(self) -> None:
        self.gpu_parts: list[pl.DataFrame] = []
        self.cpu_parts: list[pl.DataFrame] = []
        self.comm_parts: list[pl.DataFrame] = []
        self.skipped: Counter[str] = Counter()
        self.malformed = 0
        self._reset()

    def _reset(self) -> None:
        self._gpu: dict[str, list] = {c: [] for c in _GPU_COLS}
        self._cpu: dict[str, list] = {c: [] for c in _CPU_COLS}
        self._comm: dict[str, list] = {c: [] for c in _COMM_COLS}

    def feed(self, events: list) -> None:
        g, c, k = self._gpu, self._cpu, self._comm
        g_kind, g_name, g_dev, g_stream, g_ts, g_dur = (
            g["kind"].append, g["name"].append, g["device"].append, g["stream"].append,
            g["ts"].append, g["dur"].append,
        )
        g_corr, g_ext, g_grid, g_block, g_bps = (
            g["correlation"].append, g["external_id"].append, g["grid"].append, g["block"].append,
            g["blocks_per_sm"].append,
        )
        c_cat, c_name, c_pid, c_tid, c_ts, c_dur, c_corr, c_ext = (c[x].append for x in _CPU_COLS)
        gpu_cats, cpu_cats, skipped = GPU_CATS, CPU_CATS, self.skipped
        gpu_comm_cols = [g[x].append for x in _GPU_COLS[11:]]
        for e in events:
            if e.__class__ is not dict:
                self.malformed += 1
                continue
            cat = e.get("cat")
            kind = gpu_cats.get(cat)  # type: ignore[arg-type]
            if kind is not None:
                a = e.get("args") or _EMPTY
                name = e.get("name")
                ts = e.get("ts")
                if ts is None or name is None:
                    self.malformed += 1
                    continue
                g_kind(kind)
                g_name(name)
                dev = a.get("device")
                g_dev(dev if dev is not None else _to_int(e.get("pid")))
                st = a.get("stream")
                g_stream(st if st is not None else _to_int(e.get("tid")))
                g_ts(ts)
                g_dur(e.get("dur"))
                g_corr(a.get("correlation"))
                ext = a.get("External id")
                g_ext(ext if ext is not None else a.get("external id"))
                g_grid(a.get("grid"))
                g_block(a.get("block"))
                g_bps(a.get("blocks per SM"))
                coll = a.get("Collective name")
                if coll is None and a.get("In msg nelems") is None:
                    for f in gpu_comm_cols:
                        f(None)
                else:
                    for f, key in zip(gpu_comm_cols, _GPU_ARG_KEYS):
                        f(a.get(key))
                continue
            ccat = cpu_cats.get(cat)  # type: ignore[arg-type]
            if ccat is None:
                skipped[f"{e.get('ph')}:{cat}"] += 1
                continue
            name = e.get("name")
            ts = e.get("ts")
            if ts is None or name is None:
                self.malformed += 1
                continue
            a = e.get("args") or _EMPTY
            pid = e.get("pid")
            tid = e.get("tid")
            if pid.__class__ is not int:
                pid = _to_int(pid)
            if tid.__class__ is not int:
                tid = _to_int(tid)
            dur = e.get("dur")
            ext = a.get("External id")
            if ext is None:
                ext = a.get("external id")
            c_cat(ccat)
            c_name(name)
            c_pid(pid)
            c_tid(tid)
            c_ts(ts)
            c_dur(dur)
            c_corr(a.get("correlation"))
            c_ext(ext)
            if name.startswith(COMM_OP_PREFIXES) and ccat in ("cpu_op", "user_annotation"):
                k["pid"].append(pid)
                k["tid"].append(tid)
                k["name"].append(name)
                k["ts"].append(ts)
                k["dur"].append(dur)
                k["external_id"].append(ext)
                for key, col in _COMM_ARG_KEYS:
                    k[col].append(a.get(key))
        self._flush()

    def _flush(self) -> None:
        g, c, k = self._gpu, self._cpu, self._comm
        if g["name"]:
            self.gpu_parts.append(_gpu_frame(g))
        if c["name"]:
            self.cpu_parts.append(_cpu_frame(c))
        if k["name"]:
            self.comm_parts.append(_comm_frame(k))
        self._reset()


_GPU_ARG_KEYS = (
    "Collective name", "In msg nelems", "Out msg nelems", "dtype", "Group size",
    "Process Group Name", "Process Group Description", "Process Group Ranks", "Seq",
)
_COMM_ARG_KEYS = (
    ("Collective name", "coll_raw"), ("In msg nelems", "in_nelems"), ("Out msg nelems", "out_nelems"),
    ("dtype", "dtype"), ("Group size", "group_size"), ("Process Group Name", "pg_name"),
    ("Process Group Description", "pg_desc"), ("Process Group Ranks", "pg_ranks_raw"),
    ("Seq", "seq"), ("Src Rank", "src_rank"), ("Dst Rank", "dst_rank"),
    ("Process Group ID", "pg_id"),  # 2024-04 variant of Process Group Name
)


def _ints(values: list) -> pl.Series:
    return pl.Series([_num(v) if v is not None else None for v in values], dtype=pl.Int64)


def _strs(values: list) -> pl.Series:
    return pl.Series([_text(v) for v in values], dtype=pl.String)


def _times(values: list) -> pl.Series:
    return pl.Series(values, dtype=pl.Float64, strict=False)


def _id_series(values: list) -> pl.Series:
    """Ids are ints in every trace we know; anything else is coerced, never raised on."""
    try:
        return pl.Series(values, dtype=pl.Int64)
    except (TypeError, OverflowError, pl.exceptions.PolarsError):
        return pl.Series([_to_int(v) for v in values], dtype=pl.Int64)


def _dims(values: list) -> pl.Series:
    clean = [v if isinstance(v, list) and all(x.__class__ is int for x in v) else None for v in values]
    return pl.Series(clean, dtype=pl.List(pl.Int64))


def _with_ns(df: pl.DataFrame) -> pl.DataFrame:
    start = us_to_ns("ts")
    dur = us_to_ns("dur").fill_null(0)
    return df.with_columns(start.alias("start_ns"), (start + dur).alias("end_ns")).drop("ts", "dur")


def _gpu_frame(g: dict[str, list]) -> pl.DataFrame:
    grid, block = _dims(g["grid"]), _dims(g["block"])
    df = pl.DataFrame(
        {
            "kind": pl.Series(g["kind"], dtype=pl.String),
            "name": _strs(g["name"]),
            "device": _id_series(g["device"]),
            "stream": _id_series(g["stream"]),
            "ts": _times(g["ts"]),
            "dur": _times(g["dur"]),
            "correlation": _id_series(g["correlation"]),
            "external_id": _id_series(g["external_id"]),
            "grid_x": grid.list.get(0, null_on_oob=True),
            "grid_y": grid.list.get(1, null_on_oob=True),
            "grid_z": grid.list.get(2, null_on_oob=True),
            "block_x": block.list.get(0, null_on_oob=True),
            "block_y": block.list.get(1, null_on_oob=True),
            "block_z": block.list.get(2, null_on_oob=True),
            "blocks_per_sm": pl.Series(g["blocks_per_sm"], dtype=pl.Float64, strict=False),
            "coll_raw": _strs(g["coll_raw"]),
            "in_nelems": _ints(g["in_nelems"]),
            "out_nelems": _ints(g["out_nelems"]),
            "dtype": _strs(g["dtype"]),
            "group_size": _ints(g["group_size"]),
            "pg_name": _strs(g["pg_name"]),
            "pg_desc": _strs(g["pg_desc"]),
            "pg_ranks_raw": _strs(g["pg_ranks_raw"]),
            "seq": _ints(g["seq"]),
        }
    )
    return _with_ns(df)


def _cpu_frame(c: dict[str, list]) -> pl.DataFrame:
    df = pl.DataFrame(
        {
            "category": pl.Series(c["category"], dtype=pl.String),
            "name": _strs(c["name"]),
            "pid": _id_series(c["pid"]),
            "tid": _id_series(c["tid"]),
            "ts": _times(c["ts"]),
            "dur": _times(c["dur"]),
            "correlation": _id_series(c["correlation"]),
            "external_id": _id_series(c["external_id"]),
        }
    )
    return _with_ns(df)


def _comm_frame(k: dict[str, list]) -> pl.DataFrame:
    df = pl.DataFrame(
        {
            "pid": _id_series(k["pid"]),
            "tid": _id_series(k["tid"]),
            "name": _strs(k["name"]),
            "ts": _times(k["ts"]),
            "dur": _times(k["dur"]),
            "external_id": _id_series(k["external_id"]),
            "coll_raw": _strs(k["coll_raw"]),
            "in_nelems": _ints(k["in_nelems"]),
            "out_nelems": _ints(k["out_nelems"]),
            "dtype": _strs(k["dtype"]),
            "group_size": _ints(k["group_size"]),
            "pg_name": _strs(k["pg_name"]),
            "pg_desc": _strs(k["pg_desc"]),
            "pg_ranks_raw": _strs(k["pg_ranks_raw"]),
            "seq": _ints(k["seq"]),
            "src_rank": _ints(k["src_rank"]),
            "dst_rank": _ints(k["dst_rank"]),
            "pg_id": _strs(k["pg_id"]),
        }
    )
    return _with_ns(df)
