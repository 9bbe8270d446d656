"""Stack dumps grouped across ranks: the processes whose main thread is somewhere else than the
majority's are the suspects (ByteRobust's aggregation; wave3.md §2.8)."""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl


@dataclass(frozen=True)
class StackGroups:
    groups: pl.DataFrame  # where, stack (innermost 6 frames), n, members, ranks
    suspects: pl.DataFrame  # the main-thread rows of the suspect processes
    majority_where: str | None
    n: int


def _member(rank: int | None, process: str | None, source: str) -> str:
    return f"rank {rank}" if rank is not None else f"process {process}" if process else source


def group_stacks(stacks: pl.DataFrame, majority: float) -> StackGroups:
    """Main-thread stacks (all threads when none is marked main) grouped by where they are and by their
    innermost frames; suspects: the stacks not where more than ``majority`` of them are, else the stacks
    in a group of one when every other group has more."""
    main = stacks.filter(pl.col("main") & (pl.col("depth") > 0))
    if main.height == 0:
        main = stacks.filter(pl.col("depth") > 0)
    main = main.with_columns(
        pl.col("frames").list.head(6).list.join(" <- ").alias("stack"),
        pl.struct("rank", "process", "source").map_elements(
            lambda s: _member(s["rank"], s["process"], s["source"]), return_dtype=pl.String).alias("member"))
    groups = (main.group_by("where", "stack").agg(pl.len().alias("n"), pl.col("member"), pl.col("rank").drop_nulls(),
                                                   pl.col("line").min().alias("first_line"))
              .sort(["n", "first_line"], descending=[True, False]))
    if main.height == 0:
        return StackGroups(groups, main, None, 0)
    by_where = main.group_by("where").len().sort(["len", "where"], descending=[True, False])
    top_where, top_n = by_where.row(0)
    if top_n > majority * main.height and by_where.height > 1:
        suspects = main.filter(pl.col("where") != top_where)
    else:
        sizes = groups["n"].to_list()
        lone = [s for s, n in zip(groups["stack"].to_list(), sizes) if n == 1] if len(sizes) > 1 and min(
            sizes[:-1] or [0]) > 1 else []
        suspects = main.filter(pl.col("stack").is_in(lone))
    return StackGroups(groups, suspects, top_where, main.height)
