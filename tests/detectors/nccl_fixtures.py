"""Small synthetic NCCL logs (hand-written in the exact NCCL formats) for the detector tests."""

from __future__ import annotations

from pathlib import Path

from forensics.parsers.nccl_log import parse
from forensics.parsers.result import ParseContext

from forensics.base.frames import JobFrames


def frames_from(tmp_path: Path, text: str, name: str = "rank.log") -> JobFrames:
    p = tmp_path / name
    p.write_text(text)
    res = parse(p, ParseContext(tmp_path, name))
    return JobFrames(res.frames)


# two nodes x 2 GPUs, NCCL 2.21 formats, healthy: NVLink P2P inside, IB with GDR between nodes
HEALTHY = """\
nodeA:100:100 [0] NCCL INFO NCCL version 2.21.5+cuda12.4
nodeA:100:100 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB [RO]; OOB eth0:10.0.0.1<0>
nodeA:100:100 [0] NCCL INFO Using network IB
nodeB:200:200 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB [RO]; OOB eth0:10.0.0.2<0>
nodeA:100:110 [0] NCCL INFO ncclCommInitRank comm 0x1 rank 0 nranks 4 cudaDev 0 nvmlDev 0 busId 18000 commId 0xabc - Init COMPLETE
nodeA:101:111 [1] NCCL INFO ncclCommInitRank comm 0x2 rank 1 nranks 4 cudaDev 1 nvmlDev 1 busId 2a000 commId 0xabc - Init COMPLETE
nodeB:200:210 [0] NCCL INFO ncclCommInitRank comm 0x3 rank 2 nranks 4 cudaDev 0 nvmlDev 0 busId 18000 commId 0xabc - Init COMPLETE
nodeB:201:211 [1] NCCL INFO ncclCommInitRank comm 0x4 rank 3 nranks 4 cudaDev 1 nvmlDev 1 busId 2a000 commId 0xabc - Init COMPLETE
nodeA:100:110 [0] NCCL INFO comm 0x1 rank 0 nRanks 4 nNodes 2 localRanks 2 localRank 0 MNNVL 0
nodeA:100:110 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read
nodeA:101:111 [1] NCCL INFO Channel 00/0 : 1[1] -> 2[0] [send] via NET/IB/1/GDRDMA
nodeB:200:210 [0] NCCL INFO Channel 00/0 : 1[1] -> 2[0] [receive] via NET/IB/1/GDRDMA
nodeB:200:210 [0] NCCL INFO Channel 00/0 : 2[0] -> 3[1] via P2P/CUMEM/read
nodeB:201:211 [1] NCCL INFO Channel 00/0 : 3[1] -> 0[0] [send] via NET/IB/0/GDRDMA
"""  # noqa: E501 -- verbatim log lines (test data)
