"""What the trace detectors can see: ranks with data against the ranks the job has, and who is who.

A cross-rank finding is only as strong as the ranks behind it. With partial inputs (e.g. one rank's
trace of six) a detector works from the ranks that have data, names the missing ones, never blames a
rank without data, and lowers its confidence; :class:`Coverage` carries those facts.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import polars as pl

from forensics.base import frames as fr
from forensics.base.confidence import LEVELS, at_most, evidence_confidence
from forensics.facts.context import JobContext

__all__ = ["LEVELS", "Coverage", "at_most", "coverage", "gpus_of", "rank_list"]


def rank_list(ranks: Iterable[int]) -> str:
    """``0, 2-5, 7``: sorted ranks with consecutive runs collapsed (for texts and metrics)."""
    rs = sorted(set(ranks))
    runs: list[list[int]] = []
    for r in rs:
        if runs and r == runs[-1][-1] + 1:
            runs[-1].append(r)
        else:
            runs.append([r])
    return ", ".join(str(g[0]) if len(g) == 1 else f"{g[0]}-{g[-1]}" for g in runs)


@dataclass(frozen=True)
class Coverage:
    """Ranks the job has (``expected``: world size from trace metadata or NCCL init lines, members of
    its process groups and collectives) against ranks whose traces gave steps (``with_data``), and
    the number of profiled steps measured."""

    expected: tuple[int, ...]
    with_data: tuple[int, ...]
    steps: int

    @property
    def missing(self) -> tuple[int, ...]:
        return tuple(sorted(set(self.expected) - set(self.with_data)))

    @property
    def lone_rank(self) -> bool:
        """One rank's trace of a multi-rank job: nothing to compare its collectives with."""
        return len(self.with_data) == 1 and len(self.expected) > 1

    def confidence(self, sizes_known: bool | None = None) -> str:
        """From the evidence (:func:`forensics.base.confidence.evidence_confidence`): high with every rank, two
        steps or more and (where the claim rests on the wait/transfer split) collective sizes known; medium
        with at least half the ranks; low below that, or for a lone rank."""
        return evidence_confidence(len(self.with_data), len(self.expected), self.steps, sizes_known)

    def metrics(self) -> dict[str, int | str]:
        return {"ranks_expected": len(self.expected), "ranks_with_data": len(self.with_data),
                "ranks_without_data": rank_list(self.missing)}

    def sentence(self) -> str:
        """A sentence naming the ranks without data, or '' when every rank has data."""
        if not self.missing:
            return ""
        return (f" Rank(s) {rank_list(self.missing)} ({len(self.missing)} of {len(self.expected)}) have no trace "
                "and are neither judged nor blamed.")


def _world_ranks(ctx: JobContext) -> set[int]:
    """Ranks the job has by its own account: its world size (JobContext.world), group members."""
    out = set(range(ctx.world_size or 0))
    if ctx.frames.has("process_groups"):
        declared = ctx.frames["process_groups"].filter(pl.col("declared"))
        # each member list once (by its pg_id; lists without one as they are), each member once: every rank
        # declares its groups, so the rows hold ranks x members numbers, 16.7 M per world-sized group at 4,096 ranks
        lists = pl.concat([fr.pg_members(declared).select("pg_ranks"),
                           declared.filter(pl.col("pg_id").is_null()).select("pg_ranks")])
        out |= set(lists["pg_ranks"].explode().drop_nulls().unique().to_list())
    return out


def coverage(ctx: JobContext) -> Coverage:
    """Ranks with data (steps measured on the GPU timeline) against the ranks the job has."""
    steps = ctx.steps
    with_data = set(steps["rank"].drop_nulls().to_list())
    expected = _world_ranks(ctx) | with_data
    inc = ctx.match.incomplete
    if "missing_ranks" in inc.columns:
        expected |= set(inc["missing_ranks"].explode().drop_nulls().to_list())
    return Coverage(
        expected=tuple(sorted(int(r) for r in expected)),
        with_data=tuple(sorted(int(r) for r in with_data)),
        steps=int(steps["step"].n_unique()) if steps.height else 0,
    )


def gpus_of(ctx: JobContext, ranks: Iterable[int]) -> dict[int, str]:
    """Rank -> PCI bus id of its GPU through the job's identity join (``JobContext.identity``: NCCL init
    lines joined to the traced processes); ranks the inputs say nothing about are left out."""
    wanted = [int(r) for r in ranks]
    if not wanted:
        return {}
    ident = ctx.identity
    if ident.height == 0:
        return {}
    rank = pl.coalesce("trace_rank", "rank") if "trace_rank" in ident.columns else pl.col("rank")
    found = (
        ident.filter(pl.col("bus_id").is_not_null())
        .select(rank.alias("r"), "bus_id")
        .filter(pl.col("r").is_in(wanted))
        .sort("r", "bus_id")
        .unique("r", keep="first", maintain_order=True)
    )
    return {int(r): str(b) for r, b in found.iter_rows()}
