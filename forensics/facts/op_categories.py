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

from forensics.base import frames as fr
from forensics.base.frames import JobFrames
from forensics.base.intervals import clip_to_disjoint_windows

KERNEL_RULES: tuple[tuple[str, str], ...] = (
    ("attention", r"flash|fmha|attention|attn|sdpa|scaled_dot_product|mha_|xformers"),
    ("normalization", r"layer_?norm|rms_?norm|batch_?norm|group_?norm|instance_?norm|\bbn_|cudnn::bn"),
    ("embedding", r"embedding|embag|indexselect|index_select"),
    ("optimizer", r"(^|[^h])adam|\bsgd|\blamb(stage|_)|adagrad|multi_tensor_apply|fused_optim|_foreach"),
    ("gemm",
     r"gemm|gemv|cublas|cutlass(::gemm|::kernel|_)|xmma|nvjet|wgmma|matmul|cijk_|tensorop|convolve|convolution|conv[123"
     r"]d|"
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

# a function, not a constant: importing this module runs no Polars code (`forensics rules`, frames.Dtype)
def _schema() -> dict[str, Any]:
    return {"rank": pl.Int32, "host": pl.String, "step": pl.Int64, "category": pl.String, "kernels": pl.UInt32,
            "time_ns": pl.Int64}


def category_expr(name: pl.Expr) -> pl.Expr:
    """The compute category of a kernel by its name (see :data:`KERNEL_RULES`)."""
    low = name.str.to_lowercase()
    expr: Any = pl.when(low.str.contains(KERNEL_RULES[0][1])).then(pl.lit(KERNEL_RULES[0][0]))
    for cat, pattern in KERNEL_RULES[1:]:
        expr = expr.when(low.str.contains(pattern)).then(pl.lit(cat))
    return expr.otherwise(pl.lit("other"))


def categorized_kernels(frames: JobFrames, comm_pg: pl.DataFrame) -> pl.DataFrame:
    """Every ranked kernel with ``category``, all the kernels frame's columns but ``pg_id``; ``comm_pg`` (rank,
    start_ns, end_ns, pg_type) gives NCCL kernels their process-group type (the matched collectives' kernels)."""
    # CUDA sync events (nsys) are waits recorded on the GPU rows, not work: no category. The member lists' ids
    # are dropped (the columns stay those of before they replaced the lists)
    # The result is held for the whole analysis: a filter or a join would copy every column of the kernels (200 MB
    # at 1,024 ranks), so the kernels are filtered only when some row goes, and only the keys are joined.
    k = frames["kernels"].drop("pg_id")
    keep = pl.col("rank").is_not_null() & (pl.col("class") != "sync")
    if not k.select(keep.fill_null(False).all()).item():
        k = k.filter(keep)
    pg = comm_pg.select("rank", "start_ns", "end_ns", "pg_type").unique(["rank", "start_ns", "end_ns"])
    keys = ["rank", "start_ns", "end_ns"]
    k = k.with_columns(k.select(keys).join(pg, on=keys, how="left", maintain_order="left").get_column("pg_type"))
    # The category of each distinct (class, name, group type), then gathered to the kernels: the rules' regexes run
    # once per distinct name (hundreds), not once per kernel (millions on big jobs), and a when/then over every
    # kernel built a String column with buffers of its own (150 MB at 1,024 ranks) where the gather shares the
    # small table's text.
    on = ["class", "name", "pg_type"]
    combos = k.select(on).unique()
    cls = pl.col("class").cast(pl.String)
    by_name = pl.when(pl.col("name").is_null()).then(pl.lit("other")).otherwise(
        category_expr(pl.col("name").cast(pl.String)))  # Categorical names
    combos = combos.with_columns(
        pl.when(cls == "comm").then(pl.lit("nccl:") + pl.col("pg_type").fill_null("default"))
        .when(cls.is_in(["memcpy", "memset"])).then(cls)
        .otherwise(by_name)
        .alias("category")
    )
    category = k.select(on).join(combos, on=on, how="left", maintain_order="left", nulls_equal=True)
    return k.with_columns(category.get_column("category"))


def category_breakdown(kernels: pl.DataFrame, windows: pl.DataFrame, steps: pl.DataFrame) -> pl.DataFrame:
    """Per rank, step and category: ``kernels`` (count) and ``time_ns`` (kernel time inside the step window),
    plus one ``idle`` row per step from the breakdown ``steps`` frame. Sorted by rank, step, category order."""
    if windows.height == 0:
        return pl.DataFrame(schema=_schema())
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
    both = pl.concat([busy.cast(_schema()), idle.cast(_schema())])  # type: ignore[arg-type]
    return both.with_columns(pl.col("category").replace_strict(order, default=len(order)).alias("_o")).sort(
        "rank", "step", "_o"
    ).drop("_o")


GRAPH_REPLAY_OP = "replayed from a CUDA graph"
"""The op of a graph-replayed kernel whose capture is not in the trace: the replay is one host call for
every kernel of the graph, so no op launched it (the op around the graph launch follows in brackets)."""

COMPILED_REGION = r"^(CompiledFunction|CompiledFunctionBackward|Torch-Compiled Region.*|## Call CompiledFxGraph .*)$"
"""torch.compile's regions on the host: AOTAutograd's forward / backward functions, dynamo's compiled frames,
inductor's call of its compiled graph."""

CAPTURE_BEGIN = r"^(cuda|hip)StreamBeginCapture"
CAPTURE_END = r"^(cuda|hip)StreamEndCapture"
LAUNCH_CALL = r"(?i)launch|memcpy|memset"
"""Runtime / driver calls that enqueue GPU work. Inside a stream capture they run nothing, so a source that marks
launches by the GPU activity they ran (Nsight Systems) does not mark them: captured launches are found by name."""


def op_attribution(kernels: pl.DataFrame, frames: JobFrames) -> pl.DataFrame:
    """Per rank, category, launching CPU op, how it was launched (``via``) and compiled region: kernels,
    total kernel time (ns) and the distinct kernel names (up to 3); op is null where the trace links kernels
    to no op. ``via``: ``launch`` (one host call, one kernel), ``graph capture`` (replayed from a CUDA graph
    whose capture is in the trace: the op that captured it), ``graph replay`` (replayed, capture not seen).
    Largest time first."""
    k = attributed_kernels(kernels, frames)
    return (
        k.group_by("rank", "category", "op", "via", "region")
        .agg(
            pl.len().cast(pl.UInt32).alias("kernels"),
            (pl.col("end_ns") - pl.col("start_ns")).sum().alias("time_ns"),
            pl.col("name").unique(maintain_order=True).head(3).cast(pl.String).alias("kernel_names"),
        )
        .select("rank", "category", "op", "kernels", "time_ns", "kernel_names", "via", "region")
        .sort(["time_ns", "rank", "category", "op"], descending=[True, False, False, False], nulls_last=True)
    )


def attributed_kernels(kernels: pl.DataFrame, frames: JobFrames) -> pl.DataFrame:
    """The categorized kernels (rank, category, correlation, name, start_ns, end_ns) with ``op``, ``via`` and
    ``region`` (see :func:`op_attribution`)."""
    ops = (
        frames["cpu_ops"].select("rank", "category", "external_id", "name")
        .filter((pl.col("category") == "cpu_op") & pl.col("external_id").is_not_null())
        .group_by("rank", "external_id")
        .agg(pl.col("name").first().cast(pl.String).alias("_ext_op"))
    )
    graph = pl.col("graph_replay").fill_null(False)
    # only the columns used: every join copies each column it carries (millions of kernel rows on big jobs)
    k = kernels.select("rank", "category", "external_id", "correlation", "name", "start_ns", "end_ns",
                       graph.alias("_graph"), "graph_node_id").join(ops, on=["rank", "external_id"], how="left")
    # the launch-time lookup only for the kernels no External id links (none, in most eager Kineto traces)
    unlinked = k.filter(pl.col("_ext_op").is_null() | pl.col("_graph")).select("rank", "correlation").unique()
    k = k.join(launch_ops(frames, unlinked), on=["rank", "correlation"], how="left")
    launched = pl.coalesce("_ext_op", "_launch_op")
    k = _with_capture_ops(k, frames)
    k = k.join(launch_ops(frames, k.select("rank", "correlation").unique(), COMPILED_REGION, "_region"),
               on=["rank", "correlation"], how="left")
    replay_op = pl.lit(GRAPH_REPLAY_OP) + pl.when(launched.is_not_null()).then(
        pl.lit(" (launched in ") + launched + pl.lit(")")).otherwise(pl.lit(""))
    return k.with_columns(
        pl.when(~pl.col("_graph")).then(launched).when(pl.col("_capture_op").is_not_null())
        .then(pl.col("_capture_op")).otherwise(replay_op).alias("op"),
        pl.when(~pl.col("_graph")).then(pl.lit("launch")).when(pl.col("_capture_op").is_not_null())
        .then(pl.lit("graph capture")).otherwise(pl.lit("graph replay")).alias("via"),
        pl.col("_region").str.strip_prefix("## Call ").str.strip_suffix(" ##").alias("region"),
    ).drop("_ext_op", "_launch_op", "_capture_op", "_region")


def _with_capture_ops(k: pl.DataFrame, frames: JobFrames) -> pl.DataFrame:
    """``_capture_op``: for a graph-replayed kernel whose graph was captured inside the trace, the op that
    launched it during the capture. The launches inside a capture (``cudaStreamBeginCapture`` ..
    ``cudaStreamEndCapture`` on one thread) run nothing, so no GPU activity carries their correlation
    ids; the i-th of them is the graph's i-th node. A replay takes the latest capture before it, on its
    rank, with as many launches as the replay ran kernels; its kernels are put in node order (the graph node
    id where recorded, else start time). Without such a capture: null."""
    none = k.with_columns(pl.lit(None, dtype=pl.String).alias("_capture_op"))
    if not k["_graph"].any():
        return none
    captured = captured_launches(frames)
    if captured.height == 0:
        return none
    replays = (
        k.filter(pl.col("_graph")).select("rank", "correlation", "graph_node_id", "start_ns")
        .sort("rank", "correlation", "graph_node_id", "start_ns", nulls_last=True)
        .with_columns(pl.int_range(pl.len()).over("rank", "correlation").alias("_node"),
                      pl.len().over("rank", "correlation").alias("_n"))
    )
    launch_t = launch_times_of(frames, replays.select("rank", "correlation").unique())
    per_replay = replays.select("rank", "correlation", "_n").unique().join(launch_t, on=["rank", "correlation"])
    caps = captured.select("rank", "_cap", "_cap_end", "_n").unique()
    pick = (
        per_replay.join(caps, on=["rank", "_n"], how="inner").filter(pl.col("_cap_end") <= pl.col("_t"))
        .sort("_cap_end").group_by("rank", "correlation").agg(pl.col("_cap").last())
    )
    node_ops = (
        replays.join(pick, on=["rank", "correlation"], how="inner")
        .join(captured.select("rank", "_cap", "_node", "_capture_op"), on=["rank", "_cap", "_node"], how="inner")
        .select("rank", "correlation", "start_ns", "graph_node_id", "_capture_op")
    )
    return k.join(node_ops.unique(["rank", "correlation", "start_ns", "graph_node_id"], keep="first"),
                  on=["rank", "correlation", "start_ns", "graph_node_id"], how="left", nulls_equal=True)


def captured_launches(frames: JobFrames) -> pl.DataFrame:
    """The launch calls made inside a stream capture: rank, ``_cap`` (capture id), ``_cap_end``, ``_node``
    (position in the capture), ``_n`` (launches in the capture), ``_capture_op`` (the op that launched it)."""
    ops = frames["cpu_ops"].select("rank", "tid", "category", "name", "correlation", "is_launch", "start_ns", "end_ns")
    is_runtime = pl.col("category").is_in(["cuda_runtime", "cuda_driver"])
    runtime = ops.filter(is_runtime)
    begins = runtime.filter(fr.text_contains("name", CAPTURE_BEGIN)).select("rank", "tid",
                                                                               pl.col("start_ns").alias("_b"))
    ends = runtime.filter(fr.text_contains("name", CAPTURE_END)).select("rank", "tid",
                                                                           pl.col("end_ns").alias("_cap_end"))
    empty = pl.DataFrame(schema={"rank": pl.Int32, "_cap": pl.UInt32, "_cap_end": pl.Int64, "_node": pl.Int64,
                                 "_n": pl.UInt32, "_capture_op": pl.String})
    if begins.height == 0 or ends.height == 0:
        return empty
    windows = (
        begins.drop_nulls().sort("_b").join_asof(ends.drop_nulls().sort("_cap_end"), left_on="_b", right_on="_cap_end",
                                                  by=["rank", "tid"], strategy="forward", check_sortedness=False)
        .drop_nulls("_cap_end").with_row_index("_cap")
    )
    gpu = frames["kernels"].select("rank", "correlation").drop_nulls().unique()
    call = pl.col("is_launch") | (is_runtime & fr.text_contains("name", LAUNCH_CALL))
    launches = (
        ops.filter(call & pl.col("correlation").is_not_null())
        .join(gpu, on=["rank", "correlation"], how="anti")  # captured: nothing ran under that id
        .join(windows, on=["rank", "tid"], how="inner")
        .filter((pl.col("start_ns") >= pl.col("_b")) & (pl.col("start_ns") <= pl.col("_cap_end")))
    )
    if launches.height == 0:
        return empty
    launches = launches.join(launch_ops(frames, launches.select("rank", "correlation").unique(), calls=call),
                             on=["rank", "correlation"], how="left")
    return (
        launches.sort("rank", "_cap", "start_ns")
        .with_columns(pl.int_range(pl.len()).over("rank", "_cap").alias("_node"),
                      pl.len().over("rank", "_cap").alias("_n"))
        .select("rank", "_cap", "_cap_end", "_node", "_n", pl.col("_launch_op").alias("_capture_op"))
        .cast(empty.schema)
    )


def launch_times_of(frames: JobFrames, only: pl.DataFrame) -> pl.DataFrame:
    """``_t``: the CPU start of the launch call of each (rank, correlation) in ``only``."""
    return (
        frames["cpu_ops"].filter(pl.col("is_launch") & pl.col("correlation").is_not_null())
        .join(only, on=["rank", "correlation"], how="semi")
        .group_by("rank", "correlation").agg(pl.col("start_ns").min().alias("_t"))
    )


_NVTX_SUFFIX = r",\s*(op_id|seq|sizes|stream)\s*=.*$"


def launch_ops(frames: JobFrames, only: pl.DataFrame | None = None, ranges_named: str | None = None,
               out: str = "_launch_op", calls: pl.Expr | None = None) -> pl.DataFrame:
    """Per (rank, correlation) of a launch call (of those in ``only``, when given): the innermost op or annotation
    range open on the launching thread when the launch began (the NVTX ranges PyTorch writes under Nsight Systems,
    ``aten::mm, op_id = N``, with the op id dropped). Traces that link by External id do not need it.
    ``ranges_named``: only the ranges whose name matches this pattern (their innermost one), in column ``out``.
    ``calls``: which ops are launch calls (default: ``is_launch``)."""
    ops = frames["cpu_ops"].select("rank", "tid", "category", "is_launch", "correlation", "name", "start_ns", "end_ns")
    none = pl.DataFrame(schema={"rank": pl.Int32, "correlation": pl.Int64, out: pl.String})
    kinds = pl.col("category").is_in(["cpu_op", "user_annotation"])
    # the names stay Categorical until the few picked ranges are known: the text of every range is not needed
    ranges = (
        ops.filter(kinds if ranges_named is None else kinds & fr.text_contains("name", ranges_named))
        .select("rank", "tid", pl.col("start_ns").alias("_rs"), pl.col("end_ns").alias("_re"),
                pl.col("name").alias("_launch_op"))
        .drop_nulls(["rank", "tid"])
        .sort("_rs")
    )
    if ranges.height == 0:
        return none
    launches = ops.filter((pl.col("is_launch") if calls is None else calls) & pl.col("correlation").is_not_null())
    if only is not None:
        launches = launches.join(only.select("rank", "correlation"), on=["rank", "correlation"], how="semi")
    launches = (
        launches.select("rank", "tid", "correlation", pl.col("start_ns").alias("_t"))
        .drop_nulls(["rank", "tid"])
        .sort("_t")
    )
    if launches.height == 0:
        return none
    j = launches.join_asof(ranges, left_on="_t", right_on="_rs", by=["rank", "tid"], strategy="backward",
                           check_sortedness=False)  # both sorted above; the check cannot run with by
    return (
        j.filter(pl.col("_re") >= pl.col("_t"))
        .group_by("rank", "correlation")
        .agg(pl.col("_launch_op").first().cast(pl.String).str.replace(_NVTX_SUFFIX, "").alias(out))
    )


NOTE_SHARE = 0.10
"""A part of the GPU time this large or larger that the analysis cannot tie to an op, a category or a FLOP
model is said in words in the coverage line, never left as a silent ``other``."""


def gpu_time_coverage(attribution: pl.DataFrame, throughput: pl.DataFrame) -> dict[str, Any]:
    """How much of the GPU time (kernel, copy and NCCL time summed over streams and ranks) the analysis
    explains: shares attributed to ops, replayed from CUDA graphs (and of those, mapped to the capturing
    ops), in compiled regions, with a FLOP model, per category (``other`` included), the parts left
    unexplained, and a sentence for each of those holding at least :data:`NOTE_SHARE` of the time.
    ``attribution`` is :func:`op_attribution`; ``throughput`` :func:`forensics.facts.op_throughput.op_throughput`."""
    total = int(attribution["time_ns"].sum() or 0)
    if total <= 0:
        return {"gpu_time_ns": 0, "line": "No GPU kernel time in the traces: nothing to attribute.", "notes": [],
                "unexplained": [], "categories": {}}

    def share(where: pl.Expr) -> float:
        return round(int(attribution.filter(where)["time_ns"].sum() or 0) / total, 4)

    via = pl.col("via")
    flops = round(min(1.0, int(throughput["kernel_ns"].sum() or 0) / total), 4) if throughput.height else 0.0
    cats = attribution.group_by("category").agg(pl.col("time_ns").sum()).sort("time_ns", descending=True)
    out: dict[str, Any] = {
        "gpu_time_ns": total,
        "ranks": int(attribution["rank"].n_unique()),
        "attributed_to_ops": share(pl.col("op").is_not_null() & (via != "graph replay")),
        "graph_replayed": share(via != "launch"),
        "graph_mapped_to_ops": share(via == "graph capture"),
        "compiled_regions": share(pl.col("region").is_not_null()),
        "with_flop_model": flops,
        "categories": {c: round(t / total, 4) for c, t in cats.iter_rows()},
    }
    out["unexplained"] = _unexplained(attribution, out, total)
    out["notes"] = [u["note"] for u in out["unexplained"] if u["share"] >= NOTE_SHARE]
    out["line"] = _coverage_line(out)
    return out


def _top_names(attribution: pl.DataFrame, where: pl.Expr) -> str:
    rows = attribution.filter(where).sort("time_ns", descending=True).head(3)
    names = [n for ns in rows["kernel_names"].to_list() for n in (ns or [])][:3]
    return ", ".join(n if len(n) <= 60 else n[:57] + "..." for n in names)


def _unexplained(attribution: pl.DataFrame, cov: dict[str, Any], total: int) -> list[dict[str, Any]]:
    """The parts of the GPU time the analysis cannot tie to an op, a category or a FLOP model, largest first."""
    def part(what: str, where: pl.Expr, note: str) -> dict[str, Any]:
        ns = int(attribution.filter(where)["time_ns"].sum() or 0)
        return {"what": what, "gpu_time_ns": ns, "share": round(ns / total, 4), "note": note.format(pct=ns / total)}

    other = pl.col("category") == "other"
    parts = [
        part("graph replay, capture not in the trace", pl.col("via") == "graph replay",
             "{pct:.1%} of GPU time is replayed from CUDA graphs whose capture is not in the trace: it is tied to "
             "the graph launch, not to the ops that make it up (profile the step that captures the graph to map it)"),
        part("no op", pl.col("op").is_null(),
             "{pct:.1%} of GPU time is linked to no op (no External id and no op open at its launch)"),
        part("category other", other,
             "{pct:.1%} of GPU time is in category other, kernels no category rule names (largest: "
             + _top_names(attribution, other).replace("{", "{{").replace("}", "}}") + ")"),
    ]
    no_model = round(1.0 - cov["with_flop_model"], 4)
    parts.append({"what": "no FLOP model", "gpu_time_ns": int(total * no_model), "share": no_model,
                  "note": f"{no_model:.1%} of GPU time has no FLOP model (only GEMM and attention ops with recorded "
                          "shapes, and Triton matmul templates with recorded shapes, have one): no achieved TFLOP/s "
                          "for it"})
    return sorted([p for p in parts if p["gpu_time_ns"] > 0], key=lambda p: -p["share"])


def _coverage_line(cov: dict[str, Any]) -> str:
    cats = ", ".join(f"{c} {s:.0%}" for c, s in cov["categories"].items() if s >= 0.005)
    parts = [f"{cov['attributed_to_ops']:.0%} attributed to ops"]
    if cov["graph_replayed"]:
        parts.append(f"{cov['graph_replayed']:.0%} replayed from CUDA graphs ({cov['graph_mapped_to_ops']:.0%} mapped "
                     f"to "
                     "the ops that captured them)")
    if cov["compiled_regions"]:
        parts.append(f"{cov['compiled_regions']:.0%} in torch.compile regions")
    parts.append(f"{cov['with_flop_model']:.0%} with a FLOP model")
    line = (f"GPU time {cov['gpu_time_ns'] / 1e6:,.1f} ms over {cov['ranks']} rank(s): {', '.join(parts)}; "
            f"by category: {cats}.")
    return " ".join([line, *(n.rstrip(".") + "." for n in cov["notes"])])
