"""Process-group and instance keys of collective matching: spelled once per group and joined to the rows
(the rows never carry a rank list), they must equal the per-row definition ``pg_name|r0,r1,...``.

Expectations are spelled here in plain Python from the builder's own group lists (tests/frame_builders.py).
"""

from __future__ import annotations

import polars as pl

from forensics.base.frames import JobFrames
from forensics.facts.collectives import match_collectives
from tests.frame_builders import _link_groups, link_job

STEPS = 3


def _shared_names(frames: JobFrames) -> JobFrames:
    """link_job with one name per phase ("A"/"B"), as torch names a TP or DP group the same on every rank:
    only the rank list tells the groups of one name apart."""
    short = pl.col("pg_name").str.slice(0, 1)
    return JobFrames({
        "kernels": frames["kernels"].with_columns(short),
        "process_groups": frames["process_groups"].with_columns(short),
        "cpu_ops": frames["cpu_ops"], "steps": frames["steps"], "ranks": frames["ranks"],
    })


def _key(name: str | None, ranks: list[int] | None) -> str:
    return f"{'?' if name is None else name}|{'*' if ranks is None else ','.join(map(str, ranks))}"


def _group_of() -> dict[tuple[int, str], list[int]]:
    """(rank, phase) -> the members of that rank's group in that phase, from the builder's group list."""
    return {(r, name[0]): members for name, _, members in _link_groups() for r in members}


def _keys_by_kernel(df: pl.DataFrame) -> list[tuple[int, int, str]]:
    return sorted(df.select("rank", "start_ns", "pg_key").iter_rows())


def _expected(frames: JobFrames, listed: bool = True) -> list[tuple[int, int, str]]:
    groups = _group_of()
    k = frames["kernels"].filter(pl.col("class") == "comm")
    return sorted((r, s, _key(n, groups[(r, n)] if listed else None))
                  for r, s, n in k.select("rank", "start_ns", "pg_name").iter_rows())


def test_groups_of_one_name_are_told_apart_by_their_ranks():
    frames = _shared_names(link_job(slow_node=None, steps=STEPS))
    ck = match_collectives(frames).kernels
    assert _keys_by_kernel(ck) == _expected(frames)
    assert ck["pg_key"].n_unique() == len(_link_groups())


def test_kernels_without_a_rank_list_take_their_process_group():
    frames = _shared_names(link_job(slow_node=None, steps=STEPS))
    bare = JobFrames({**{n: frames[n] for n in ("process_groups", "cpu_ops", "steps", "ranks")},
                      "kernels": frames["kernels"].with_columns(
                          pl.when(pl.col("rank") < 8).then(None).otherwise(pl.col("pg_id")).alias("pg_id"))})
    assert _keys_by_kernel(match_collectives(bare).kernels) == _expected(frames)
    none = JobFrames({**{n: frames[n] for n in ("cpu_ops", "steps", "ranks")},
                      "kernels": frames["kernels"].with_columns(pl.lit(None, dtype=pl.Int64).alias("pg_id"))})
    assert _keys_by_kernel(match_collectives(none).kernels) == _expected(frames, listed=False)


def test_instances_are_keyed_per_group_step_and_call():
    frames = _shared_names(link_job(slow_node=None, steps=STEPS))
    m = match_collectives(frames)
    assert m.instances.height == len(_link_groups()) * STEPS
    groups = _group_of()
    assert m.kernels.height == len(_expected(frames))
    for r, name, step, key in m.kernels.select("rank", "pg_name", "step", "instance_key").iter_rows():
        assert key == f"{_key(name, groups[(r, name)])}#{step}#0"  # one call per group and step: ordinal 0
    assert m.kernels["matched"].all()


def test_a_rank_missing_from_an_instance_is_named():
    frames = _shared_names(link_job(slow_node=None, steps=STEPS))
    k = frames["kernels"]
    gone = (pl.col("rank") == 9) & (pl.col("class") == "comm") & (pl.col("pg_name") == "B")
    first_b = k.filter(gone)["start_ns"].min()
    cut = JobFrames({**{n: frames[n] for n in ("process_groups", "cpu_ops", "steps", "ranks")},
                     "kernels": k.filter(~(gone & (pl.col("start_ns") == first_b)))})
    m = match_collectives(cut)
    members = _group_of()[(9, "B")]
    assert m.incomplete.select("pg_key", "missing_ranks").rows() == [(_key("B", members), [9])]
    assert m.instances.height == len(_link_groups()) * STEPS - 1
