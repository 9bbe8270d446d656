"""The job's NCCL setup (hosts, node and rank counts, GPU generations, NCCL_* settings) and the evidence helpers
the nccl_* detectors share."""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import polars as pl

from forensics.base.frames import JobFrames
from forensics.facts import identity
from forensics.facts.nccl_cost import arch_from_gpu_name


@dataclass
class JobNccl:
    ident: pl.DataFrame  # host, pid, cuda_dev, rank, bus_id, how, trace_rank
    hosts: list[str]
    nnodes: int | None  # from `comm ... nNodes`, else distinct hosts when > 1, else None
    nranks: int | None  # the job's world size (JobContext.world), else NCCL's thread thresholds
    archs: dict[str, str]  # gpu name -> generation
    env: dict[str, str]  # last value per NCCL_* variable

    @property
    def multi_node(self) -> bool:
        return (self.nnodes or 1) > 1


def job_nccl(frames: JobFrames, ident: pl.DataFrame, world_size: int | None) -> JobNccl:
    """The job's NCCL setup from the NCCL logs' identities (``JobContext.log_identity``) and the job's world size;
    detectors read it as ``ctx.nccl``, which calls this once a job."""
    hosts: set[str] = set()
    for name in ("nccl_comms", "nccl_net", "nccl_channels", "nccl_events"):
        hosts |= set(frames[name]["host"].drop_nulls().to_list())
    if frames.has("ranks"):
        hosts |= set(frames["ranks"]["host"].drop_nulls().to_list())
    comms = frames["nccl_comms"]
    nnodes = _max_int(comms["nnodes"])
    if nnodes is None and len(hosts) > 1:
        nnodes = len(hosts)
    # the world size is the context's (trace metadata, NCCL init lines); the ring thread threshold (8 per
    # rank) is a lower bound only the NCCL logs give, for logs that lost their init lines
    tt = _max_int(frames["nccl_events"].filter(pl.col("kind") == "thread_thresholds")["value"])
    sizes = [v for v in (world_size, tt) if v is not None]
    names = set(comms["gpu_name"].drop_nulls().to_list())
    if frames.has("ranks"):
        names |= set(frames["ranks"]["gpu_name"].drop_nulls().to_list())
    archs = {n: a for n in names if (a := arch_from_gpu_name(n))}
    env_df = frames["nccl_env"].sort("line")
    env = {r["var"]: r["value"] for r in env_df.iter_rows(named=True)}
    return JobNccl(ident, sorted(hosts), int(nnodes) if nnodes else None, int(max(sizes)) if sizes else None,
                   archs, env)


def _max_int(s: pl.Series) -> int | None:
    """The largest value of an integer column; None when it has none."""
    s = s.drop_nulls()
    return int(cast(int, s.max())) if s.len() else None


def where(df: pl.DataFrame, ident: pl.DataFrame) -> tuple[tuple[int, ...], tuple[str, ...], tuple[str, ...]]:
    """Ranks, hosts and GPU bus ids of the processes behind the rows of ``df``."""
    if df.height == 0:
        return (), (), ()
    cols = [c for c in ("host", "pid", "cuda_dev", "rank") if c in df.columns]
    d = df.select(cols)
    if {"host", "pid", "cuda_dev"} <= set(cols):
        d = identity.attach(d if "rank" in cols else d.with_columns(pl.lit(None, pl.Int32()).alias("rank")), ident)
    ranks = tuple(sorted(set(d["rank"].drop_nulls().to_list()))) if "rank" in d.columns else ()
    hosts = tuple(sorted(set(d["host"].drop_nulls().to_list()))) if "host" in d.columns else ()
    gpus = tuple(sorted(set(d["bus_id"].drop_nulls().to_list()))) if "bus_id" in d.columns else ()
    return ranks, hosts, gpus


def evidence(df: pl.DataFrame, cols: tuple[str, ...], limit: int = 10) -> tuple[dict, ...]:
    keep = [c for c in cols if c in df.columns]
    return tuple(df.select(keep).head(limit).to_dicts())
