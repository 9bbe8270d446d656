"""Hand-built HSDP jobs with slow NICs, for the slow_link tests (plain event lists, no detector code).

4 nodes x 8 GPUs = 32 ranks, hybrid-sharded data parallel: two shard groups of 16 ranks (nodes 0+1 and
2+3) all-gather and reduce-scatter, sixteen 2-rank replicate groups ``{i, 16 + i}`` (node 0 with node 2,
node 1 with node 3) all-reduce. Each rank's NCCL connections use the NIC of its local GPU index
(``mlx5_<local>:1``, as on a rail-optimised HGX node). A communicator whose traffic crosses a slow NIC
moves its data ``factor`` times slower.
"""

from __future__ import annotations

import polars as pl

from forensics.base.frames import JobFrames, conform
from tests.frame_builders import MS, US, _Rows

NODES, GPUS = 4, 8
WORLD = NODES * GPUS


def hsdp_groups() -> list[tuple[str, str, list[int]]]:
    shard = [(f"shard{s}", "dp_shard", list(range(16 * s, 16 * s + 16))) for s in range(2)]
    replicate = [(f"rep{i}", "dp_replicate", [i, 16 + i]) for i in range(16)]
    return shard + replicate


def _nic(rank: int) -> tuple[int, int]:
    return rank // GPUS, rank % GPUS


def hsdp_job(slow_nics: set[tuple[int, int]] | None = None, slow_groups: set[str] | None = None,
             factor: float = 3.0, steps: int = 3, compute_ns: int = 20 * MS, tx_ns: int = 1 * MS,
             nccl_logs: bool = True) -> JobFrames:
    """``slow_nics``: (node, local GPU) whose NIC is slow; ``slow_groups``: groups made slow directly
    (a fault on a path that no host has in common)."""
    slow_nics, slow_groups = slow_nics or set(), slow_groups or set()
    rows = _Rows()
    groups = hsdp_groups()
    t = {r: 1_000 * MS for r in range(WORLD)}
    for s in range(steps):
        start = dict(t)
        for r in range(WORLD):
            rows.kernel(r, t[r], t[r] + compute_ns, "compute", launch=start[r])
            t[r] += compute_ns
        for op, desc, nbytes in (("allgather", "dp_shard", 64 << 20), ("reduce_scatter", "dp_shard", 64 << 20),
                                 ("allreduce", "dp_replicate", 16 << 20)):
            done = dict(t)
            for name, gdesc, members in groups:
                if gdesc != desc:
                    continue
                slow = name in slow_groups or any(_nic(m) in slow_nics for m in members)
                end = max(t[m] for m in members) + int(tx_ns * (factor if slow else 1.0))
                for m in members:
                    rows.kernel(m, t[m], end, "comm", launch=start[m], collective=op, pg_name=name, pg_desc=gdesc,
                                pg_ranks=members, group_size=len(members), bytes=nbytes, grid=8)
                    done[m] = end
            t = done
        for r in range(WORLD):
            end = t[r] + 50 * US
            rows.steps.append(dict(rank=r, host=f"node{r // GPUS}", source=f"r{r}.json", step=s,
                                   start_ns=start[r], end_ns=end))
            t[r] = end
    frames = rows.frames(WORLD, groups)
    if not nccl_logs:
        return frames
    return JobFrames({**{k: frames[k] for k in ("kernels", "cpu_ops", "steps", "ranks", "process_groups")},
                      **nccl_frames()})


def nccl_frames() -> dict[str, pl.DataFrame]:
    """The NCCL init lines of the job: every process lists the node's 8 HCAs (``NET/IB : Using``) and
    connects through the one of its local GPU (``via NET/IB/<local>``)."""
    net, ch, comms = [], [], []
    for r in range(WORLD):
        node, local = _nic(r)
        proc = dict(source=f"logs/rank{r}.out", host=f"node{node}", pid=1000 + r, cuda_dev=local, rank=r)
        comms.append(dict(proc, line=1, origin="init", comm=f"0x{r:x}", nranks=WORLD, bus_id=f"0000:{0x18 + local:02x}:00.0",
                          phase="Init COMPLETE"))
        for i in range(GPUS):
            net.append(dict(proc, line=2, kind="ib", index=i, name=f"mlx5_{i}", port=1, link_layer="IB"))
        for c in range(2):
            ch.append(dict(proc, line=3 + c, channel=c, src_rank=r, dst_rank=(r + 8) % WORLD, direction="send",
                           transport="NET", net="IB", nic=local, gdr=True))
    return {"nccl_net": conform("nccl_net", pl.DataFrame(net)),
            "nccl_channels": conform("nccl_channels", pl.DataFrame(ch)),
            "nccl_comms": conform("nccl_comms", pl.DataFrame(comms))}
