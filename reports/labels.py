"""The labels the report's views and the Perfetto timeline put on ranks and GPUs, the culprit ranks they mark, and
the escaping of input text in them.

Input text (host names, kernel and process-group names, log messages) reaches plotly only through
:func:`esc`: plotly renders a small HTML subset in labels and hover text, and decodes ``&lt;`` /
``&gt;`` / ``&amp;`` back to the characters, so escaped text shows exactly as it was written.
"""

from __future__ import annotations

import html
import weakref
from typing import TYPE_CHECKING, Any

import polars as pl

if TYPE_CHECKING:
    from forensics.facts.context import JobContext
    from forensics.pipeline import Analysis

SLOW_RANK_KIND = "slow_rank"  # the declared kind of finding whose ranks made the others wait


def esc(value: Any) -> str:
    """Input text for a plotly label or hover text: shown as text, never as markup."""
    return html.escape("" if value is None else str(value), quote=False)


_LABELS: dict[int, tuple[weakref.ref[JobContext], pl.DataFrame]] = {}
"""id(context) -> (the context, its labels); an entry goes with its context (a dataclass: not hashable)."""


def gpu_labels(ctx: JobContext) -> pl.DataFrame:
    """rank (Int32), host, gpu: one row per rank; ``gpu`` is ``host:bus-id`` (``host:cudaN`` when no log gave the
    bus id: device index from the trace, the host alone when neither is known). Sorted by rank. Built once per
    context (three views and the Perfetto timeline ask for it); shared, do not modify it."""
    key = id(ctx)
    known = _LABELS.get(key)
    if known is None or known[0]() is not ctx:
        known = (weakref.ref(ctx, lambda _: _LABELS.pop(key, None)), _gpu_labels(ctx))
        _LABELS[key] = known
    return known[1]


def _gpu_labels(ctx: JobContext) -> pl.DataFrame:
    # one lazy query, collected once (small frames: each eager step would cost more than its work)
    ident = ctx.identity.lazy().filter(pl.col("rank").is_not_null())
    hosts = pl.concat(
        [ctx.frames[n].lazy().select(pl.col("rank").cast(pl.Int32), pl.col("host").cast(pl.String))
         for n in ("ranks", "sources")], how="vertical",
    ).drop_nulls("rank").group_by("rank").agg(pl.col("host").drop_nulls().first())
    by_rank = ident.group_by("rank").agg(
        pl.col("host").drop_nulls().first().alias("_ihost"),
        pl.col("bus_id").drop_nulls().first(),
        pl.col("cuda_dev").drop_nulls().first(),
    ).with_columns(pl.col("rank").cast(pl.Int32))
    # the GPU index a rank's kernels ran on, where neither a log nor the trace metadata gave one
    kdev = ctx.frames["kernels"].lazy().drop_nulls("rank").group_by("rank").agg(
        pl.col("device").drop_nulls().first().alias("_kdev"))
    out = hosts.join(by_rank, on="rank", how="full", coalesce=True).join(
        kdev.with_columns(pl.col("rank").cast(pl.Int32)), on="rank", how="left"
    ).with_columns(pl.coalesce("_ihost", "host").fill_null("?").alias("host"),
                   pl.coalesce("cuda_dev", "_kdev").alias("cuda_dev"))
    dev = pl.coalesce(pl.col("bus_id"), pl.lit("cuda") + pl.col("cuda_dev").cast(pl.String))
    return out.select(
        "rank", "host",
        pl.when(dev.is_null()).then(pl.col("host")).otherwise(pl.col("host") + ":" + dev).alias("gpu"),
    ).sort("rank").collect()


def culprit_ranks(analysis: Analysis) -> list[int]:
    """Ranks the slow-rank findings (stragglers) name as culprits (the ranks that made the others wait), sorted."""
    found = {int(r) for f in analysis.findings if f.kind == SLOW_RANK_KIND for r in f.ranks}
    return sorted(found)


def rank_label(rank: int, gpu: str | None) -> str:
    return f"r{rank} {esc(gpu)}" if gpu else f"r{rank}"
