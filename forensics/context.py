"""The JobContext: one object per analysis that holds the frames and every fact derived from them."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import polars as pl

from forensics.breakdown import Breakdown, compute_breakdown, kernel_exposure
from forensics.collectives import CollectiveMatch, match_collectives
from forensics.frames import JobFrames


@dataclass
class JobContext:
    """Facts about one job shared by every detector and view, computed once on first use.

    ``frames`` are the parsed, canonical frames (forensics.frames); everything else is derived from
    them lazily and cached on this object, so two readers never compute (or disagree about) a fact twice.
    """

    frames: JobFrames

    @cached_property
    def match(self) -> CollectiveMatch:
        return match_collectives(self.frames)

    @cached_property
    def breakdown(self) -> Breakdown:
        return compute_breakdown(self.frames, self.match)

    @property
    def steps(self) -> pl.DataFrame:
        return self.breakdown.steps

    @cached_property
    def exposure(self) -> pl.DataFrame:
        return kernel_exposure(self.frames, self.match)

    @cached_property
    def stages(self) -> pl.DataFrame:
        """rank -> (pp_stage, pp_size, pp_key) from the pipeline process groups; empty without PP."""
        pgs = self.frames["process_groups"]
        from forensics.collectives import pg_type_expr

        pp = pgs.filter(pg_type_expr(pl.col("pg_desc").fill_null("")) == "PP").drop_nulls("rank")
        if pp.height == 0:
            k = self.match.kernels.filter(pl.col("pg_type") == "PP")
            if k.height == 0:
                return pl.DataFrame(schema={"rank": pl.Int32, "pp_stage": pl.Int64, "pp_size": pl.Int64,
                                            "pp_key": pl.String})
            full = self.frames["kernels"].filter(pl.col("class") == "comm").join(
                k.select("rank", "pg_name").unique(), on=["rank", "pg_name"]
            )
            pp = full.select("rank", "pg_name", "pg_ranks").drop_nulls("pg_ranks")
        pp = pp.unique(["rank"], keep="first").select("rank", "pg_ranks")
        key = pl.col("pg_ranks").list.sort().cast(pl.List(pl.String)).list.join(",")
        sizes = pp.select("rank", key.alias("pp_key"), pl.col("pg_ranks").list.len().cast(pl.Int64).alias("pp_size"))
        # Stage = position of the rank in its (sorted) pipeline group.
        stage = (
            pp.explode("pg_ranks")
            .group_by("rank")
            .agg((pl.col("pg_ranks") < pl.col("rank")).sum().cast(pl.Int64).alias("pp_stage"))
        )
        return stage.join(sizes, on="rank").select("rank", "pp_stage", "pp_size", "pp_key").sort("rank")
