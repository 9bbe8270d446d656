"""How sure a finding can be, from the evidence behind it rather than a level fixed per detector.

Three facts decide it: how many of the job's ranks have data (a cross-rank comparison with half the
ranks missing, or with one rank, compares little), whether the collectives carry their message sizes
(without them the transfer part of a collective is estimated from durations alone), and how many
profiled steps were measured (one step cannot tell a persistent problem from a hiccup).
"""

from __future__ import annotations

import polars as pl

LEVELS = ("low", "medium", "high")


def at_most(a: str, b: str) -> str:
    """The lower of two confidence levels."""
    return LEVELS[min(LEVELS.index(a), LEVELS.index(b))]


def evidence_confidence(ranks_with_data: int, ranks_expected: int, steps: int, sizes_known: bool | None = None) -> str:
    """``high``: every rank has data, two steps or more and, where the claim rests on the wait/transfer split
    (``sizes_known`` not None), collective sizes known; ``medium``: at least half the ranks and more than one
    of them; ``low``: less than half of the ranks, or one rank of a multi-rank job (nothing to compare with)."""
    expected = max(1, ranks_expected, ranks_with_data)
    share = ranks_with_data / expected
    if ranks_with_data == 0 or share < 0.5 or (ranks_with_data == 1 and expected > 1):
        return "low"
    if share >= 1 and steps >= 2 and sizes_known is not False:
        return "high"
    return "medium"


def sizes_known(comm_kernels: pl.DataFrame) -> bool:
    """Whether every collective kernel (rows with ``bytes``) carries its message size; True without any."""
    return comm_kernels.height == 0 or bool(comm_kernels["bytes"].is_not_null().all())
