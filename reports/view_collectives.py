"""Per-collective table: every matched collective instance with its skew, wait, transfer and bandwidth.

:func:`collectives_table` is also written as ``collectives.parquet`` beside the report (see
:data:`COLLECTIVES_SCHEMA` for its columns and units). Everything comes from ``JobContext.match`` (the
same matching the straggler and exposure detectors use) and ``JobContext.clock_offsets``:

* arrival = the start of the rank's NCCL kernel on the job's common clock (own clock minus the rank's
  offset); ``skew_ns`` = last arrival - first arrival;
* ``transfer_ns`` = the shortest kernel of the instance (the last to arrive waits for nobody), ``wait_*``
  = each member's kernel time beyond it;
* bus bandwidth, nccl-tests' convention: ``algbw = bytes / transfer``, ``busbw = algbw x factor``
  (allreduce ``2(n-1)/n``; allgather, reduce_scatter, alltoall ``(n-1)/n``; others 1);
* expected: NCCL's own predicted time for that size where a TUNING line printed one, else the cost model
  (:mod:`forensics.facts.nccl_cost`: NCCL's choice for ``n_ranks`` ranks on ``n_hosts`` nodes of the job's GPU
  generation, with the model's default channel graph); null when the GPU generation is unknown or the
  operation is not modelled.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import polars as pl
from forensics.reports.figures import Figure
from forensics.reports.labels import esc
from forensics.reports.view import View, layout

from forensics.facts import nccl_cost as nc

if TYPE_CHECKING:
    from forensics.facts.context import JobContext
    from forensics.pipeline import Analysis

TOP_N = 50
_COLL = {"allreduce": "AllReduce", "allgather": "AllGather", "reduce_scatter": "ReduceScatter",
         "broadcast": "Broadcast", "reduce": "Reduce"}
COLLECTIVES_SCHEMA: dict[str, tuple[pl.DataType, str]] = {
    "instance": (pl.Int64(), "instance number (JobContext.match.instances)"),
    "communicator": (pl.String(), "process group name"),
    "pg_type": (pl.String(), "DP / TP / PP / EP / CP / default"),
    "pg_ranks": (pl.String(), "the group's global ranks, comma separated ('*' when unknown)"),
    "seq": (pl.Int64(), "NCCL/PyTorch sequence number in the group; null when the trace has none"),
    "step": (pl.Int64(), "profiler step (-1: whole trace)"),
    "op": (pl.String(), "collective: allreduce, allgather, reduce_scatter, ..."),
    "bytes": (pl.Int64(), "message size, bytes (nccl-tests size convention)"),
    "n_ranks": (pl.Int64(), "members"),
    "n_hosts": (pl.Int64(), "hosts of the members"),
    "algo": (pl.String(), "algorithm NCCL logged for this op and size (TUNING line); null when not logged"),
    "proto": (pl.String(), "protocol NCCL logged for this op and size; null when not logged"),
    "first_arrival_ns": (pl.Int64(), "earliest kernel start, common clock, ns"),
    "skew_ns": (pl.Int64(), "arrival skew: last - first kernel start on the common clock, ns"),
    "last_rank": (pl.Int32(), "last-arriving rank (the one that waited least)"),
    "last_margin_ns": (pl.Int64(), "how much later it arrived than the next one (duration difference), ns"),
    "transfer_ns": (pl.Int64(), "transfer time (shortest member kernel), ns"),
    "wait_max_ns": (pl.Int64(), "longest wait of a member, ns"),
    "wait_sum_ns": (pl.Int64(), "GPU time all members spent waiting, ns"),
    "busbw_gbps": (pl.Float64(), "achieved bus bandwidth, GB/s (1e9 B/s)"),
    "expected_busbw_gbps": (pl.Float64(), "bus bandwidth NCCL's prediction or the cost model expects, GB/s"),
    "busbw_ratio": (pl.Float64(), "busbw_gbps / expected_busbw_gbps"),
    "expected_by": (pl.String(), "NCCL TUNING line / cost model; null when no expectation"),
}
CAPTION = ("A large skew with the same last rank again and again is a straggler; a busbw far below the expected "
           "one with no skew is a slow link or a bad algorithm choice.")


def bus_factor(op: pl.Expr, n: pl.Expr) -> pl.Expr:
    """nccl-tests' bus-bandwidth factor for an operation on ``n`` ranks."""
    nf = n.cast(pl.Float64)
    return (pl.when(op == "allreduce").then(2 * (nf - 1) / nf)
            .when(op.is_in(["allgather", "reduce_scatter", "alltoall"])).then((nf - 1) / nf)
            .otherwise(1.0))


def _per_instance(ctx: JobContext) -> pl.DataFrame:
    k = ctx.match.kernels.filter(pl.col("matched"))
    off = ctx.clock_offsets.by_rank.select(pl.col("rank").cast(pl.Int32), pl.col("offset_ns").alias("_off"))
    arrive = pl.col("start_ns") - pl.col("_off").fill_null(0)
    return k.with_columns(pl.col("rank").cast(pl.Int32)).join(off, on="rank", how="left").group_by("instance").agg(
        arrive.min().alias("first_arrival_ns"), (arrive.max() - arrive.min()).alias("skew_ns"),
        pl.col("wait_ns").max().alias("wait_max_ns"), pl.col("wait_ns").sum().alias("wait_sum_ns"),
        pl.col("host").n_unique().cast(pl.Int64).alias("n_hosts"), pl.col("pg_name").first().alias("communicator"),
    )


def _logged_choice(ctx: JobContext) -> pl.DataFrame:
    """op, bytes, algo, proto, predicted_us from NCCL TUNING lines (one value per op and size; 'mixed' when
    the ranks logged different ones)."""
    t = ctx.frames["nccl_calls"].filter((pl.col("kind") == "tuning") & pl.col("bytes").is_not_null())
    op = pl.col("op").fill_null("AllReduce").str.to_lowercase().replace({"reducescatter": "reduce_scatter"})

    def one(c: str) -> pl.Expr:
        values = pl.col(c).drop_nulls()
        return pl.when(values.n_unique() > 1).then(pl.lit("mixed")).otherwise(values.first())

    return t.with_columns(op.alias("op")).group_by("op", "bytes").agg(
        one("algo").alias("algo"), one("proto").alias("proto"), pl.col("predicted_us").median())


def _arch(ctx: JobContext) -> str | None:
    names = set(ctx.frames["ranks"]["gpu_name"].drop_nulls().to_list())
    names |= set(ctx.frames["nccl_comms"]["gpu_name"].drop_nulls().to_list())
    archs = [a for n in names if (a := nc.arch_from_gpu_name(n))]
    return min(archs, key=lambda a: nc.ARCH_INDEX[a]) if archs else None


def _model_us(arch: str | None, op: str, nbytes: int | None, n: int, nodes: int, algo: str | None,
              proto: str | None) -> float | None:
    """The cost model's time (µs) for NCCL's choice, or for the logged (algo, proto) when it models them."""
    coll = _COLL.get(op)
    if arch is None or coll is None or not nbytes or n < 2:
        return None
    c = nc.Comm(nranks=n, nnodes=max(1, nodes), arch=arch)
    try:
        if algo in nc.ALGOS and proto in nc.PROTOS:
            t = nc.predict(c, coll, str(algo), str(proto), int(nbytes))
            if math.isfinite(t):
                return t
        return nc.choose(c, coll, int(nbytes))[2]
    except ValueError:
        return None


def _expected(ctx: JobContext, df: pl.DataFrame) -> pl.DataFrame:
    arch = _arch(ctx)
    keys = df.select("op", "bytes", "n_ranks", "n_hosts", "algo", "proto").unique()
    model = [_model_us(arch, *row) for row in keys.iter_rows()]
    keys = keys.with_columns(pl.Series("_model_us", model, dtype=pl.Float64))
    df = df.join(keys, on=["op", "bytes", "n_ranks", "n_hosts", "algo", "proto"], how="left", nulls_equal=True)
    exp_us = pl.coalesce("predicted_us", "_model_us")
    exp_bw = pl.col("bytes").cast(pl.Float64) / (exp_us * 1e3) * bus_factor(pl.col("op"), pl.col("n_ranks"))
    return df.with_columns(
        exp_bw.alias("expected_busbw_gbps"),
        pl.when(pl.col("predicted_us").is_not_null()).then(pl.lit("NCCL TUNING line"))
        .when(pl.col("_model_us").is_not_null()).then(pl.lit("cost model")).alias("expected_by"),
    ).with_columns((pl.col("busbw_gbps") / pl.col("expected_busbw_gbps")).alias("busbw_ratio"))


def collectives_table(ctx: JobContext) -> pl.DataFrame:
    """One row per matched collective instance, columns and units as :data:`COLLECTIVES_SCHEMA`."""
    schema = {c: t for c, (t, _) in COLLECTIVES_SCHEMA.items()}
    inst = ctx.match.instances
    if inst.height == 0:
        return pl.DataFrame(schema=schema)
    df = inst.join(_per_instance(ctx), on="instance", how="left").with_columns(
        pl.col("instance_key").str.extract(r"#s(-?\d+)$").cast(pl.Int64).alias("seq"),
        pl.col("pg_key").str.split_exact("|", 1).struct.field("field_1").alias("pg_ranks"),
        pl.col("collective").alias("op"), pl.col("n_ranks").cast(pl.Int64),
        (pl.col("bytes").cast(pl.Float64) / pl.col("transfer_ns").cast(pl.Float64)
         * bus_factor(pl.col("collective"), pl.col("n_ranks"))).alias("busbw_gbps"),
        pl.col("margin_ns").alias("last_margin_ns"),
    ).join(_logged_choice(ctx), on=["op", "bytes"], how="left")
    df = _expected(ctx, df)
    return df.select([pl.col(c).cast(t) for c, t in schema.items()]).sort("instance")


COLLECTIVES_ABOUT = ("one row per NCCL collective instance matched across its ranks; "
                     "times in ns on the job's common clock, bandwidth in GB/s")


def collectives_parquet_metadata() -> dict[str, str]:
    """The key-value metadata of ``collectives.parquet`` (written by Polars with :func:`collectives_table`): what
    the file is (``forensics``) and each column's unit and meaning (``forensics.doc.<column>``). pyarrow could
    carry the meanings as field metadata, but it would add 0.1 s and about 40 MB (mostly its libraries' code) to
    the end of every run, where the peak of a big trace's analysis is."""
    return {"forensics": COLLECTIVES_ABOUT, **{f"forensics.doc.{c}": doc for c, (_, doc) in COLLECTIVES_SCHEMA.items()}}


def schema_markdown() -> str:
    """The text of docs/collectives.md (a test checks it is current)."""
    lines = ["# collectives.parquet", "",
             "Written by `forensics analyze` beside the report: one row per NCCL collective instance matched across",
             "its ranks (`JobContext.match`). Generated from `forensics/reports/view_collectives.py`",
             "(`COLLECTIVES_SCHEMA`). The file's key-value metadata says what it is (`forensics`) and carries each",
             "column's meaning as `forensics.doc.<column>` (`polars.read_parquet_metadata`, "
             "`pyarrow.parquet.read_metadata`).",
             "",
             "| column | dtype | meaning (unit) |", "|---|---|---|"]
    lines += [f"| `{c}` | {t} | {doc} |" for c, (t, doc) in COLLECTIVES_SCHEMA.items()]
    return "\n".join(lines) + "\n" + TP_NOTE


TP_NOTE = """
## Tensor-parallel communication outside NCCL

TransformerEngine's userbuffers kernels and PyTorch's symmetric-memory kernels (async TP) carry no process group:
both are tensor-parallel features, so their process-group type is `TP`. They are never matched into instances
(they run fused with, or beside, the GEMMs they feed, with no NCCL sequence to pair them by): the whole kernel counts
as transfer (`transfer_how` = `unknown`, `fused` true), so the breakdown's `overlap_TP_ns` is what the overlap hides
and `exposed_TP_ns` only the part no compute kernel covers.

PyTorch's async TP moves most of its data with the copy engine, not with kernels. `symm_mem::fused_all_gather_matmul`
and `symm_mem::fused_matmul_reduce_scatter` (with their scaled variants; `cuda_p2p::` in PyTorch 2.4, whose inductor
pass `torch/_inductor/fx_passes/micro_pipeline_tp.py` puts them in place of an all-gather before, or a reduce-scatter
after, a matmul) open a `record_function` range of the bare op name, and their micro-pipelined implementations
(`_pipelined_all_gather_and_consume`, `_pipelined_produce_and_all2all` in `torch/distributed/_symmetric_memory/
__init__.py`) copy each peer's shard with `aten::copy_` from the peer's symmetric buffer, alternating between the
current stream and a backend stream, between `symm_mem.barrier()` launches (`barrier_kernel` in
`torch/csrc/distributed/c10d/symm_mem/CUDASymmetricMemory.cu`), while the chunk GEMMs run. In a Kineto trace each copy
is a `cudaMemcpyAsync` under the fused op's CPU range and a `gpu_memcpy` event (`Memcpy DtoD (Device -> Device)`,
or `Memcpy PtoP` where the profiler sees two devices). The Kineto parser makes every copy launched inside one of those
ranges (on the launching thread) a `comm` row of the op's collective (`allgather` / `reduce_scatter`; the barrier
kernels launched there take it too), so these copies are TP communication measured like the kernels above; copies
outside the fused ops stay `memcpy`. Nsight Systems exports hold no such CPU ranges (NVTX only when the profiler
emits it): there the copies stay `memcpy`. When most of the exposed TP time is such fused communication, the
exposed-communication finding says the overlap did not hide it (a warning), not that TP is exposed by design.
Not covered: NCCL's own copy-engine collectives (NCCL 2.28, `src/ce_coll.cc`, chosen for symmetric buffers above
`NCCL_SYM_CE_THRESHOLD`) also move data with copies, under the collective's host call, and so do symmetric memory's
`symm_mem::_low_contention_all_gather` / `_low_contention_reduce_scatter`, which inductor may put in place of any
collective (its group type is not in the trace); those copies stay `memcpy`. A peer copy into a strided chunk runs as
an SM copy kernel instead of a copy (the reduce-scatter along the last dimension); inside a fused op it cannot be told
from a local layout copy, and stays compute.
No public trace of these shapes was found: PyTorch's PR that added the scaled variant (pytorch/pytorch#129289) links
only a Meta-internal trace, and no trace holding `symm_mem::fused_*` ranges was found in public repositories, issues
or pages; the tests use a hand-written trace and the simulator's `async_tp` scenarios.
"""
"""The hand-written part of docs/collectives.md, after the generated table."""


def _display(df: pl.DataFrame) -> pl.DataFrame:
    us = [c for c in ("skew_ns", "last_margin_ns", "transfer_ns", "wait_max_ns") if c in df.columns]
    return df.select(
        "communicator", "pg_type", "seq", "step", "op", "bytes", "n_ranks", "algo", "proto",
        *[(pl.col(c) / 1e3).round(1).alias(c.replace("_ns", "_us")) for c in us],
        "last_rank", (pl.col("wait_sum_ns") / 1e6).round(3).alias("wait_sum_ms"),
        pl.col("busbw_gbps").round(2), pl.col("expected_busbw_gbps").round(2), pl.col("busbw_ratio").round(3),
        "expected_by",
    )


def _scatter(df: pl.DataFrame) -> Figure:
    fig = Figure()
    for op in sorted(df["op"].unique().to_list()):
        part = df.filter(pl.col("op") == op)
        fig.add_scatter(x=(part["skew_ns"] / 1e3).round(1).to_list(), y=part["busbw_gbps"].round(2).to_list(),
                        mode="markers", name=esc(op),
                        text=[f"seq {s} last r{r}" for s, r in zip(part["seq"], part["last_rank"])],
                        hovertemplate="%{text}<br>skew %{x} µs<br>%{y} GB/s<extra></extra>")
    return layout(fig, xaxis_title="arrival skew (µs)", yaxis_title="achieved busbw (GB/s)", height=360)


def collectives_view(analysis: Analysis) -> View:
    view = View("collectives", "Collectives: arrival skew, wait, transfer and bus bandwidth", CAPTION)
    df = collectives_table(analysis.context)
    if df.height == 0:
        view.empty_reason = "no NCCL collective matched across ranks (needs traces of every member of a group)"
        return view
    view.figures.append(_scatter(df.sort("wait_sum_ns", descending=True).head(2000)))
    worst = df.sort("wait_sum_ns", "instance", descending=[True, False]).head(TOP_N)
    view.tables.append((f"Top {min(TOP_N, df.height)} of {df.height} by GPU time spent waiting "
                        "(all rows in collectives.parquet)", _display(worst)))
    slow = df.filter(pl.col("busbw_ratio").is_not_null()).sort("busbw_ratio", "instance").head(TOP_N // 2)
    if slow.height:
        view.tables.append(("Lowest achieved / expected bus bandwidth", _display(slow)))
    return view
