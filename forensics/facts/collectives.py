"""Collective matching across ranks, transfer/wait split, last arrival and clock offsets.

An NCCL kernel's duration is mostly waiting: every rank's kernel of one collective ends within a few
µs of the others, so ``duration = (last arrival - own start) + transfer``. Matching the same collective
instance on every rank of its process group lets us split it:

* transfer ``x_k = min_r d_{r,k}`` (the last rank to arrive waits for nobody),
* wait ``w_{r,k} = d_{r,k} - x_k``,
* last arrival = the rank with the least wait; its margin = second-smallest duration minus smallest.

This needs durations only, so it is immune to clock differences between nodes. Per-host clock offsets
are estimated from how collective *end* times line up (``median_k(end_{r,k} - median_j end_{j,k})``).

Matching key: ``(process group, Seq)`` where the trace has ``Seq``; else the ordinal of the call within
the process group on that rank, counted per profiler step so that a rank which profiled a different
window only leaves incomplete instances in the steps it lacks (they are dropped, not mis-paired).
Instances are validated: every member present and one collective type / message size.

Pipeline point-to-point kernels (send/recv in a PP group) are not synchronizing collectives; they are
not matched, and their transfer time is estimated as the smallest duration of any send or receive of
the same (group, size) in the job (the two sides of a transfer end together, so the side that arrived
last shows the bare transfer). Other unmatched kernels likewise use the same (group, op, size); without
size metadata that would mix sizes (the job's shortest all-reduce taken as every all-reduce's transfer),
so a collective only one rank's trace shows is left unsplit (``transfer_how`` = "unknown": all of it
counted as transfer, none as wait); ``transfer_how`` says which estimate each kernel got.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import polars as pl

from forensics.base import frames as fr
from forensics.base.frames import JobFrames
from forensics.parsers.kineto_names import TP_OVERLAP_COMM

PG_TYPES = ["DP", "TP", "PP", "EP", "CP", "default"]
P2P_OPS = ["send", "recv", "sendrecv"]
# Collectives whose members all finish together; rooted ops (broadcast/reduce) only roughly do.
SYNCHRONIZING = ["allreduce", "allgather", "reduce_scatter", "alltoall", "sendrecv", "barrier"]


def pg_type_expr(desc: pl.Expr) -> pl.Expr:
    """PG type from a process-group description (Megatron names, FSDP/DDP, torchtitan meshes)."""
    d = desc.str.to_uppercase()
    return (
        pl.when(d.str.contains("PIPELINE|(^|[^A-Z])PP([^A-Z]|$)"))
        .then(pl.lit("PP"))
        .when(d.str.contains("EXPERT|(^|[^A-Z])EP([^A-Z]|$)|MOE"))
        .then(pl.lit("EP"))
        .when(d.str.contains("TENSOR|(^|[^A-Z])TP([^A-Z]|$)"))
        .then(pl.lit("TP"))
        .when(d.str.contains("CONTEXT|(^|[^A-Z])CP([^A-Z]|$)"))
        .then(pl.lit("CP"))
        .when(d.str.contains("DATA|(^|[^A-Z])DP([^A-Z]|$)|FSDP|SHARD|DDP|REPLICATE"))
        .then(pl.lit("DP"))
        .otherwise(pl.lit("default"))
    )


@dataclass(frozen=True)
class CollectiveMatch:
    """Result of :func:`match_collectives`.

    ``kernels``: one row per NCCL kernel (rank, host, step, pg_key, pg_type, collective, bytes, start_ns,
    end_ns, dur_ns, instance, matched, transfer_ns, wait_ns, last_rank, is_last, transfer_how: how the
    transfer was estimated, a key of :data:`TRANSFER_HOW`; fused: TP communication fused with GEMMs, meant to run
    beside them: userbuffers and symmetric-memory kernels, async TP's peer copies).
    ``instances``: one row per matched collective instance.
    ``rank_offsets`` / ``host_offsets``: estimated clock offset (ns) to subtract from a rank's/host's times.
    ``unmatched``: counts of synchronizing kernels left unmatched, by reason.
    ``incomplete``: one row per instance some members of the group never joined (instance_key, pg_key,
    step, collective, n_ranks, n_members, missing_ranks), e.g. the collective a hung rank never reached.
    ``missing_ranks`` is empty when the group's member list is unknown.
    """

    kernels: pl.DataFrame
    instances: pl.DataFrame
    rank_offsets: pl.DataFrame
    host_offsets: pl.DataFrame
    unmatched: dict[str, int]
    # not pl.DataFrame itself: importing this module runs no Polars code (`forensics rules`, frames.Dtype)
    incomplete: pl.DataFrame = field(default_factory=lambda: pl.DataFrame())


WHOLE_TRACE = -1
"""Step number of the single pseudo-step used when a trace has no profiler steps (e.g. Nsight captures)."""


def effective_steps(frames: JobFrames) -> pl.DataFrame:
    """The ``steps`` frame; without profiler steps, one pseudo-step per rank spanning all its GPU activity
    (step number :data:`WHOLE_TRACE`), so the analysis still runs on step-less captures."""
    steps = frames["steps"].filter(pl.col("rank").is_not_null())
    if steps.height:
        return steps
    k = frames["kernels"].select("rank", "host", "source", "start_ns", "end_ns").filter(pl.col("rank").is_not_null())
    return k.group_by("rank").agg(
        pl.col("host").first(),
        pl.col("source").first(),
        pl.lit(WHOLE_TRACE, dtype=pl.Int64).alias("step"),
        pl.col("start_ns").min(),
        pl.col("end_ns").max(),
    ).select(frames["steps"].columns).cast(dict(frames["steps"].schema))  # type: ignore[arg-type]


def assign_steps(df: pl.DataFrame, steps: pl.DataFrame, time_col: str = "start_ns") -> pl.DataFrame:
    """Add ``step``: the last profiler step (per rank) that began at or before ``time_col``."""
    if steps.height == 0:
        return df.with_columns(pl.lit(None, dtype=pl.Int64).alias("step"))
    st = (
        steps.select("rank", pl.col("start_ns").alias("_step_start"), "step")
        .drop_nulls("rank")
        .sort("_step_start")
    )
    out = df.with_row_index("_ord").sort(time_col).join_asof(
        st, left_on=time_col, right_on="_step_start", by="rank", strategy="backward", check_sortedness=False
    )
    return out.sort("_ord").drop("_ord", "_step_start")


def launch_times(frames: JobFrames) -> pl.DataFrame:
    """Per (rank, correlation) of a kernel launch call: ``launch_ns``, the earliest such call's CPU start."""
    ops = frames["cpu_ops"].lazy()  # lazy: the filter reads four columns instead of copying every op's row
    return (
        ops.filter(pl.col("is_launch") & pl.col("correlation").is_not_null())
        .group_by("rank", "correlation")
        .agg(pl.col("start_ns").min().alias("launch_ns"))
        .collect()
    )


def attach_steps(frames: JobFrames, kernels: pl.DataFrame, launches: pl.DataFrame | None = None) -> pl.DataFrame:
    """Add ``launch_ns`` and ``step`` to GPU activity rows (rank, correlation, start_ns, ...).

    A kernel belongs to the profiler step whose CPU range launched it (launch -> kernel correlation):
    the ProfilerStep annotations say which step is which, the kernel's own GPU time says where it ran.
    On a rank whose kernels are linked to launches, a kernel without a launch in the trace (launched
    before the profiler started) has no step; one launched after the last recorded step belongs to it (a
    hung step's ProfilerStep range is never closed, so its collective is launched "after" the last one).
    Ranks without any launch link, and captures without profiler steps, place kernels by their own start.
    ``launches`` is :func:`launch_times` when the caller has it already.
    """
    launches = launch_times(frames) if launches is None else launches
    k = kernels.join(launches, on=["rank", "correlation"], how="left")
    steps = effective_steps(frames)
    if steps.height == 0:
        return k.with_columns(pl.lit(None, dtype=pl.Int64).alias("step"))
    linked = pl.col("rank").is_in(launches["rank"].unique().implode())
    pseudo = bool((steps["step"] == WHOLE_TRACE).all())
    t = pl.col("start_ns") if pseudo else pl.when(linked).then(pl.col("launch_ns")).otherwise(pl.col("start_ns"))
    k = k.with_columns(t.alias("_t_step")).with_row_index("_kord")
    timed = assign_steps(k.filter(pl.col("_t_step").is_not_null()), steps, "_t_step")
    untimed = k.filter(pl.col("_t_step").is_null()).with_columns(pl.lit(None, dtype=pl.Int64).alias("step"))
    return pl.concat([timed, untimed], how="vertical").sort("_kord").drop("_kord", "_t_step")


def _comm_kernels(frames: JobFrames, launches: pl.DataFrame | None = None) -> tuple[pl.DataFrame, pl.DataFrame]:
    """NCCL/RCCL kernels with step, PG key, PG type and launch time attached, and ``_pgid``, a dense integer id of
    ``pg_key`` to group and join by; and the rank list of each ``_pgid`` (``_pgid``, ``pg_ranks``). A rank list
    per kernel row is the square of the ranks (1 GB at 4,096 ranks), copied by every filter, join and sort of the
    rows; the rows carry its id (``pg_id``; with the group's name it tells one group from another) and
    ``process_groups`` the lists."""
    pgs = frames["process_groups"]
    members = fr.pg_members(pgs)
    k = frames["kernels"].filter(pl.col("class") == "comm")
    lists = k.filter(pl.col("pg_id").is_not_null()).select("pg_name", "pg_id").unique(maintain_order=True)
    declared = pgs.filter(pl.col("declared"))
    if declared.height:  # kernels without group metadata take their rank's group of that name
        pg_info = declared.group_by("rank", "pg_name").agg(
            pl.col("pg_desc").first().alias("_desc"), pl.col("pg_id").first().alias("_ppg")
        )
        k = k.join(pg_info, on=["rank", "pg_name"], how="left").with_columns(
            pl.coalesce("pg_desc", "_desc").alias("pg_desc"),
            pl.coalesce("pg_id", "_ppg").alias("pg_id"),
        ).drop("_desc", "_ppg")
        lists = pl.concat([lists, pg_info.select("pg_name", pl.col("_ppg").alias("pg_id"))])
    lists = lists.join(members, on="pg_id", how="left")
    k, lists = _with_pg_key(attach_steps(frames, k, launches), lists)
    # userbuffers and symmetric-memory kernels, and the copies of async TP's fused ops, carry no group: all are
    # tensor-parallel features (TE's comm-GEMM overlap, async TP)
    tp_overlap = pl.col("pg_desc").is_null() & fr.text_contains("name", TP_OVERLAP_COMM)
    return k.with_columns(
        pl.when(tp_overlap).then(pl.lit("TP"))
        .otherwise(pg_type_expr(pl.col("pg_desc").fill_null(""))).alias("pg_type"),
        (pl.col("end_ns") - pl.col("start_ns")).alias("dur_ns"),
        _coalesced_p2p().fill_null(pl.lit("unknown")).alias("collective"),
    ), lists


def _coalesced_p2p() -> pl.Expr:
    """The collective, with a coalesced group that runs as a SendRecv kernel (batch_isend_irecv under
    PyTorch's coalescing manager: `nccl:coalesced`, Collective name "coalesced") read as ``sendrecv``: one
    kernel that carries sends and receives to its pipeline neighbours, a P2P exchange, not a collective."""
    sendrecv = fr.text_contains("name", r"(?i)(?:nccl|rccl)\w*Kernel_SendRecv")
    return pl.when((pl.col("collective") == "coalesced")
                   & sendrecv).then(pl.lit("sendrecv")).otherwise(pl.col("collective"))


def _with_pg_key(k: pl.DataFrame, lists: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Add ``pg_key`` (``pg_name|r0,r1,...``, the rank list spelled out) and ``_pgid`` to the rows (which
    carry ``pg_id``, their member list's id; ``lists``: pg_name, pg_id, pg_ranks). The key is spelled once per
    group and joined to the rows, which then share its text (string views): spelled per row it held the
    whole rank list once per kernel (75 MB at 1,024 ranks). Returns the rows and each ``_pgid``'s ranks."""
    ranks_txt = pl.col("pg_ranks").cast(pl.List(pl.String)).list.join(",")
    keys = (
        k.select("pg_name", "pg_id").unique()
        .join(lists.drop_nulls("pg_id").unique(["pg_name", "pg_id"], keep="first"), on=["pg_name", "pg_id"],
              how="left", nulls_equal=True)
        .with_columns(pl.concat_str([pl.col("pg_name").fill_null("?"), ranks_txt.fill_null("*")], separator="|")
                      .alias("pg_key"))
        .with_columns(pl.col("pg_key").rank("dense").alias("_pgid"))  # one id per key text, as grouping by it
    )
    rows = k.join(keys.drop("pg_ranks"), on=["pg_name", "pg_id"], how="left", nulls_equal=True,
                  maintain_order="left")
    return rows.drop("pg_id"), keys.select("_pgid", "pg_ranks").unique("_pgid", keep="first")


def match_collectives(frames: JobFrames, launches: pl.DataFrame | None = None) -> CollectiveMatch:
    """NCCL kernels matched into collective instances (see :class:`CollectiveMatch`); ``launches`` is
    :func:`launch_times` when the caller has it already."""
    k, lists = _comm_kernels(frames, launches)
    k = k.filter(pl.col("rank").is_not_null())
    is_p2p = pl.col("collective").is_in(P2P_OPS) & (pl.col("pg_type") == "PP")
    k = k.with_columns(is_p2p.alias("is_p2p"), fr.text_contains("name", TP_OVERLAP_COMM).alias("_fused"))
    sync = _with_instance_keys(k.filter(~pl.col("is_p2p") & ~pl.col("_fused")))
    inst = _instance_table(sync)
    unmatched = {
        "incomplete_instances": int(inst.filter(~pl.col("complete")).height),
        "inconsistent_instances": int(inst.filter(pl.col("complete") & ~pl.col("consistent")).height),
    }
    incomplete = inst.filter(~pl.col("complete") & (pl.col("n_ranks") < pl.col("n_members"))).join(
        lists.select("_pgid", pl.col("pg_ranks").alias("_pg_ranks")), on="_pgid", how="left"
    ).select(
        "instance_key", "pg_key", "step", "collective", "n_ranks", "n_members",
        pl.col("_pg_ranks").list.set_difference(pl.col("_present")).fill_null([]).list.sort().alias("missing_ranks"),
    ).sort("pg_key", "step", "instance_key")
    good = inst.filter(pl.col("complete") & pl.col("consistent") & (pl.col("n_ranks") >= 2))
    good = good.sort("pg_key", "first_start_ns").with_row_index("instance").with_columns(
        pl.col("instance").cast(pl.Int64)
    )
    instances = good.select(
        "instance", "instance_key", "pg_key", "pg_type", "step", "collective", "bytes", "n_ranks",
        "transfer_ns", "last_rank", "margin_ns", "max_wait_ns",
    )
    present = inst.select("_iid", pl.col("n_ranks").alias("_n_present"))
    allk = _split_wait_transfer(k, sync.join(present, on="_iid", how="left"), good)
    rank_off, host_off = _clock_offsets(allk)
    return CollectiveMatch(allk, instances, rank_off, host_off, unmatched, incomplete)


def _with_instance_keys(sync: pl.DataFrame) -> pl.DataFrame:
    """Add ``n_members``, ``instance_key`` (one key per call of one collective on one group: by NCCL
    sequence number where every row has one, else by step and call order per rank) and ``_iid``, a dense
    integer id of the key. Keys are spelled once per instance and joined to the rows (see :func:`_with_pg_key`)."""
    # Members of each group: the listed ranks, else every rank seen with that key.
    members = sync.group_by("_pgid").agg(
        pl.col("group_size").max().alias("_gsize"),
        pl.col("rank").n_unique().alias("_seen"),
        pl.col("seq").is_not_null().all().alias("_has_seq"),
    ).with_columns(pl.coalesce("_gsize", "_seen").cast(pl.Int64).alias("n_members"))
    sync = sync.join(members.select("_pgid", "n_members", "_has_seq"), on="_pgid", how="left")

    ordinal = (pl.int_range(pl.len()).over(["rank", "_pgid", "step"], order_by="start_ns")).cast(pl.Int64)
    has_seq = pl.col("_has_seq")
    sync = sync.with_columns(
        pl.when(has_seq).then(pl.col("seq")).alias("_k_seq"),
        pl.when(~has_seq).then(pl.col("step")).alias("_k_step"),
        pl.when(~has_seq).then(ordinal).alias("_k_ord"),
    )
    parts = ["_pgid", "_has_seq", "_k_seq", "_k_step", "_k_ord"]
    keys = sync.select(*parts, "pg_key").unique(subset=parts).select(
        *parts,
        pl.when(has_seq)
        .then(pl.concat_str([pl.col("pg_key"), pl.lit("#s"), pl.col("_k_seq").cast(pl.String)]))
        .otherwise(
            pl.concat_str(
                [pl.col("pg_key"), pl.lit("#"), pl.col("_k_step").cast(pl.String).fill_null("-"), pl.lit("#"),
                 pl.col("_k_ord").cast(pl.String)]
            )
        )
        .alias("instance_key"),
    ).with_columns(pl.col("instance_key").rank("dense").alias("_iid"))  # one id per key text, as grouping by it
    return sync.join(keys, on=parts, how="left", nulls_equal=True, maintain_order="left").drop(
        "_k_seq", "_k_step", "_k_ord")


def _instance_table(sync: pl.DataFrame) -> pl.DataFrame:
    """One row per instance key: who took part, the shortest duration (the transfer), who arrived last."""
    inst = sync.group_by("_iid").agg(
        pl.col("instance_key").first(),
        pl.col("pg_key").first(),
        pl.col("pg_type").first(),
        pl.col("step").min(),
        pl.col("collective").first(),
        pl.col("bytes").max(),
        pl.col("n_members").first(),
        pl.col("rank").n_unique().alias("n_ranks"),
        pl.len().alias("n_rows"),
        pl.col("collective").n_unique().alias("_n_coll"),
        pl.col("bytes").drop_nulls().n_unique().alias("_n_bytes"),
        pl.col("dur_ns").min().alias("transfer_ns"),
        pl.col("dur_ns").sort().get(1, null_on_oob=True).alias("_second_ns"),
        pl.col("rank").sort_by("dur_ns").first().alias("last_rank"),
        (pl.col("dur_ns").max() - pl.col("dur_ns").min()).alias("max_wait_ns"),
        pl.col("start_ns").min().alias("first_start_ns"),
        pl.col("_pgid").first(),
        pl.col("rank").unique().alias("_present"),
    )
    complete = (pl.col("n_ranks") == pl.col("n_members")) & (pl.col("n_rows") == pl.col("n_ranks"))
    consistent = (pl.col("_n_coll") == 1) & (pl.col("_n_bytes") <= 1)
    return inst.with_columns(
        complete.alias("complete"),
        consistent.alias("consistent"),
        (pl.col("_second_ns") - pl.col("transfer_ns")).alias("margin_ns"),
    )


def _split_wait_transfer(k: pl.DataFrame, sync: pl.DataFrame, instances: pl.DataFrame) -> pl.DataFrame:
    """Every comm kernel with ``transfer_ns`` / ``wait_ns``, its instance (when matched) and ``is_last``."""
    sync = sync.join(
        instances.select("_iid", "instance", pl.col("transfer_ns").alias("_x"), "last_rank", "margin_ns"),
        on="_iid",
        how="left",
    )
    # Unmatched kernels (PP p2p, incomplete or inconsistent instances): transfer = smallest duration of
    # the same (group, op, size) anywhere in the job; never more than the kernel itself.
    # Point-to-point: a send and its receive end together, so whichever side arrived last is pure transfer;
    # pool sends and receives (a receive posted early always waits).
    p2p_class = pl.when(pl.col("collective").is_in(P2P_OPS)).then(pl.lit("p2p")).otherwise(pl.col("collective"))
    class_min = k.with_columns(p2p_class.alias("_cls")).group_by("_pgid", "_cls", "bytes").agg(
        pl.col("dur_ns").min().alias("_class_min")
    )
    cols = ["rank", "host", "step", "pg_key", "pg_type", "pg_name", "collective", "bytes", "stream", "launch_ns",
            "start_ns", "end_ns", "dur_ns", "is_p2p", "_pgid", "_fused"]
    p2p = k.filter(pl.col("is_p2p") | pl.col("_fused")).select(cols).with_columns(
        pl.lit(None, dtype=pl.String).alias("instance_key"),
        pl.lit(None, dtype=pl.Int64).alias("instance"),
        pl.lit(None, dtype=pl.Int64).alias("_x"),
        pl.lit(None, dtype=pl.Int32).alias("last_rank"),
        pl.lit(None, dtype=pl.Int64).alias("margin_ns"),
    )
    allk = pl.concat(
        [sync.select(*cols, "instance_key", "instance", "_x", pl.col("last_rank").cast(pl.Int32), "margin_ns",
                     pl.col("_n_present").cast(pl.Int64)),
         p2p.with_columns(pl.lit(None, dtype=pl.Int64).alias("_n_present"))],
        how="vertical",
    ).with_columns(p2p_class.alias("_cls")).join(
        class_min, on=["_pgid", "_cls", "bytes"], how="left", nulls_equal=True
    ).drop("_cls", "_pgid")
    how = _transfer_how()
    estimate = pl.when(how == UNKNOWN_SPLIT).then(pl.col("dur_ns")).otherwise(pl.coalesce("_x", "_class_min"))
    return allk.with_columns(
        pl.col("instance").is_not_null().alias("matched"),
        pl.min_horizontal(estimate, "dur_ns").alias("transfer_ns"),
        how.alias("transfer_how"),
    ).with_columns(
        (pl.col("dur_ns") - pl.col("transfer_ns")).alias("wait_ns"),
        (pl.col("matched") & (pl.col("rank") == pl.col("last_rank"))).alias("is_last"),
    ).drop("_x", "_class_min", "_n_present").rename({"_fused": "fused"})


UNKNOWN_SPLIT = "unknown"
TRANSFER_HOW = {
    "min_across_ranks": "the shortest duration of that collective across its ranks",
    "same_size_min": "the shortest kernel of the same group, operation and size in the job",
    "job_min": "the shortest kernel of the same group and operation in the job, of any size (a lower bound)",
    UNKNOWN_SPLIT: "the whole kernel, with no peer's trace and no size to split it by (an upper bound)",
}
"""How ``transfer_ns`` was estimated (the ``transfer_how`` column of :attr:`CollectiveMatch.kernels`)."""


def _transfer_how() -> pl.Expr:
    """Matched instances: the shortest duration across ranks (the last arrival waited for nobody). Else the
    shortest kernel of the same (group, op, size); without a size, a kernel no other rank's trace shows
    cannot be split at all (the job-wide shortest of all sizes would call almost everything waiting)."""
    return (
        # comm fused with or beside GEMMs (userbuffers, symmetric memory): no peer instance to split it by
        pl.when(pl.col("_fused")).then(pl.lit(UNKNOWN_SPLIT))
        .when(pl.col("instance").is_not_null()).then(pl.lit("min_across_ranks"))
        .when(pl.col("bytes").is_not_null()).then(pl.lit("same_size_min"))
        .when(~pl.col("is_p2p") & (pl.col("_n_present") == 1)).then(pl.lit(UNKNOWN_SPLIT))
        .otherwise(pl.lit("job_min"))
    )


def transfer_basis(kernels: pl.DataFrame) -> str:
    """A sentence saying how the transfer part of ``kernels`` (rows of :attr:`CollectiveMatch.kernels`) was
    estimated, by share of kernel time; '' when there are none."""
    if kernels.height == 0 or "transfer_how" not in kernels.columns:
        return ""
    parts = (
        kernels.group_by("transfer_how").agg(pl.col("dur_ns").sum())
        .with_columns((pl.col("dur_ns") / pl.col("dur_ns").sum()).alias("share"))
        .sort(["share", "transfer_how"], descending=[True, False])
    )
    sized = float(kernels["bytes"].is_not_null().sum()) / kernels.height
    size_txt = "with" if sized >= 1 else ("without" if sized == 0 else f"{sized:.0%} of kernels with")
    items = [f"{TRANSFER_HOW[h]} ({sh:.0%} of the kernel time)" for h, _, sh in parts.iter_rows()]
    return f" Collectives {size_txt} size metadata; transfer estimated as " + "; ".join(items) + "."


def _clock_offsets(k: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    m = k.filter(pl.col("matched") & pl.col("collective").is_in(SYNCHRONIZING))
    if m.height == 0:
        empty_r = pl.DataFrame(schema={"rank": pl.Int32, "host": pl.String, "offset_ns": pl.Int64})
        return empty_r, pl.DataFrame(schema={"host": pl.String, "offset_ns": pl.Int64, "n_ranks": pl.UInt32})
    dev = m.with_columns(
        (pl.col("end_ns") - pl.col("end_ns").median().over("instance")).alias("_dev")
    )
    rank_off = (
        dev.group_by("rank", "host")
        .agg(pl.col("_dev").median().round().cast(pl.Int64).alias("offset_ns"))
        .sort("rank")
    )
    host_off = (
        rank_off.group_by("host")
        .agg(pl.col("offset_ns").median().round().cast(pl.Int64), pl.len().alias("n_ranks"))
        .with_columns((pl.col("offset_ns") - pl.col("offset_ns").median().round().cast(pl.Int64)).alias("offset_ns"))
        .sort("host", nulls_last=True)
    )
    return rank_off, host_off
