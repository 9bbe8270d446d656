"""NCCL configuration per communicator and per process, deviations from the majority flagged.

Facets of each NCCL process (host, pid, CUDA device), from its log lines: ``version`` (the log's banner,
else the version range its line formats allow), ``algo`` / ``proto`` (TUNING choices), ``transport``
(``Channel`` lines: P2P, SHM, NET/<network>, COLLNET), ``channels`` (the init line's coll channel count)
and ``env`` (NCCL_* settings echoed by NCCL, set by a plugin or on a command line of the same log).
A communicator (``commId`` of its init lines, else its pointer) shows the union of its members' values.

``deviates`` names the facets whose value differs from the majority value of that column (the most
common non-empty value; ties broken alphabetically; processes are not compared on transport, see
:data:`PROCESS_DEVIATIONS`), so a rank with another NCCL, another transport or
its own NCCL_* override stands out among hundreds.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import polars as pl
from forensics.reports.view import View

if TYPE_CHECKING:
    from forensics.facts.context import JobContext
    from forensics.pipeline import Analysis

PROC = ["host", "pid", "cuda_dev"]
FACETS = ["version", "algo", "proto", "transport", "channels", "env"]
PROCESS_DEVIATIONS = ["version", "algo", "proto", "channels", "env"]
"""Facets compared between processes: not the transport, which differs by a GPU's place in the ring (the ranks
at a node's edge use the network, the others NVLink); communicators are compared on every facet."""
CAPTION = ("A row flagged in 'deviates' runs a different NCCL, transport, channel count or NCCL_* override than "
           "the majority: the usual reason one rank or node is slow or hangs.")


def _joined(value: pl.Expr) -> pl.Expr:
    return value.drop_nulls().unique().sort().str.join(", ")


def _facet(df: pl.LazyFrame, value: pl.Expr, name: str) -> pl.LazyFrame:
    return df.group_by(PROC).agg(_joined(value).alias(name))


def process_facets(ctx: JobContext) -> pl.DataFrame:
    """host, pid, cuda_dev, rank, gpu and one string column per facet (null when the logs do not say)."""
    f = ctx.frames
    files = f["nccl_files"].select("source", pl.col("nccl_version").alias("_v"))
    sources = [f[n].select("source", *PROC) for n in ("nccl_comms", "nccl_env", "nccl_channels", "nccl_calls",
                                                      "nccl_events")]
    procs = pl.concat(sources, how="vertical").unique()
    if procs.height == 0:
        return pl.DataFrame(schema={**dict.fromkeys(["host", "gpu", *FACETS], pl.String), "pid": pl.Int64,
                                    "cuda_dev": pl.Int32, "rank": pl.Int32})
    # one lazy query, collected once (small frames: each eager step would cost more than its work)
    tuning = f["nccl_calls"].lazy().filter(pl.col("kind") == "tuning")
    ch = f["nccl_channels"].lazy()
    transport = pl.when(pl.col("net").is_not_null()).then(pl.col("transport") + "/"
                                                          + pl.col("net")).otherwise(pl.col("transport"))
    env = f["nccl_env"].lazy()
    env_val = pl.col("var") + "=" + pl.col("value")
    cmd_env = env.filter(pl.col("pid").is_null()).group_by("source").agg(_joined(env_val).alias("_cmd_env"))
    facets = [
        procs.lazy().join(files.lazy(), on="source",
                          how="left").group_by(PROC).agg(_joined(pl.col("_v")).alias("version")),
        _facet(tuning, pl.col("algo"), "algo"), _facet(tuning, pl.col("proto"), "proto"),
        _facet(ch, transport, "transport"),
        _facet(f["nccl_events"].lazy().filter(pl.col("kind") == "channels"),
               pl.col("value").cast(pl.Int64).cast(pl.String),
               "channels"),
        _facet(env.filter(pl.col("pid").is_not_null()), env_val, "env"),
    ]
    out = procs.lazy().group_by(PROC).agg(pl.col("source").min())  # min, not first: the same page every run
    for fa in facets:
        out = out.join(fa, on=PROC, how="left", nulls_equal=True)
    out = out.join(cmd_env, on="source", how="left").with_columns(
        pl.concat_str([pl.col("env"), pl.col("_cmd_env")], separator=", ", ignore_nulls=True).alias("env"))
    ident = ctx.identity.lazy().select(*PROC, pl.col("rank").alias("_r"), "bus_id").unique(PROC)
    traced = ctx.frames["ranks"].lazy().select(pl.col("rank").alias("_r"),
                                               pl.col("nccl_version").alias("_tv")).drop_nulls().unique("_r")
    out = out.join(ident, on=PROC, how="left", nulls_equal=True).join(traced, on="_r", how="left").with_columns(
        pl.when(pl.col("version") == "").then(None).otherwise(pl.col("version"))
        .fill_null(pl.col("_tv")).alias("version"),
        pl.when(pl.col("bus_id").is_not_null()).then(pl.col("host") + ":"
                                                     + pl.col("bus_id")).otherwise(pl.col("host")).alias("gpu"))
    cols = [pl.when(pl.col(c) == "").then(None).otherwise(pl.col(c)).alias(c) for c in FACETS]
    return out.select("host", "pid", "cuda_dev", pl.col("_r").cast(pl.Int32).alias("rank"), "gpu", *cols).sort(
        "rank", "host", "pid", "cuda_dev", nulls_last=True).collect()


def flag_deviations(df: pl.DataFrame, facets: list[str]) -> pl.DataFrame:
    """Add ``deviates``: the facets whose non-null value differs from the column's majority value."""
    flags = []
    for c in facets:
        counts = df.group_by(c).len().drop_nulls(c).sort(["len", c], descending=[True, False])
        if counts.height > 1:
            flags.append(pl.when(pl.col(c).is_not_null() & (pl.col(c) != counts[c][0])).then(pl.lit(c)))
    if not flags:
        return df.with_columns(pl.lit(None, pl.String).alias("deviates"))
    return df.with_columns(pl.concat_str(flags, separator=", ", ignore_nulls=True).alias("deviates")).with_columns(
        pl.when(pl.col("deviates") == "").then(None).otherwise(pl.col("deviates")).alias("deviates"))


def communicator_facets(ctx: JobContext, procs: pl.DataFrame) -> pl.DataFrame:
    """One row per communicator with init lines: comm, nranks, nnodes, members seen, facets over its members."""
    init = ctx.frames["nccl_comms"].filter(pl.col("origin") == "init").with_columns(
        pl.coalesce("comm_id",
                    pl.col("host") + ":" + pl.col("pid").cast(pl.String) + ":" + pl.col("comm")).alias("comm_key"))
    if init.height == 0:
        return pl.DataFrame()
    members = init.select("comm_key", *PROC, "nranks", "nnodes").unique()
    joined = members.join(procs.select(*PROC, *FACETS), on=PROC, how="left", nulls_equal=True)
    return joined.group_by("comm_key").agg(
        pl.col("nranks").max(), pl.col("nnodes").max(), pl.struct(PROC).n_unique().alias("members_seen"),
        pl.col("host").n_unique().alias("hosts"),
        *[_joined(pl.col(c).str.split(", ").explode()).alias(c) for c in FACETS],
    ).with_columns([pl.when(pl.col(c) == "").then(None).otherwise(pl.col(c)).alias(c) for c in FACETS]).sort(
        "nranks", "comm_key", descending=[True, False])


def nccl_config_view(analysis: Analysis) -> View:
    view = View("nccl-config", "NCCL configuration per communicator and process", CAPTION)
    ctx = analysis.context
    procs = process_facets(ctx)
    if procs.height == 0:
        versions = ctx.frames["ranks"].filter(pl.col("nccl_version").is_not_null())
        if versions.height == 0:
            view.empty_reason = "no NCCL log lines (run with NCCL_DEBUG=INFO) and no NCCL version in the traces"
            return view
        per = flag_deviations(versions.select("rank", "host", pl.col("nccl_version").alias("version")).sort("rank"),
                              ["version"])
        view.tables.append(("NCCL version per rank (traces; no NCCL log lines)", per))
        return view
    procs = flag_deviations(procs, PROCESS_DEVIATIONS)
    comms = communicator_facets(ctx, procs)
    if comms.height:
        view.tables.append(("Per communicator (values over its members)", flag_deviations(comms, FACETS)))
    odd = procs.filter(pl.col("deviates").is_not_null())
    view.tables.append((f"Processes that differ from the majority ({odd.height} of {procs.height})"
                        if odd.height else f"All {procs.height} processes (none differs from the majority)",
                        odd if odd.height else procs.head(200)))
    return view
