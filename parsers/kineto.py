"""Kineto (PyTorch profiler) / Chrome-trace JSON -> canonical frames.

Decodes the trace in chunks into typed structs of only the fields the frames read (``kineto_typed``,
msgspec), or, for whatever that decoder rejects (NaN, damage, odd values), reads it as a stream of dicts
(``kineto_stream``); keeps only compact columns per chunk (``kineto_extract``), then builds kernels,
cpu_ops, steps, comms, ranks and process_groups with Polars. Handles every schema in the shared
samples: 2021 legacy categories (Operator/Runtime/Kernel, ``tid: "stream 7"``, lower-case
``external id``), epoch-µs integer and ns-resolution float timestamps with ``baseTimeNanoseconds``,
NCCL kernels of every naming era, RCCL on ROCm, CPU-only traces.
"""

from __future__ import annotations

from array import array
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

import polars as pl
from forensics.parsers import kineto_extract
from forensics.parsers.kineto_extract import INT32_MAX, INT32_MIN, Extractor
from forensics.parsers.kineto_names import (
    COMM_KERNEL_PATTERN,
    DTYPE_BYTES,
    FUSED_TP_OPS,
    host_from_filename,
    kernel_name_hints,
    normalise_collective,
    parse_rank_list,
    rank_from_filename,
)
from forensics.parsers.kineto_stream import ReadOutcome, TraceReadError, read_trace
from forensics.parsers.kineto_typed import TypedRejected, read_trace_compiled, read_trace_typed
from forensics.parsers.result import ParseContext, ParseResult, parse_alone

from forensics.base import frames as fr
from forensics.base.hosts import short_host

_LAUNCH_PATTERN = r"(?i)launch|memcpy|memset"
GRAPH_LAUNCH_PATTERN = r"^(cudaGraphLaunch|cuGraphLaunch|hipGraphLaunch)(_v\d+|_ptsz)?$"
"""Runtime / driver calls that replay a CUDA or HIP graph: every kernel of the replay carries their correlation id."""
_STEP_PATTERN = r"^ProfilerStep\s*#\s*(\d+)$"
UNRANKED = "rank unknown (no distributedInfo, none in the file name)"
_HOST_KEYS = ("host_name", "hostname", "host", "hostName")
_MSG_AND_PG = ("pg_name", "pg_desc", "pg_id", "group_size", "in_nelems", "out_nelems", "dtype", "bytes", "seq")


def parse(path: Path, ctx: ParseContext) -> ParseResult:
    """One trace: a batch of one."""
    return parse_alone(KinetoBatch(), path, ctx)


@dataclass
class _File:
    """One trace taken into a batch: what the reader saw, and whose trace it is."""

    index: int
    rel_path: str
    outcome: ReadOutcome
    dist: dict
    rank: int
    rank_note: str
    rank_guessed: bool
    skipped: int  # flow / instant / metadata events not tabulated
    malformed: int
    host: str | None = None
    fallback: str | None = None  # why the typed decoder left the file to the stream reader
    refused: str | None = None  # why the compiled reader left the file to the typed decoder
    past_int32: Counter[str] = field(default_factory=Counter)  # values past Int32 read as null or absent, by column


class KinetoBatch:
    """Several traces parsed as one: each file is read on its own (``add``), the frames of all of
    them are built at once (``finish``), so many small traces pay Polars' fixed costs once. Rows
    carry the file's index in ``_f`` until they are stamped with its rank, host and source."""

    def __init__(self) -> None:
        self.ex = Extractor()
        self.files: list[_File] = []

    def add(self, path: Path, ctx: ParseContext) -> ParseResult | None:
        """Read one trace. A failed result when nothing of it is usable, else None (its result
        comes from ``finish``). Whatever happens, a file that fails leaves no rows behind."""
        ex = self.ex
        ex.begin_file()
        fallback = refused = None
        try:
            try:
                outcome, refused = _read_compiled(path, ctx, ex)
                if outcome is None:
                    outcome = read_trace_typed(path, ctx.max_decompressed_bytes, ex.feed_typed)
            except TypedRejected as exc:  # the stream reader reads it, as it reads everything
                fallback = str(exc)
                ex.drop_file()
                ex.begin_file()
                outcome = read_trace(path, ctx.max_decompressed_bytes, ex.feed)
        except TraceReadError as exc:
            ex.drop_file()
            return ParseResult.failed(str(exc))
        except BaseException:
            ex.drop_file()
            raise
        if outcome.events == 0 and not outcome.complete:
            ex.drop_file()
            return ParseResult.failed(f"{outcome.problem}: nothing usable (cut before its first event?)")
        dist = outcome.meta.get("distributedInfo")
        dist = dist if isinstance(dist, dict) else {}
        past_int32: Counter[str] = Counter()
        rank, rank_note, rank_guessed = _rank(dist, ctx.rel_path, past_int32)
        index = len(self.files)
        ex.end_file(index)
        skipped = sum(ex.skipped.values()) + outcome.flows
        self.files.append(_File(index, ctx.rel_path, outcome, dist, rank, rank_note, rank_guessed, skipped,
                                ex.malformed, fallback=fallback, refused=refused, past_int32=past_int32))
        return None

    def __len__(self) -> int:
        return len(self.files)

    def finish(self) -> tuple[list[ParseResult], dict[str, pl.DataFrame]]:
        """The result of every file ``add`` took (in order) and the frames of them all."""
        ex, files = self.ex, self.files
        gpu = ex.gpu_frame()
        cpu = ex.cpu_frame()
        comm_raw = ex.comm_frame(cpu)
        shapes = ex.shape_frame(cpu)
        cpu = cpu.drop("_row") if cpu is not None else None
        bases = pl.Series([_base_ns(f.outcome.meta) for f in files], dtype=pl.Int64)
        if (bases != 0).any():
            gpu, cpu, comm_raw, shapes = (_shift(df, bases) for df in (gpu, cpu, comm_raw, shapes))
        _hosts(files, cpu)
        texts, lists = ex.rank_list_texts(), _MemberLists()
        pg_ids = pl.Series("pg_id", [lists.named(t)[1] for t in texts], dtype=pl.Int64)  # by pg_ranks_raw's code
        kernels = _kernels(gpu, pg_ids)
        cpu_ops = _cpu_ops(cpu, kernels, one_file=len(files) == 1)
        kernels = _graph_replays(kernels, cpu_ops)
        kernels = _fused_tp_copies(kernels, cpu_ops)
        comms = _comms(comm_raw, cpu_ops, kernels, pg_ids)
        kernels = _enrich_kernels(kernels, comms)
        named = _named_groups(kernels, comms)
        _count_lists_past_int32(files, (kernels, comms), texts, lists)
        kernels, comms = (df.drop("pg_ranks_raw") if df is not None else None for df in (kernels, comms))
        steps = _steps(cpu_ops)
        ranks = _ranks(files, kernels, cpu_ops)
        ident = _ident(files)
        out: dict[str, pl.DataFrame] = {}
        counts: dict[str, dict[int, int]] = {}
        for name, df in (("kernels", kernels), ("cpu_ops", cpu_ops), ("steps", steps), ("comms", comms),
                         ("op_shapes", shapes)):
            out[name], counts[name] = _stamp(name, df, ident)
        out["ranks"] = ranks
        out["process_groups"] = _process_groups(files, named, texts, lists)
        for index, nulled in ex.past_int32.items():  # the event columns' (the metadata's are counted already)
            files[index].past_int32.update(nulled)
        return [_result(f, counts, ex.dropped[f.index]) for f in files], out


def _read_compiled(path: Path, ctx: ParseContext, ex: Extractor) -> tuple[ReadOutcome | None, str | None]:
    """The trace read by the compiled reader; (None, why) when it refused it (its rows are dropped), (None,
    None) when it is not built."""
    if kineto_extract.kineto_columns is None:
        return None, None
    try:
        return read_trace_compiled(path, ctx.max_decompressed_bytes, ex.feed_text), None
    except TypedRejected as exc:
        ex.drop_file()
        ex.begin_file()
        return None, str(exc)


def _base_ns(meta: dict) -> int:
    base = meta.get("baseTimeNanoseconds")
    return int(base) if isinstance(base, int) and base else 0


def _shift(df: pl.DataFrame | None, bases: pl.Series) -> pl.DataFrame | None:
    """Times of each file's rows moved by its ``baseTimeNanoseconds``."""
    if df is None:
        return None
    base = bases.gather(df.get_column("_f"))
    return df.with_columns([(pl.col(c) + base) for c in ("start_ns", "end_ns")])


def _result(f: _File, counts: dict[str, dict[int, int]], dropped: int) -> ParseResult:
    n = {name: c.get(f.index, 0) for name, c in counts.items()}
    summary = (
        f"{f.outcome.events:,} events: {n['kernels']:,} GPU, {n['cpu_ops']:,} host, "
        f"{n['steps']} steps, {n['comms']} collective calls; "
        f"{f.skipped:,} flow/instant/metadata events not tabulated"
    )
    malformed = f.malformed + dropped
    if malformed:
        summary += f"; {malformed:,} malformed events skipped (no name, or a time that is not a finite number in range)"
    if f.past_int32:
        nulled = sum(f.past_int32.values())
        summary += (f"; {nulled:,} value{'s' if nulled > 1 else ''} past Int32 read as null "
                    f"({', '.join(sorted(f.past_int32))})")
    if f.rank_note:
        summary += f"; {f.rank_note}"
    if f.fallback:
        summary += f"; read by the stream reader ({_short(f.fallback)})"
    elif f.refused:
        summary += f"; read by the typed reader (the compiled one refused it: {_short(f.refused)})"
    status, message = ("ok", summary) if f.outcome.complete else ("partial", f"{f.outcome.problem}; {summary}")
    return ParseResult(status=status, message=message, rank=f.rank, host=f.host, rank_guessed=f.rank_guessed)


def _short(reason: str, limit: int = 160) -> str:
    """One line of at most ``limit`` characters."""
    line = " ".join(reason.split())
    return line if len(line) <= limit else line[: limit - 1] + "\u2026"


def _int32(value: object, name: str, seen: Counter[str]) -> int | None:
    """A metadata integer that fits its Int32 column, else None: a rank or size past Int32 is damage, read as
    absent like a value of the wrong type (building the frame with it failed the whole file); counted by
    ``name`` in ``seen`` for the source's message."""
    if not isinstance(value, int):
        return None
    if INT32_MIN <= value <= INT32_MAX:
        return value
    seen[name] += 1
    return None


def _rank(dist: dict, rel_path: str, seen: Counter[str]) -> tuple[int, str, bool]:
    """(rank, how the message says it, guessed): distributedInfo, else the file or folder name,
    else 0 as a guess that discovery keeps only when this is the job's only trace."""
    rank = _int32(dist.get("rank"), "rank", seen)
    if rank is not None:
        return rank, "", False
    for part in reversed(PurePosixPath(rel_path).parts):
        rank = rank_from_filename(part)
        if rank is not None:
            return rank, f"rank {rank} from the file name", False
    return 0, f"{UNRANKED}: analysed as rank 0", True


def _hosts(files: list[_File], cpu: pl.DataFrame | None) -> None:
    """Each file's host: from its metadata, else from its file name (with its host pids' help)."""
    pids: dict[int, set[int]] = {}
    need = [f for f in files if _meta_host(f.outcome.meta) is None]
    if need and cpu is not None:
        host_side = cpu.filter(pl.col("category").is_in(["cpu_op", "user_annotation", "cuda_runtime", "cuda_driver"]))
        by_file = host_side.group_by("_f").agg(pl.col("pid").drop_nulls().unique())
        pids = {index: set(values) for index, values in by_file.iter_rows()}
    for f in files:
        host = _meta_host(f.outcome.meta)
        if host is None:
            host = host_from_filename(PurePosixPath(f.rel_path).name, pids.get(f.index, set()))
        f.host = short_host(host)


def _meta_host(meta: dict) -> str | None:
    return next((str(meta[k]) for k in _HOST_KEYS if isinstance(meta.get(k), str) and meta[k]), None)


def _ident(files: list[_File]) -> dict[str, pl.Series]:
    """Per file index: the rank, host and source its rows are stamped with."""
    return {
        "rank": pl.Series([f.rank for f in files], dtype=pl.Int32),
        "host": pl.Series([f.host for f in files], dtype=pl.String),
        "source": pl.Series([f.rel_path for f in files], dtype=pl.String),
    }


def _stamp(name: str, df: pl.DataFrame | None, ident: dict[str, pl.Series]) -> tuple[pl.DataFrame, dict[int, int]]:
    """The frame with each row's rank, host and source (from its file), and its rows per file."""
    if df is None or df.height == 0:
        return fr.empty(name), {}
    index = df.get_column("_f")
    if len(ident["rank"]) == 1:  # one file: its values broadcast, no per-row gather
        stamps: list[pl.Expr | pl.Series] = [pl.lit(values[0], dtype=values.dtype).alias(col) for col,
                                             values in ident.items()]
        counts = {0: df.height}
    else:
        stamps = [values.gather(index).alias(col) for col, values in ident.items()]
        counts = dict(index.value_counts().iter_rows())
    return fr.conform(name, df.with_columns(stamps).drop("_f")), counts


def _map_unique(series: pl.Series, fn: Callable[[Any], Any], dtype: pl.DataType | type[pl.DataType]) -> pl.Series:
    """Apply a Python function once per distinct value (names repeat thousands of times); null stays null.

    A join in which every row finds its value (null included): ``replace_strict``, or a join that
    leaves rows unmatched, gave each null row of a list column a copy of a list (measured: 590 MB
    for the 151k kernels of a 1,024-rank job, of which 3k carry a 1,024-rank list; 13 MB so)."""
    uniq = series.unique()
    values = [None if u is None else fn(u) for u in uniq.to_list()]
    table = pl.DataFrame([uniq.rename("_k"), pl.Series("_v", values, dtype=dtype)])
    joined = series.rename("_k").to_frame().join(table, on="_k", how="left", maintain_order="left", nulls_equal=True)
    return joined.get_column("_v").rename(series.name)


def _bytes_expr() -> pl.Expr:
    size = pl.col("dtype").str.to_lowercase().str.strip_prefix("c10::").replace_strict(
        DTYPE_BYTES, default=None, return_dtype=pl.Int64
    )
    return (pl.max_horizontal("in_nelems", "out_nelems") * size).alias("bytes")


def _pg_ids(df: pl.DataFrame, table: pl.Series) -> pl.Series:
    """The id of each row's member list; the lists themselves go to ``process_groups``."""
    return table.gather(df.get_column("pg_ranks_raw")).alias("pg_id")


def _kernels(gpu: pl.DataFrame | None, pg_ids: pl.Series) -> pl.DataFrame | None:
    if gpu is None:
        return None
    is_comm = pl.col("name").str.contains(COMM_KERNEL_PATTERN)
    cls = (
        pl.when(pl.col("kind") == "kernel")
        .then(pl.when(is_comm).then(pl.lit("comm")).otherwise(pl.lit("compute")))
        .otherwise(pl.col("kind"))
    )
    df = gpu.with_columns(cls.alias("class"))
    comm_names = df.filter(pl.col("class") == "comm").get_column("name").unique().to_list()
    hints = {n: kernel_name_hints(n) for n in comm_names}
    name_col = df.get_column("name")
    df = df.with_columns(
        name_col.replace_strict({n: h[0] for n, h in hints.items()}, default=None,
                                return_dtype=pl.String).alias("name_coll"),
        name_col.replace_strict({n: h[1] for n, h in hints.items()}, default=None,
                                return_dtype=pl.String).alias("name_algo"),
        name_col.replace_strict({n: h[2] for n, h in hints.items()}, default=None,
                                return_dtype=pl.String).alias("name_proto"),
        _map_unique(df.get_column("coll_raw"), normalise_collective, pl.String).alias("collective"),
        _pg_ids(df, pg_ids),
    )
    return df.with_columns(_bytes_expr()).drop("kind", "coll_raw")


def _cpu_ops(cpu: pl.DataFrame | None, kernels: pl.DataFrame | None, one_file: bool) -> pl.DataFrame | None:
    if cpu is None:
        return None
    # A runtime call launched GPU work when a kernel of its own file carries its correlation id.
    if kernels is None:
        on_gpu = pl.lit(False)
    elif one_file:  # a plain membership test: the join below costs memory on a big trace
        on_gpu = pl.col("correlation").is_in(kernels.get_column("correlation").drop_nulls().unique().implode())
    else:  # joined on the key columns only: the other columns of ``cpu`` are shared, not copied
        flag = kernels.select("_f", "correlation").drop_nulls().unique().with_columns(pl.lit(True).alias("_gpu"))
        keys = cpu.select("_f", "correlation").join(flag, on=["_f", "correlation"], how="left", maintain_order="left")
        on_gpu = pl.lit(keys.get_column("_gpu").fill_null(False))
    runtime = pl.col("category").is_in(["cuda_runtime", "cuda_driver"])
    launch = runtime & (on_gpu | pl.col("name").str.contains(_LAUNCH_PATTERN))
    return cpu.with_columns(launch.fill_null(False).alias("is_launch"))


def _graph_replays(kernels: pl.DataFrame | None, cpu_ops: pl.DataFrame | None) -> pl.DataFrame | None:
    """``graph_replay``: the kernel's correlation id is that of a graph launch call of its file (one launch,
    hundreds of kernels), or the profiler recorded a graph id for it."""
    if kernels is None:
        return None
    with_id = pl.col("graph_id").is_not_null()
    if cpu_ops is None:
        return kernels.with_columns(with_id.alias("graph_replay"))
    graph = (
        cpu_ops.filter(pl.col("category").is_in(["cuda_runtime", "cuda_driver"])
                       & pl.col("name").str.contains(GRAPH_LAUNCH_PATTERN) & pl.col("correlation").is_not_null())
        .select("_f", "correlation").unique().with_columns(pl.lit(True).alias("_graph"))
    )
    if graph.height == 0:
        return kernels.with_columns(with_id.alias("graph_replay"))
    k = kernels.join(graph, on=["_f", "correlation"], how="left", maintain_order="left")
    return k.with_columns((with_id | pl.col("_graph").fill_null(False)).alias("graph_replay")).drop("_graph")


def _fused_tp_copies(kernels: pl.DataFrame | None, cpu_ops: pl.DataFrame | None) -> pl.DataFrame | None:
    """Copies launched inside an async-TP fused op (:data:`FUSED_TP_OPS`, on the launching thread) are the op's
    communication: class ``comm``, the op's collective; comm kernels launched there (symmetric-memory barriers)
    take that collective when their name gives none. Nothing changes in a trace without those ops."""
    if kernels is None or cpu_ops is None:
        return kernels
    ops = cpu_ops.filter(pl.col("name").is_in(list(FUSED_TP_OPS)) & pl.col("category").is_in(["cpu_op",
                                                                                             "user_annotation"]))
    if ops.height == 0:
        return kernels
    thread = ["_f", "pid", "tid"]
    # ranges on a thread nest or follow each other: a launch is inside one iff the furthest end of those begun
    # before it lies after it
    ranges = ops.select(*thread, "start_ns", pl.col("name").replace_strict(FUSED_TP_OPS).alias("_fused_coll"),
                        pl.col("end_ns").cum_max().over(thread, order_by="start_ns").alias("_reach")).sort("start_ns")
    moved = kernels.filter(pl.col("class").is_in(["memcpy", "comm"])).select("_f", "correlation").unique()
    launches = (cpu_ops.filter(pl.col("is_launch")).join(moved, on=["_f", "correlation"], how="semi")
                .select(*thread, "correlation", pl.col("start_ns").alias("_ls")).sort("_ls"))
    hit = (launches.join_asof(ranges, left_on="_ls", right_on="start_ns", by=thread, strategy="backward",
                              check_sortedness=False)
           .filter(pl.col("_ls") < pl.col("_reach")).select("_f", "correlation", "_fused_coll")
           .unique(["_f", "correlation"]))
    k = kernels.join(hit, on=["_f", "correlation"], how="left", maintain_order="left")
    fused = pl.col("_fused_coll").is_not_null()
    return k.with_columns(
        pl.when(fused & (pl.col("class") == "memcpy")).then(pl.lit("comm")).otherwise(pl.col("class")).alias("class"),
        pl.when(fused).then(pl.coalesce("name_coll", "_fused_coll")).otherwise(pl.col("name_coll")).alias("name_coll"),
    ).drop("_fused_coll")


def _comms(comm_raw: pl.DataFrame | None, cpu_ops: pl.DataFrame | None,
           kernels: pl.DataFrame | None, pg_ids: pl.Series) -> pl.DataFrame | None:
    """One row per host-side collective call, linked to the comm kernel it launched.

    A call is an outermost range among ``record_param_comms``, ``c10d::*`` and ``nccl:*``/``gloo:*``
    on one thread (``c10d::allreduce_`` > ``record_param_comms`` > ``nccl:all_reduce`` is one call).
    Its args come from the ``record_param_comms`` inside it; its collective from those args, else
    from the ``c10d::``/``nccl:`` op names (2023 traces carry no ``Collective name``), else from the
    name of the kernel it launched.
    """
    if comm_raw is None or cpu_ops is None or comm_raw.height == 0:
        return None
    is_rpc = pl.col("name") == "record_param_comms"
    df = (
        comm_raw.with_columns(
            pl.coalesce("pg_name", "pg_id").alias("pg_name"),
            pl.col("pid").fill_null(-1),
            pl.col("tid").fill_null(-1),
        )
        .drop("pg_id")
        .sort("_f", "pid", "tid", "start_ns", pl.col("end_ns"), descending=[False, False, False, False, True])
    )
    prev_end = pl.col("end_ns").cum_max().shift(1).over("_f", "pid", "tid")
    df = df.with_columns((prev_end.is_null() | (pl.col("start_ns") >= prev_end)).alias("_outer"))
    df = df.with_columns(pl.col("_outer").cast(pl.Int64).cum_sum().alias("_call"))
    first_rpc = lambda c: pl.col(c).filter(is_rpc).drop_nulls().first()  # noqa: E731
    arg_cols = ("external_id", "coll_raw", "in_nelems", "out_nelems", "dtype", "group_size", "pg_name",
                "pg_desc", "pg_ranks_raw", "seq", "src_rank", "dst_rank")
    calls = df.group_by("_call", maintain_order=True).agg(
        pl.col("_f").first(),
        pl.col("pid").first(),
        pl.col("tid").first(),
        pl.when(is_rpc.any()).then(pl.lit("record_param_comms")).otherwise(pl.col("name").first()).alias("name"),
        pl.col("start_ns").first(),
        pl.col("end_ns").first(),
        pl.col("external_id").filter(is_rpc).first().alias("_rpc_ext"),
        pl.col("external_id").first().alias("_outer_ext"),
        *[first_rpc(c) for c in arg_cols if c != "external_id"],
        pl.col("name").filter(pl.col("name").str.starts_with("nccl:")
                              | pl.col("name").str.starts_with("gloo:")).first().alias("_inner"),
        pl.col("name").filter(pl.col("name").str.starts_with("c10d::")).first().alias("_c10d"),
    )
    calls = calls.with_columns(
        pl.coalesce("_rpc_ext", "_outer_ext").alias("external_id"),
        pl.col("pid").replace(-1, None),
        pl.col("tid").replace(-1, None),
    ).drop("_rpc_ext", "_outer_ext")
    norm = lambda c: _map_unique(calls.get_column(c), normalise_collective, pl.String)  # noqa: E731
    calls = calls.with_columns(
        pl.coalesce(norm("coll_raw"), norm("_inner"), norm("_c10d")).alias("collective"),
        _pg_ids(calls, pg_ids),
    ).drop("coll_raw", "_inner", "_c10d")

    calls = calls.with_columns(pl.lit(None, dtype=pl.Int64).alias("kernel_correlation"))
    if kernels is not None:
        calls = _link_kernels(calls, cpu_ops, kernels.filter(pl.col("class") == "comm"))
    return calls.with_columns(_bytes_expr()).sort("_f", "start_ns", "_call").drop("_call")


def _link_kernels(calls: pl.DataFrame, cpu_ops: pl.DataFrame, comm_k: pl.DataFrame) -> pl.DataFrame:
    """The kernel each call launched: the first launch, on the same thread and inside the call, of
    a comm-class kernel of its file; failing that, a comm kernel carrying the call's External id."""
    if not comm_k.height:
        return calls
    launches = (
        cpu_ops.filter(pl.col("is_launch"))
        .join(comm_k.select("_f", "correlation").drop_nulls().unique(), on=["_f", "correlation"], how="semi")
        .select("_f", "pid", "tid", pl.col("start_ns").alias("_ls"), pl.col("correlation").alias("_lc"))
        .sort("_ls")
    )
    calls = calls.sort("start_ns").join_asof(
        launches, left_on="start_ns", right_on="_ls", by=["_f", "pid", "tid"], strategy="forward",
        check_sortedness=False
    )
    by_ext = (
        comm_k.filter(pl.col("external_id").is_not_null())
        .group_by("_f", "external_id")
        .agg(pl.col("correlation").sort_by("start_ns").first().alias("_ec"))
    )
    calls = calls.join(by_ext, on=["_f", "external_id"], how="left", maintain_order="left")
    calls = calls.with_columns(
        pl.coalesce(pl.when(pl.col("_ls") <= pl.col("end_ns")).then(pl.col("_lc")),
                    pl.col("_ec")).alias("kernel_correlation")
    ).drop("_ls", "_lc", "_ec")
    # Last resort for the collective: the name of the kernel the call launched (a hint).
    hint = comm_k.select("_f", pl.col("correlation").alias("kernel_correlation"), pl.col("name_coll")).unique(
        ["_f", "kernel_correlation"]
    )
    return calls.join(hint, on=["_f", "kernel_correlation"], how="left", maintain_order="left").with_columns(
        pl.coalesce("collective", "name_coll").alias("collective")
    ).drop("name_coll")


def _enrich_kernels(kernels: pl.DataFrame | None, comms: pl.DataFrame | None) -> pl.DataFrame | None:
    """Comm kernels without collective args take them from the host call that launched them."""
    if kernels is None:
        return None
    if comms is not None and comms.height:
        host = (
            comms.filter(pl.col("kernel_correlation").is_not_null())
            .unique(["_f", "kernel_correlation"], keep="first")
            .select(
                "_f",
                pl.col("kernel_correlation").alias("correlation"),
                pl.col("collective").alias("_h_collective"),
                *[pl.col(c).alias(f"_h_{c}") for c in _MSG_AND_PG],
            )
        )
        kernels = kernels.join(host, on=["_f", "correlation"], how="left", maintain_order="left")
        missing = pl.col("collective").is_null() & pl.col("in_nelems").is_null()
        kernels = kernels.with_columns(
            [pl.when(missing).then(pl.col(f"_h_{c}")).otherwise(pl.col(c)).alias(c) for c in ("collective",
                                                                                              *_MSG_AND_PG)]
        ).drop([f"_h_{c}" for c in ("collective", *_MSG_AND_PG)])
    return kernels.with_columns(
        pl.when(pl.col("class") == "comm").then(pl.coalesce("collective", "name_coll")).alias("collective")
    ).drop("name_coll")


def _steps(cpu_ops: pl.DataFrame | None) -> pl.DataFrame | None:
    if cpu_ops is None:
        return None
    return (
        cpu_ops.filter(pl.col("category").is_in(["user_annotation",
                                                 "cpu_op"]) & pl.col("name").str.contains(_STEP_PATTERN))
        .select(
            "_f",
            pl.col("name").str.extract(_STEP_PATTERN, 1).cast(pl.Int64).alias("step"),
            "start_ns",
            "end_ns",
        )
        .sort("_f", "start_ns")
    )


def _ranks(files: list[_File], kernels: pl.DataFrame | None, cpu_ops: pl.DataFrame | None) -> pl.DataFrame:
    """One row per file: its device (the most frequent of its kernels', the lowest on a tie), its
    training process (likewise among its step annotations, else among its host ops), metadata."""
    devices: dict[int, int | None] = {}
    if kernels is not None and kernels.height:
        devices = dict(kernels.group_by("_f").agg(_lowest_mode("device")).iter_rows())
    pids: dict[int, int | None] = {}
    if cpu_ops is not None and cpu_ops.height:
        is_step = pl.col("name").str.contains(_STEP_PATTERN)
        per_file = (
            cpu_ops.filter(pl.col("category").is_in(["cpu_op", "user_annotation"]))
            .group_by("_f")
            .agg(is_step.any().alias("_has_steps"), _lowest_mode("pid", is_step).alias("_ps"),
                 _lowest_mode("pid").alias("_ph"))
        )
        pids = {index: (ps if has_steps else ph) for index, has_steps, ps, ph in per_file.iter_rows()}
    rows = [_rank_row(f, devices.get(f.index), pids.get(f.index)) for f in files]
    return fr.conform("ranks", pl.DataFrame(rows, schema=fr.schema("ranks")))


def _lowest_mode(col: str, where: pl.Expr | None = None) -> pl.Expr:
    values = pl.col(col) if where is None else pl.col(col).filter(where)
    return values.drop_nulls().mode().min().alias(col)


def _rank_row(f: _File, device: int | None, pid: int | None) -> dict[str, Any]:
    meta, dist = f.outcome.meta, f.dist
    props = [p for p in meta.get("deviceProperties") or [] if isinstance(p, dict)]
    prop = None
    if device is not None:
        prop = next((p for p in props if p.get("id") == device), None)
        if prop is None and len(props) == 1:
            prop = props[0]
    pg_config = dist.get("pg_config")
    pg_count = _int32(dist.get("pg_count"), "pg_count", f.past_int32)
    if pg_count is None:
        pg_count = len(pg_config) if isinstance(pg_config, list) else None
    nccl = dist.get("nccl_version")
    return {
        "rank": f.rank,
        "world_size": _int32(dist.get("world_size"), "world_size", f.past_int32),
        "host": f.host,
        "pid": pid,
        "device": device,
        "gpu_name": prop.get("name") if prop else None,
        "sm_count": _int32(prop.get("numSms"), "sm_count", f.past_int32) if prop else None,
        "nccl_version": str(nccl) if nccl is not None else None,
        "backend": dist.get("backend") if isinstance(dist.get("backend"), str) else None,
        "pg_count": pg_count,
        "versions": sorted(f"{k}={v}" for k, v in meta.items()
                           if k.endswith("_version") and isinstance(v, (str, int, float)) and not isinstance(v, bool)),
        "source": f.rel_path,
    }


def _named_groups(kernels: pl.DataFrame | None, comms: pl.DataFrame | None) -> pl.DataFrame | None:
    """Per file, each member list its kernels and collective calls name (``_f``, ``pg_name``, ``pg_desc``, ``pg_id``,
    ``pg_ranks_raw``: the code of its text), once per list, in the order of the rows."""
    cols = ["_f", "pg_name", "pg_desc", "pg_id", "pg_ranks_raw"]
    parts = [df.select(cols).filter(pl.col("pg_ranks_raw").is_not_null() & pl.col("pg_id").is_not_null())
             for df in (comms, kernels) if df is not None]
    if not parts:
        return None
    return pl.concat(parts).unique(["_f", "pg_id"], keep="first", maintain_order=True)


def _count_lists_past_int32(files: list[_File], frames: tuple[pl.DataFrame | None, ...], texts: list[str],
                            lists: _MemberLists) -> None:
    """Per file, the rows whose ``Process Group Ranks`` text names a rank past Int32 (their group read as unknown),
    for the source's message."""
    if not lists.past_int32:
        return
    damaged = [code for code, text in enumerate(texts) if lists.named(text)[0] in lists.past_int32]
    for df in frames:
        if df is None:
            continue
        per_file = df.filter(pl.col("pg_ranks_raw").is_in(damaged)).group_by("_f").len()
        for index, n in per_file.iter_rows():
            files[index].past_int32["pg_ranks"] += n


class _MemberLists:
    """The distinct member lists of a unit's process groups, each parsed, hashed (``fr.pg_id``) and stored once:
    every trace of a job declares the same groups, and a list has as many numbers as the group has ranks, so
    converting it per trace made the parse's time per rank grow with the world size."""

    def __init__(self) -> None:
        self.values: list[list[int] | None] = []
        self.past_int32: set[int] = set()  # indices of lists read as unknown for a member past Int32
        self._seen: dict[object, tuple[int, int | None]] = {}

    def _add(self, key: object, members: list[int] | None) -> tuple[int, int | None]:
        if members and (min(members) < INT32_MIN or max(members) > INT32_MAX):
            members = None  # a member past Int32 is damage: the list is unknown, as one that is not all ints
            self.past_int32.add(len(self.values))
        hit = self._seen[key] = (len(self.values), fr.pg_id(members))
        self.values.append(members)
        return hit

    def declared(self, ranks: object) -> tuple[int | None, int | None]:
        """(index in ``values``, pg_id) of a ``pg_config`` entry's ``ranks``: a list of ints, else unknown.
        Keyed by the list as 64-bit integers, which ``array`` takes exactly when every item is an int (or a
        bool, as ``int`` reads it); anything else is not a member list, as before."""
        if not isinstance(ranks, list):
            return None, None
        try:
            key = array("q", ranks).tobytes()
        except TypeError:  # not all ints
            return None, None
        except OverflowError:  # an int past 64 bits: kept as written, as before (not worth a cache entry)
            return self._add(object(), [int(r) for r in ranks])
        return self._seen.get(key) or self._add(key, [int(r) for r in ranks])

    def named(self, raw: str) -> tuple[int, int | None]:
        """(index in ``values``, pg_id) of a ``Process Group Ranks`` text as the collectives write it."""
        hit = self._seen.get(raw)
        if hit is None:
            ranks = parse_rank_list(raw)
            hit = self._add(raw, list(ranks) if ranks is not None else None)
        return hit

    def column(self, index: pl.Series) -> pl.Series:
        """``pg_ranks`` of rows whose member list is ``index`` (null: unknown)."""
        return pl.Series("pg_ranks", self.values, dtype=pl.List(pl.Int32)).gather(index)


def _process_groups(files: list[_File], named: pl.DataFrame | None, texts: list[str], lists: _MemberLists
                    ) -> pl.DataFrame:
    """Each file's declared groups, then the member lists its collectives name that it does not declare
    (``texts``: the unit's rank-list texts by code; ``lists``: where they were already parsed)."""
    rows = [row for f in files for row in _declared_groups(f, lists)]
    declared = {(row["_f"], row["pg_id"]) for row in rows}
    by_index = {f.index: f for f in files}
    for index, name, desc, pid, code in named.iter_rows() if named is not None else ():
        if (index, pid) in declared:
            continue
        at, _ = lists.named(texts[code])
        members = lists.values[at]
        f = by_index[index]
        if at in lists.past_int32:
            f.past_int32["pg_ranks"] += 1
        rows.append({"_f": index, "rank": f.rank, "pg_name": name, "pg_desc": desc, "backend_config": None,
                     "pg_size": len(members) if members is not None else None, "pg_ranks": at, "pg_id": pid,
                     "declared": False, "source": f.rel_path})
    if not rows:
        return fr.empty("process_groups")
    rows.sort(key=lambda row: row["_f"])  # a file's rows together, declared first (a stable sort)
    for row in rows:
        del row["_f"]
    target = fr.schema("process_groups")
    schema = {col: (pl.UInt32 if col == "pg_ranks" else dtype) for col, dtype in target.items()}
    df = pl.DataFrame(rows, schema=schema)
    return fr.conform("process_groups", df.with_columns(lists.column(df.get_column("pg_ranks"))))


def _declared_groups(f: _File, lists: _MemberLists) -> list[dict[str, Any]]:
    rows = []
    for pg in f.dist.get("pg_config") or []:
        if not isinstance(pg, dict):
            continue
        at, pid = lists.declared(pg.get("ranks"))
        if at in lists.past_int32:
            f.past_int32["pg_ranks"] += 1
        rows.append(
            {
                "_f": f.index,
                "rank": f.rank,
                "pg_name": str(pg["pg_name"]) if pg.get("pg_name") is not None else None,
                "pg_desc": pg.get("pg_desc") if isinstance(pg.get("pg_desc"), str) else None,
                "backend_config": pg.get("backend_config") if isinstance(pg.get("backend_config"), str) else None,
                "pg_size": _int32(pg.get("pg_size"), "pg_size", f.past_int32),
                "pg_ranks": at,  # the index of the list: the lists are gathered once the rows are a frame
                "pg_id": pid,
                "declared": True,
                "source": f.rel_path,
            }
        )
    return rows
