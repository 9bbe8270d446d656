"""Where the step time goes: every GPU kernel in an op category, per rank and step, and the CPU op that launched it.

Categories (:data:`CATEGORIES`): ``gemm``, ``attention`` (flash / SDPA / fused multi-head), ``normalization``,
``elementwise`` (PyTorch's elementwise and reduction kernels, Triton pointwise and reduction kernels,
activations, softmax, copies; convolutions count as ``gemm``: cuDNN runs them as implicit GEMMs), ``embedding``,
``optimizer`` (fused and foreach optimizer steps), ``memcpy``/``memset``, ``nccl:<PG type>`` (DP, TP, PP, EP, CP,
default, from the matched collectives), ``other``, and ``idle`` (no kernel at all, from the step breakdown).

A kernel is put in the first category whose pattern (:data:`KERNEL_RULES`, matched case-insensitively on the
kernel name as recorded, mangled or not) it matches, so the order of the rules matters: attention before GEMM
(fused attention kernels are GEMMs inside), normalization before elementwise. Kernel times are cut to the step
windows of :attr:`JobContext.step_windows`, so they add up per step with the breakdown's windows; they are summed
per category (two streams running at once both count), while ``idle`` is the breakdown's time with no kernel.

The launching CPU op is the ``cpu_op`` whose Kineto ``External id`` the kernel carries (the innermost operator
around the launch); without External ids (Nsight Systems), the innermost op or NVTX range open on the launching
thread when the launch call began (:func:`launch_ops`); else null.
"""

from __future__ import annotations

from typing import Any

import polars as pl

from forensics.base.frames import JobFrames
from forensics.base.intervals import clip_to_disjoint_windows

KERNEL_RULES: tuple[tuple[str, str], ...] = (
    ("attention", r"flash|fmha|attention|attn|sdpa|scaled_dot_product|mha_|xformers"),
    ("normalization", r"layer_?norm|rms_?norm|batch_?norm|group_?norm|instance_?norm|\bbn_|cudnn::bn"),
    ("embedding", r"embedding|embag|indexselect|index_select"),
    ("optimizer", r"(^|[^h])adam|\bsgd|\blamb(stage|_)|adagrad|multi_tensor_apply|fused_optim|_foreach"),
    ("gemm", r"gemm|gemv|cublas|cutlass(::gemm|::kernel|_)|xmma|nvjet|wgmma|matmul|cijk_|tensorop|convolve|convolution|conv[123]d|"
             r"_conv_|scudnn|dgrad|wgrad|winograd|\bbmm_|triton_tem_|[sh](884|1688|16816)"),
    ("elementwise", r"elementwise|reduce_kernel|softmax|gelu|relu|silu|swiglu|sigmoid|tanh|dropout|copy|"
                    r"catarray|fill|cast|transpose|quant|rotary|pool|nchwtonhwc|nhwctonchw|gather|scatter|"
                    r"triton_(poi|red|per)_"),
)
"""(category, regex) pairs, first match wins. Compute kernels that match none are ``other``."""

CATEGORIES = (
    "gemm", "attention", "normalization", "elementwise", "embedding", "optimizer", "memcpy", "memset",
    "nccl:DP", "nccl:TP", "nccl:PP", "nccl:EP", "nccl:CP", "nccl:default", "other", "idle",
)

_SCHEMA = {"rank": pl.Int32, "host": pl.String, "step": pl.Int64, "category": pl.String, "kernels": pl.UInt32,
           "time_ns": pl.Int64}


def category_expr(name: pl.Expr) -> pl.Expr:
    """The compute category of a kernel by its name (see :data:`KERNEL_RULES`)."""
    low = name.str.to_lowercase()
    expr: Any = pl.when(low.str.contains(KERNEL_RULES[0][1])).then(pl.lit(KERNEL_RULES[0][0]))
    for cat, pattern in KERNEL_RULES[1:]:
        expr = expr.when(low.str.contains(pattern)).then(pl.lit(cat))
    return expr.otherwise(pl.lit("other"))


def categorized_kernels(frames: JobFrames, comm_pg: pl.DataFrame) -> pl.DataFrame:
    """Every ranked kernel with ``category``, all the kernels frame's columns but ``pg_ranks``; ``comm_pg`` (rank,
    start_ns, end_ns, pg_type) gives NCCL kernels their process-group type (the matched collectives' kernels)."""
    # CUDA sync events (nsys) are waits recorded on the GPU rows, not work: no category. The rank lists are
    # dropped first: every filter and join copies a list column's values, and a group's rank list on each NCCL
    # kernel row is the square of the ranks (about 1 GB per copy at 4,096 ranks); process_groups has them
    k = frames["kernels"].drop("pg_ranks").filter(pl.col("rank").is_not_null() & (pl.col("class") != "sync"))
    pg = comm_pg.select("rank", "start_ns", "end_ns", "pg_type").unique(["rank", "start_ns", "end_ns"])
    k = k.join(pg, on=["rank", "start_ns", "end_ns"], how="left")
    cls = pl.col("class").cast(pl.String)
    # the rules' regexes run once per distinct name (hundreds), not once per kernel (millions on big jobs)
    names = k.select(pl.col("name").unique().drop_nulls()).with_columns(category_expr(pl.col("name")).alias("_c"))
    by_name = pl.col("name").replace_strict(names["name"], names["_c"], default="other", return_dtype=pl.String)
    return k.with_columns(
        pl.when(cls == "comm").then(pl.lit("nccl:") + pl.col("pg_type").fill_null("default"))
        .when(cls.is_in(["memcpy", "memset"])).then(cls)
        .otherwise(by_name)
        .alias("category")
    )


def category_breakdown(kernels: pl.DataFrame, windows: pl.DataFrame, steps: pl.DataFrame) -> pl.DataFrame:
    """Per rank, step and category: ``kernels`` (count) and ``time_ns`` (kernel time inside the step window),
    plus one ``idle`` row per step from the breakdown ``steps`` frame. Sorted by rank, step, category order."""
    if windows.height == 0:
        return pl.DataFrame(schema=_SCHEMA)
    cut = clip_to_disjoint_windows(  # step windows are disjoint: linear in kernels however many steps
        kernels.select("rank", "category", "start_ns", "end_ns").lazy(),
        windows.select("rank", "host", "step", "w_start", "w_end"),
        on=["rank"],
    )
    busy = (
        cut.group_by("rank", "host", "step", "category")
        .agg(pl.len().cast(pl.UInt32).alias("kernels"), (pl.col("end_ns") - pl.col("start_ns")).sum().alias("time_ns"))
        .collect()
    )
    idle = steps.select(
        "rank", "host", "step", pl.lit("idle").alias("category"), pl.lit(0, pl.UInt32).alias("kernels"),
        pl.col("idle_ns").cast(pl.Int64).alias("time_ns"),
    )
    order = {c: i for i, c in enumerate(CATEGORIES)}
    both = pl.concat([busy.cast(_SCHEMA), idle.cast(_SCHEMA)])  # type: ignore[arg-type]
    return both.with_columns(pl.col("category").replace_strict(order, default=len(order)).alias("_o")).sort(
        "rank", "step", "_o"
    ).drop("_o")


def op_attribution(kernels: pl.DataFrame, frames: JobFrames) -> pl.DataFrame:
    """Per rank, category and launching CPU op: kernels, total kernel time (ns) and the distinct kernel names
    (up to 3); op is null where the trace links kernels to no op. Largest time first."""
    ops = (
        frames["cpu_ops"].select("rank", "category", "external_id", "name")
        .filter((pl.col("category") == "cpu_op") & pl.col("external_id").is_not_null())
        .group_by("rank", "external_id")
        .agg(pl.col("name").first().alias("_ext_op"))
    )
    # only the columns used: every join copies each column it carries (millions of kernel rows on big jobs)
    k = kernels.select("rank", "category", "external_id", "correlation", "name", "start_ns", "end_ns").join(
        ops, on=["rank", "external_id"], how="left")
    # the launch-time lookup only for the kernels no External id links (none, in most Kineto traces)
    unlinked = k.filter(pl.col("_ext_op").is_null()).select("rank", "correlation").unique()
    k = k.join(launch_ops(frames, unlinked), on=["rank", "correlation"], how="left")
    k = k.with_columns(pl.coalesce("_ext_op", "_launch_op").alias("op"))
    return (
        k.group_by("rank", "category", "op")
        .agg(
            pl.len().cast(pl.UInt32).alias("kernels"),
            (pl.col("end_ns") - pl.col("start_ns")).sum().alias("time_ns"),
            pl.col("name").unique(maintain_order=True).head(3).alias("kernel_names"),
        )
        .sort(["time_ns", "rank", "category", "op"], descending=[True, False, False, False], nulls_last=True)
    )


_NVTX_SUFFIX = r",\s*(op_id|seq|sizes|stream)\s*=.*$"


def launch_ops(frames: JobFrames, only: pl.DataFrame | None = None) -> pl.DataFrame:
    """Per (rank, correlation) of a launch call (of those in ``only``, when given): the innermost op or annotation
    range open on the launching thread when the launch began (the NVTX ranges PyTorch writes under Nsight Systems,
    ``aten::mm, op_id = N``, with the op id dropped). Traces that link by External id do not need it."""
    ops = frames["cpu_ops"].select("rank", "tid", "category", "is_launch", "correlation", "name", "start_ns", "end_ns")
    launches = ops.filter(pl.col("is_launch") & pl.col("correlation").is_not_null())
    if only is not None:
        launches = launches.join(only.select("rank", "correlation"), on=["rank", "correlation"], how="semi")
    launches = (
        launches.select("rank", "tid", "correlation", pl.col("start_ns").alias("_t"))
        .drop_nulls(["rank", "tid"])
        .sort("_t")
    )
    if launches.height == 0:
        return pl.DataFrame(schema={"rank": pl.Int32, "correlation": pl.Int64, "_launch_op": pl.String})
    ranges = (
        ops.filter(pl.col("category").is_in(["cpu_op", "user_annotation"]))
        .select("rank", "tid", pl.col("start_ns").alias("_rs"), pl.col("end_ns").alias("_re"),
                pl.col("name").str.replace(_NVTX_SUFFIX, "").alias("_launch_op"))
        .drop_nulls(["rank", "tid"])
        .sort("_rs")
    )
    if ranges.height == 0:
        return pl.DataFrame(schema={"rank": pl.Int32, "correlation": pl.Int64, "_launch_op": pl.String})
    j = launches.join_asof(ranges, left_on="_t", right_on="_rs", by=["rank", "tid"], strategy="backward",
                           check_sortedness=False)  # both sorted above; the check cannot run with by
    return (
        j.filter(pl.col("_re") >= pl.col("_t"))
        .group_by("rank", "correlation")
        .agg(pl.col("_launch_op").first())
    )
