"""Where a GPU fault happened: the host a log belongs to, the ranks on a GPU (through the shared identity
frame, forensics.facts.identity.identities) and the profiled window of each host."""

from __future__ import annotations

import re
from typing import Any

import polars as pl

from forensics.base.bus_ids import normalize_bus_id
from forensics.base.frames import JobFrames
from forensics.base.hosts import short_host

Key = tuple[str | None, Any]


def host_key(h: str | None) -> str | None:
    """Join key for host names: short and case-insensitive."""
    s = short_host(h)
    return s.lower() if s else None


def _add(d: dict[Key, set[int]], key: Key, rank: int) -> None:
    d.setdefault(key, set()).add(rank)


class Placement:
    """Hosts, GPU -> rank maps and profiled windows of the job (every frame optional).

    Ranks come from the identity frame: traced processes by (host, device) and (host, pid), log processes
    by (host, pid) and their GPU's bus id; ``nvidia-smi -q`` turns a bus id into the device index.
    """

    def __init__(self, frames: JobFrames, ident: pl.DataFrame) -> None:
        self.rank_by_dev: dict[Key, set[int]] = {}
        self.rank_by_pid: dict[Key, set[int]] = {}
        self.rank_by_bus: dict[Key, set[int]] = {}
        self.ranks_by_host: dict[str | None, set[int]] = {}
        self.traced_ranks: set[int] = set()
        known: set[str] = set()
        for r in ident.filter(pl.col("rank").is_not_null()).iter_rows(named=True):
            self._add_process(r, known)
        known |= {s for s in (short_host(h) for h in frames["ranks"]["host"].drop_nulls().to_list()) if s}
        self.known_hosts = sorted(known)
        # a host's nvidia-smi names its GPUs by index and bus id (hosts guessed from the file path)
        self.index_by_bus: dict[tuple[str | None, str], int] = {}
        self.bus_by_index: dict[tuple[str | None, int], str] = {}
        gh = frames["gpu_health"]
        for h, src, idx, bus in gh.select("host", "source", "gpu_index", "pci_bus_id").iter_rows():
            if idx is not None and bus is not None:
                hk = host_key(h) or host_key(self.host_for(None, src))
                self.index_by_bus[(hk, bus)] = idx
                self.bus_by_index[(hk, idx)] = bus
        self.window = _profiled_windows(frames)

    def _add_process(self, r: dict[str, Any], known: set[str]) -> None:
        hk = host_key(r["host"])
        tr = r["trace_rank"]
        if tr is not None:  # what the trace says about this process
            self.ranks_by_host.setdefault(hk, set()).add(tr)
            self.traced_ranks.add(tr)
            if r["cuda_dev"] is not None:
                _add(self.rank_by_dev, (hk, r["cuda_dev"]), tr)
            if r["pid"] is not None:
                _add(self.rank_by_pid, (hk, r["pid"]), tr)
            if short_host(r["host"]):
                known.add(short_host(r["host"]))  # type: ignore[arg-type]
        if r["how"] == "trace":
            return
        if r["pid"] is not None:  # what the logs say
            _add(self.rank_by_pid, (hk, r["pid"]), r["rank"])
        bus = normalize_bus_id(r["bus_id"], bare="packed")
        if bus is not None:
            _add(self.rank_by_bus, (hk, bus), r["rank"])
            if short_host(r["host"]):
                known.add(short_host(r["host"]))  # type: ignore[arg-type]

    def learn_hosts(self, names: list[str | None]) -> None:
        """Hosts named inside any kernel log are known hosts too: `n1/dmesg.log` then belongs to `n1`."""
        named = {s for s in (short_host(h) for h in names) if s}
        self.known_hosts = sorted(set(self.known_hosts) | named)

    def host_for(self, host: str | None, source: str) -> str | None:
        """The line's own host, else the known host the file's path names, else the job's only host."""
        if host:
            return short_host(host)
        parts = [p.lower() for p in re.split(r"[/._-]+", source) if p]
        whole = [p.lower() for p in source.split("/")]
        for known in self.known_hosts:
            h = known.lower()
            if h in whole or h in parts or any(p.startswith((h + ".", h + "_", h + "-")) for p in whole):
                return known
        if len(self.known_hosts) == 1:
            return self.known_hosts[0]
        return None

    def ranks_for(self, host: str | None, gpu: str | None, pids: set[int]) -> set[int]:
        """Ranks on ``gpu`` of ``host`` (by bus id, else by nvidia-smi index) and those of ``pids``."""
        out: set[int] = set()
        hk = host_key(host)
        if gpu:
            out |= self.rank_by_bus.get((hk, gpu), set())
            idx = self.index_by_bus.get((hk, gpu))
            if idx is None:
                # no nvidia-smi on that host: a single nvidia-smi of the whole job may still say it
                cands = {i for (h, b), i in self.index_by_bus.items() if b == gpu and h is None}
                idx = cands.pop() if len(cands) == 1 else None
            if idx is not None:
                out |= self.rank_by_dev.get((hk, idx), set())
        for pid in pids:
            out |= self.rank_by_pid.get((hk, pid), set())
        return out

    def gpu_buses(self) -> frozenset[str]:
        """Bus ids known as GPUs from nvidia-smi and the NCCL init lines (any host)."""
        return frozenset(b for _, b in self.index_by_bus) | frozenset(b for _, b in self.rank_by_bus)

    def window_of(self, host: str | None) -> tuple[int, int] | None:
        """The host's profiled window; an unnamed host gets the job's only one."""
        win = self.window.get(host_key(host))
        if win is None and len(self.window) == 1 and host is None:
            return next(iter(self.window.values()))
        return win


def _profiled_windows(frames: JobFrames) -> dict[str | None, tuple[int, int]]:
    """Profiled window per host (epoch ns only: trace clocks of another domain cannot be compared)."""
    window: dict[str | None, tuple[int, int]] = {}
    for name in ("steps", "kernels"):
        df = frames[name]
        if not df.height:
            continue
        # grouped by the host as written, then by its key: host_key runs once per name, not per row
        w = (df.filter(pl.col("start_ns") > 10**18)
             .group_by("host")
             .agg(pl.col("start_ns").min().alias("lo"), pl.col("end_ns").max().alias("hi")))
        for raw, lo, hi in w.iter_rows():
            if lo is None:
                continue
            h = host_key(raw)
            old = window.get(h)
            window[h] = (min(lo, old[0]), max(hi, old[1])) if old else (lo, hi)
    return window
