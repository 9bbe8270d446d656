"""Who is who: NCCL log processes (host, pid, cudaDev, busId) joined to global ranks and trace ranks.

A finding from a log and one from a trace must name the same rank and the same GPU (PCI bus id).
Sources of identity, strongest first:

1. NCCL init lines ``comm ... rank r nranks n cudaDev d [nvmlDev] busId b`` (the communicator with the
   most ranks is taken as the global one);
2. nccl-tests device lists ``Rank r Pid p on host device d [0xbus]``;
3. the process's own side of its ``Channel`` lines (sender for send/P2P/SHM, receiver for receive);
4. on a host where every known (cudaDev, rank) pair has the same offset ``rank - cudaDev`` (one
   communicator, ranks laid out by local GPU), the missing devices of that host by the same offset;
5. the Kineto ``ranks`` frame (rank, host, pid, device), joined on (host, pid, device), then
   (host, device);
6. a trace rank no log process matched is a process of its own (``how`` = ``trace``).

PCI addresses are spelled one way everywhere (``dddd:bb:dd.f``, lower case): every parser and detector
normalises them with :func:`forensics.base.bus_ids.normalize_bus_id`.
"""

from __future__ import annotations

import polars as pl

from forensics.base.frames import JobFrames


# a function, not a constant: importing this module runs no Polars code (`forensics rules`, frames.Dtype)
def identity_schema() -> dict[str, pl.DataType]:
    return {
        "host": pl.String(), "pid": pl.Int64(), "cuda_dev": pl.Int32(), "rank": pl.Int32(),
        "bus_id": pl.String(), "how": pl.String(),
    }


def _empty() -> pl.DataFrame:
    return pl.DataFrame(schema=identity_schema())


def _key() -> tuple[pl.Expr, ...]:
    return (pl.col("host").cast(pl.String()), pl.col("pid").cast(pl.Int64()), pl.col("cuda_dev").cast(pl.Int32()))


def _known(rank: pl.Expr, bus_id: pl.Expr, how: str) -> tuple[pl.Expr, ...]:
    """The identity columns of one kind of evidence, cast as they are kept (one select, not two)."""
    return (*_key(), rank.cast(pl.Int32()).alias("rank"), bus_id.cast(pl.String()).alias("bus_id"),
            pl.lit(how, pl.String()).alias("how"))


def log_identities(frames: JobFrames) -> pl.DataFrame:
    """One row per (host, pid, cuda_dev) seen in NCCL logs, with its global rank and bus id when known."""
    comms = frames["nccl_comms"]
    init = comms.filter(pl.col("origin") == "init").sort("nranks", descending=True).select(
        _known(pl.col("rank"), pl.col("bus_id"), "init"))
    tests = comms.filter(pl.col("origin").is_in(["nccl-tests", "launcher"])).select(
        _known(pl.col("rank"), pl.col("bus_id"), "nccl-tests"))
    recv = pl.col("direction") == "receive"
    own = frames["nccl_channels"].select(_known(
        pl.when(recv).then(pl.col("dst_rank")).otherwise(pl.col("src_rank")),
        pl.when(recv).then(pl.col("dst_bus_id")).otherwise(pl.col("src_bus_id")), "channel"))
    known = pl.concat([init, tests, own], how="vertical")
    known = known.filter(pl.col("cuda_dev").is_not_null() & pl.col("host").is_not_null())
    # every process the logs mention, with or without a rank
    seen = pl.concat(
        [
            frames[name].select(_key())
            for name in ("nccl_net", "nccl_channels", "nccl_events", "nccl_env", "nccl_calls", "nccl_comms")
            if frames[name].height
        ]
        or [_empty().select("host", "pid", "cuda_dev")],
        how="vertical",
    ).filter(pl.col("host").is_not_null() & pl.col("cuda_dev").is_not_null()).unique()
    best = (
        known.group_by("host", "pid", "cuda_dev", maintain_order=True)
        .agg(pl.col("rank").drop_nulls().first(), pl.col("bus_id").drop_nulls().first(), pl.col("how").first())
    )
    return _fill_gaps(seen.join(best, on=["host", "pid", "cuda_dev"], how="full", coalesce=True))


def _fill_gaps(out: pl.DataFrame) -> pl.DataFrame:
    """4. rank offset per process, else per host, when every known pair agrees; a bus id known for a (host,
    cuda_dev) from any process of that host."""
    pairs = out.filter(pl.col("rank").is_not_null()).select("host", "pid",
                                                            (pl.col("rank") - pl.col("cuda_dev")).alias("off"))

    def offsets(keys: list[str], name: str) -> pl.DataFrame:
        return (
            pairs.group_by(keys)
            .agg(pl.col("off").n_unique().alias("k"), pl.col("off").first().alias("off"), pl.len().alias("n"))
            .filter((pl.col("k") == 1) & (pl.col("n") >= 2))
            .select(*keys, pl.col("off").alias(name))
        )

    off = pl.coalesce("off", "_ho")
    out = (
        out.join(offsets(["host", "pid"], "off"), on=["host", "pid"], how="left")
        .join(offsets(["host"], "_ho"), on="host", how="left")
        .select(
            "host", "pid", "cuda_dev",
            pl.coalesce("rank", (pl.col("cuda_dev") + off).cast(pl.Int32())).alias("rank"),
            "bus_id",
            pl.when(pl.col("rank").is_null() & off.is_not_null()).then(pl.lit("host-offset")).otherwise(pl.col("how"))
            .alias("how"),
        )
    )
    bus = out.filter(pl.col("bus_id").is_not_null()).group_by("host",
                                                              "cuda_dev").agg(pl.col("bus_id").first().alias("_b"))
    out = out.join(bus, on=["host", "cuda_dev"], how="left").select(
        "host", "pid", "cuda_dev", "rank", pl.coalesce("bus_id", "_b").alias("bus_id"), "how")
    return _cast(out).sort("host", "pid", "cuda_dev", nulls_last=True)


def with_trace_ranks(ident: pl.DataFrame, ranks: pl.DataFrame) -> pl.DataFrame:
    """Add ``trace_rank`` (the Kineto ``ranks`` frame's rank) to log identities; fill missing ranks from it."""
    if ranks.height == 0:
        return ident.with_columns(pl.lit(None, pl.Int32()).alias("trace_rank"))
    tr = ranks.select("host", "pid", pl.col("device").cast(pl.Int32()).alias("cuda_dev"),
                      pl.col("rank").alias("trace_rank"))
    by_pid = ident.join(tr, on=["host", "pid", "cuda_dev"], how="left")
    by_dev = tr.group_by("host", "cuda_dev").agg(pl.col("trace_rank").first().alias("_t"), pl.len().alias("_n"))
    by_dev = by_dev.filter(pl.col("_n") == 1).drop("_n")
    out = by_pid.join(by_dev, on=["host", "cuda_dev"], how="left").with_columns(
        pl.coalesce("trace_rank", "_t").alias("trace_rank")
    ).drop("_t")
    return out.with_columns(pl.coalesce("rank", "trace_rank").alias("rank"))


def identities(frames: JobFrames) -> pl.DataFrame:
    """The processes the NCCL logs mention, joined to trace ranks: one row per (host, pid, cuda_dev).

    Columns:

    - ``host`` (String): short host name as the frames store it;
    - ``pid`` (Int64): process id;
    - ``cuda_dev`` (Int32): CUDA device index the process drives;
    - ``rank`` (Int32): global rank (logs first, else the trace's); null when unknown;
    - ``bus_id`` (String): PCI address of its GPU, ``dddd:bb:dd.f`` (:func:`normalize_bus_id`); null when no
      log names it;
    - ``how`` (String): where ``rank`` came from: ``init``, ``nccl-tests``, ``channel``, ``host-offset`` (see
      the module docstring); null when unknown;
    - ``trace_rank`` (Int32): the Kineto ``ranks`` frame's rank of this process; null without one.

    Sorted by host, pid, cuda_dev. :func:`job_identities` adds the traced processes no log names.
    """
    ident = log_identities(frames)
    if not frames.has("ranks"):
        return ident.with_columns(pl.lit(None, pl.Int32()).alias("trace_rank"))
    return with_trace_ranks(ident, frames["ranks"])


def job_identities(frames: JobFrames, ident: pl.DataFrame | None = None) -> pl.DataFrame:
    """The job's rank <-> host <-> GPU frame (``JobContext.identity``): every process of the job.

    :func:`identities` (the log processes) first, then one row per traced process (host, pid, device)
    that is none of them, with ``how`` = ``trace``, ``rank`` = ``trace_rank`` = the trace's rank and no
    ``bus_id``. Same columns as :func:`identities`; a rank may appear twice when its log process and its
    traced process differ (another pid), both naming the same host and GPU. ``ident``: :func:`identities`
    of ``frames`` when the caller has it.
    """
    ident = ident if ident is not None else identities(frames)
    if not frames.has("ranks"):
        return ident
    return pl.concat([ident, trace_only(ident, frames["ranks"])], how="vertical_relaxed")


def trace_only(ident: pl.DataFrame, ranks: pl.DataFrame) -> pl.DataFrame:
    """Traced processes (host, pid, device) that no log process is, in the identity frame's schema."""
    tr = ranks.filter(pl.col("rank").is_not_null()).select(
        pl.col("host").cast(pl.String()), pl.col("pid").cast(pl.Int64()),
        pl.col("device").cast(pl.Int32()).alias("cuda_dev"), pl.col("rank").cast(pl.Int32()),
    ).unique(maintain_order=True)
    tr = tr.join(ident.select("host", "pid", "cuda_dev"), on=["host", "pid", "cuda_dev"], how="anti", nulls_equal=True,
                 maintain_order="left")
    return tr.select(
        "host", "pid", "cuda_dev", "rank", pl.lit(None, pl.String()).alias("bus_id"), pl.lit("trace").alias("how"),
        pl.col("rank").alias("trace_rank"),
    )


def attach(df: pl.DataFrame, ident: pl.DataFrame) -> pl.DataFrame:
    """Fill ``rank`` and add ``bus_id`` on any frame with host, pid, cuda_dev columns."""
    ids = ident.select("host", "pid", "cuda_dev", pl.col("rank").alias("_r"), pl.col("bus_id").alias("_bus"))
    # a frame whose key column is all null (e.g. no host on any failure line) has dtype Null, which no join accepts
    keys = [pl.col(c).cast(ids.schema[c]) for c in ("host", "pid", "cuda_dev") if df.schema[c] != ids.schema[c]]
    out = df.with_columns(keys).join(ids, on=["host", "pid", "cuda_dev"], how="left")
    return out.with_columns(pl.coalesce("rank", "_r").alias("rank"), pl.col("_bus").alias("bus_id")).drop("_r", "_bus")


def _cast(df: pl.DataFrame) -> pl.DataFrame:
    schema = identity_schema()
    return df.select([pl.col(c).cast(schema[c]) for c in df.columns if c in schema])
