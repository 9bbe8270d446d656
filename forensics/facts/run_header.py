"""The run header: ranks, hosts and GPUs seen and expected, and which sources were used or ignored.

Seen = named by any parsed input (trace metadata, NCCL init lines, file names, kernel logs). Expected =
the world size from trace metadata (`distributedInfo.world_size`) or NCCL init lines (`nranks`), and
the node count NCCL prints (`nNodes`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import polars as pl

from forensics.base.frames import JobFrames


def _gpus(ident: pl.DataFrame) -> list[dict[str, Any]]:
    rows = ident.filter(pl.col("bus_id").is_not_null()).select("host", "bus_id", "rank").unique()
    rows = rows.sort(["host", "bus_id", "rank"], nulls_last=True).unique(["host", "bus_id"], keep="first",
                                                                           maintain_order=True)
    return [{"host": r["host"], "pci_bus_id": r["bus_id"], "rank": r["rank"]} for r in rows.iter_rows(named=True)]


def run_facts(frames: JobFrames, ident: pl.DataFrame, ranks_seen: list[int], hosts_seen: list[str],
              world_of: tuple[int | None, str | None]) -> dict[str, Any]:
    """The `run` facts of findings.json beyond path and sources (schema: `run`), from the job context's
    ``identity``, ``ranks``, ``hosts`` and ``world`` (``JobContext.run`` calls this once a job)."""
    ranks = set(ranks_seen) | set(ident["rank"].drop_nulls().to_list())
    hosts = set(hosts_seen) | set(ident["host"].drop_nulls().to_list())
    if frames.has("kernel_events"):
        hosts |= set(frames["kernel_events"]["host"].drop_nulls().to_list())
    world, world_src = world_of
    nnodes = frames["nccl_comms"]["nnodes"].drop_nulls() if frames.has("nccl_comms") else pl.Series([], dtype=pl.Int32)
    src = frames["sources"]
    ignored = src.filter(pl.col("status").is_in(["ignored", "failed"])).sort("path")
    return {
        "world_size": world,
        "world_size_source": world_src,
        "ranks": sorted(ranks),
        "ranks_missing": sorted(set(range(world)) - ranks) if world else [],
        "hosts": sorted(hosts),
        "hosts_expected": int(nnodes.max()) if nnodes.len() else None,  # type: ignore[arg-type]
        "gpus": _gpus(ident),
        "sources_used": int(src.filter(pl.col("status").is_in(["ok", "partial"])).height),
        "sources_ignored": [{"path": r["path"], "status": r["status"], "reason": r["message"]}
                            for r in ignored.iter_rows(named=True)],
    }


def _same(text: str) -> str:
    return text


def header_lines(run: dict[str, Any], esc: Callable[[str], str] = _same) -> list[str]:
    """The run header in plain words; ``esc`` escapes what comes from the input (host names, paths,
    reasons) for the report's markup (HTML escapes whole lines instead)."""
    world, hosts = run["world_size"], [esc(h) for h in run["hosts"]]
    line = f"{len(run['ranks'])} rank(s) on {len(hosts)} host(s)"
    if hosts:
        line += f" ({', '.join(hosts[:16])}{' ...' if len(hosts) > 16 else ''})"
    if world:
        line += f"; world size {world} from {run['world_size_source']}"
    if run["hosts_expected"]:
        line += f"; {run['hosts_expected']} host(s) expected"
    if run["ranks_missing"]:
        miss = run["ranks_missing"]
        line += f"; no data for rank(s) {', '.join(map(str, miss[:16]))}{' ...' if len(miss) > 16 else ''}"
    lines = [line]
    if run["gpus"]:
        gp = [f"{esc(str(g['host']))} {esc(str(g['pci_bus_id']))}" + (f" (rank {g['rank']})" if g["rank"] is not None else "")
              for g in run["gpus"][:32]]
        lines.append(f"{len(run['gpus'])} GPU(s): " + "; ".join(gp) + (" ..." if len(run["gpus"]) > 32 else ""))
    ign = run["sources_ignored"]
    lines.append(f"{run['sources_used']} source(s) used, {len(ign)} ignored or unreadable"
                 + (": " + "; ".join(f"{esc(s['path'])} ({esc(str(s['reason'] or s['status']))})" for s in ign[:20])
                    if ign else ""))
    return lines
