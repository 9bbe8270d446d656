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
    single_node: bool = False  # proven: the layout says 1 node, or one host holds every rank of the job

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
    layout = _max_int(comms["nnodes"])
    nnodes = layout if layout is not None else _nodes_seen(hosts, ident)
    # the world size is the context's (trace metadata, NCCL init lines); the ring thread threshold (8 per
    # rank) is a lower bound only the NCCL logs give, for logs that lost their init lines
    tt = _max_int(frames["nccl_events"].filter(pl.col("kind") == "thread_thresholds")["value"])
    # a ring (`Channel 00/02 :    0   1`) lists every rank of its communicator
    ring = _max_int(frames["nccl_events"].filter(pl.col("kind") == "ring_order")["message"]
                    .str.split(" ").list.len())
    # nccl-tests lists every rank of the test (`#  Rank  7 Group  0 Pid ... on host device 7 [...] GPU`)
    listed = comms.filter(pl.col("origin") == "nccl-tests")["rank"].drop_nulls().n_unique() or None
    sizes = [v for v in (world_size, tt, ring, listed) if v is not None]
    names = set(comms["gpu_name"].drop_nulls().to_list())
    if frames.has("ranks"):
        names |= set(frames["ranks"]["gpu_name"].drop_nulls().to_list())
    archs = {n: a for n in names if (a := arch_from_gpu_name(n))}
    env_df = frames["nccl_env"].sort("line")
    env = {r["var"]: r["value"] for r in env_df.iter_rows(named=True)}
    nranks = int(max(sizes)) if sizes else None
    held = set(ident.filter(pl.col("rank").is_not_null())["rank"].to_list())
    if frames.has("ranks"):
        held |= set(frames["ranks"]["rank"].drop_nulls().to_list())
    single = layout == 1 if layout is not None else (nnodes is None and _one_host_holds_all(hosts, held, nranks))
    return JobNccl(ident, sorted(hosts), int(nnodes) if nnodes else None, nranks, archs, env, single)


def _nodes_seen(hosts: set[str], ident: pl.DataFrame) -> int | None:
    """Nodes told by host names; one name used by several nodes (anonymised or default `ubuntu`) shows as one
    GPU index driven by several processes of different ranks. None when the logs show one node or none."""
    ranked = ident.filter(pl.col("rank").is_not_null() & pl.col("cuda_dev").is_not_null() & pl.col("pid").is_not_null())
    per_dev = ranked.group_by("host", "cuda_dev").agg(pl.col("pid").n_unique().alias("n"))
    dup = int(cast(int, per_dev["n"].max())) if per_dev.height else 1
    n = max(len(hosts), dup)
    return n if n > 1 else None


def _one_host_holds_all(hosts: set[str], held: set[int], nranks: int | None) -> bool:
    """Whether the job is proven to run on one node: one host name, and its processes hold every rank."""
    return len(hosts) == 1 and bool(nranks) and len(held) >= (nranks or 0)


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
