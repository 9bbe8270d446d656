"""NCCL RAS (reliability, availability, serviceability) output: the communicator and process status tables, dead
peers and outliers."""

from __future__ import annotations

import re

from forensics.parsers.nccl_log.rows import Acc, to_int

RAS_VERSION = re.compile(r"^NCCL version (?P<ver>[\d.]+) compiled with CUDA (?P<cuda>[\d.]+)")

NCCL_MATRIX = re.compile(r"^\s*(?:Function|Broadcast|Reduce|AllGather|ReduceScatter|AllReduce|SendRecv|AlltoAll) \|(?:\s+(?:\d|LL|LL128|Simple))+\s+\|(?:\s+(?:\d+|\w+))+\s*$")
RAS_GROUP = re.compile(r"^\s+(?P<grp>\d+)\s+(?P<comms>\d+)\s+(?P<nodes>\d+)\s+(?P<rpn>[\d-]+)\s+(?P<rpc>\d+)\s+(?P<rig>\d+)\s+(?P<status>[A-Z]+)\s+(?P<errors>[A-Z,]+)\s*$")
RAS_PROC = re.compile(r"^\s*Process (?P<pid>\d+) on node (?P<node>\S+) managing GPU (?P<gpu>\d+)")
RAS_RANK = re.compile(r"^\s*Rank (?P<rank>\d+) -- GPU (?P<gpu>\d+) managed by process (?P<pid>\d+) on node (?P<node>\S+)")
RAS_OUTLIER = re.compile(r"^\s*Node (?P<node>\S+) running processes (?P<pids>[\d,]+)")
RAS_DEAD = re.compile(r"^\s*(?P<n>\d+) job process(?:es)? (?:is|are) considered dead")
RAS_PEER_DEAD = re.compile(r"PEER_DEAD: .*")


def ras_line(acc: Acc, text: str, n: int) -> None:
    m = RAS_GROUP.match(" " + text)
    base = dict(host=None, line=n)
    if m:
        bad = m["errors"] != "OK" or m["status"] not in ("RUNNING",)
        acc.add("nccl_events", **base, level="WARN" if bad else "INFO", kind="ras_group", code=int(m["grp"]),
                value=float(m["rpc"]), message=f"group {m['grp']}: {m['status']} {m['errors']}")
        return
    if re.fullmatch(r"(?:INCOMPLETE|MISMATCH|DEAD|TIMEOUT)\b.*|#\d+-\d+ \(\w+\) [A-Z,]+", text):
        acc.ras_error = text.split()[-1] if text.startswith("#") else text.split()[0]
        return
    m = RAS_PROC.match(text) or RAS_RANK.match(text)
    if m:
        g = m.groupdict()
        acc.add("nccl_events", **base, level="WARN", kind="ras_missing", rank=to_int(g.get("rank")),
                code=int(g["pid"]), value=float(g["gpu"]), peer=g["node"],
                message=f"{acc.ras_error or 'ERROR'}: {text}")
        return
    m = RAS_OUTLIER.match(text)
    if m:
        acc.add("nccl_events", **base, level="WARN", kind="ras_outlier", peer=m["node"], message=text)
        return
    m = RAS_DEAD.match(text) or RAS_PEER_DEAD.search(text)
    if m:
        acc.add("nccl_events", **base, level="WARN", kind="ras_dead", message=text)
