"""An incident being assembled, the book of a host's open incidents, and the passes that merge them."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from itertools import islice
from typing import TYPE_CHECKING, Any

from forensics.base.xid_catalog import max_level
from forensics.facts.kernel_events import Event

if TYPE_CHECKING:
    from forensics.detectors.gpu_hw_error.config import GpuHwErrorConfig

# candidates scanned per lookup: a host's incidents are in time order, so one far back in that list is
# far back in time (the cap keeps huge logs linear)
LATEST_SCAN_CAP = 128


class Incident:
    """Events grouped into one incident, with its level, actions, title and facts."""

    __slots__ = ("kind", "host", "gpu", "track", "events", "level", "actions", "title", "facts", "clock",
                 "first_t", "last_t", "last_line", "source", "boot", "group", "ranks_pid", "root_t")

    def __init__(self, kind: str, ev: Event, track: tuple, level: str, actions: str, title: str,
                 group: str = "hw") -> None:
        self.kind = kind
        self.host: str | None = ev["host"]
        self.gpu: str | None = ev.get("pci_bus_id") if track and track[0] == "gpu" else None
        self.track = track
        self.events: list[Event] = []
        self.level = level
        self.actions: list[str] = []
        self.title = title
        self.facts: dict[str, Any] = {}
        self.clock: str = ev["clock"]
        self.first_t: int | None = ev["t"]
        self.root_t: int | None = ev["t"]  # the event that opened the incident (precursors may come earlier)
        self.last_t: int | None = ev["t"]
        self.last_line: int = ev["line"]
        self.source: str = ev["source"]
        self.boot = ev["boot"]
        self.group = group
        self.ranks_pid: set[int] = set()
        self.add(ev, level, actions)

    def add(self, ev: Event, level: str | None = None, actions: str | None = None) -> None:
        self.events.append(ev)
        if level:
            self.level = max_level(self.level, level)
        for a in (actions or "").split(";"):
            if a and a not in self.actions:
                self.actions.append(a)
        if ev["t"] is not None and ev["clock"] == self.clock:
            self.first_t = ev["t"] if self.first_t is None else min(self.first_t, ev["t"])
            self.last_t = ev["t"] if self.last_t is None else max(self.last_t, ev["t"])
        self.last_line = max(self.last_line, ev["line"])

    def add_level(self, level: str, actions: str) -> None:
        """Raise the incident to at least ``level`` and add ``actions`` (no event)."""
        self.level = max_level(self.level, level)
        self.actions += [a for a in actions.split(";") if a and a not in self.actions]

    def close_to(self, ev: Event, window_s: float, lines: int) -> bool:
        """``ev`` is on this incident's timeline and within ``window_s`` of it (``lines`` when untimed)."""
        if ev["source"] != self.source and (ev["clock"] != "wall" or self.clock != "wall"):
            return False
        if ev["clock"] != self.clock:
            return False
        if ev["clock"] == "none":
            return bool(ev["boot"] == self.boot and 0 <= ev["line"] - self.last_line <= lines)
        if ev["clock"] == "mono" and ev["boot"] != self.boot:
            return False
        lo = (self.first_t or 0) - window_s * 1e9
        hi = (self.last_t or 0) + window_s * 1e9
        return bool(lo <= ev["t"] <= hi)


class Book:
    """The incidents of a kernel log being assembled, per host, and the lookups handlers join through."""

    def __init__(self, cfg: GpuHwErrorConfig, benign: dict[str | None, int],
                 known_gpus: frozenset[str] = frozenset()) -> None:
        self.cfg = cfg
        self.known_gpus = known_gpus  # bus ids that are GPUs (nvidia-smi, NCCL, the driver's own lines)
        self.benign = benign
        self.incs: list[Incident] = []
        self.by_host: dict[str | None, list[Incident]] = {}
        self.host: str | None = None  # the host of the event being handled
        self.aer_rows: list[Event] = []  # AER lines are grouped into records once all are read
        self.gsp_bus: dict[tuple[str | None, str, int], str] = {}  # (host, source, GPU instance) -> bus id

    def open(self, inc: Incident) -> Incident:
        self.incs.append(inc)
        self.by_host.setdefault(inc.host, []).append(inc)
        return inc

    def _candidates(self) -> Iterator[Incident]:
        """The current host's incidents, newest first, at most LATEST_SCAN_CAP of them."""
        return islice(reversed(self.by_host.get(self.host, ())), LATEST_SCAN_CAP)

    def latest(self, pred: Callable[[Incident], bool]) -> Incident | None:
        """The current host's newest incident that ``pred`` accepts."""
        return next((inc for inc in self._candidates() if pred(inc)), None)

    def near(self, ev: Event, pred: Callable[[Incident], bool], window_s: float | None = None) -> Incident | None:
        """The newest incident ``pred`` accepts within ``window_s`` (default: ``incident_gap_s``) of ``ev``."""
        win = self.cfg.incident_gap_s if window_s is None else window_s
        lines = self.cfg.untimed_line_window
        return next((inc for inc in self._candidates() if pred(inc) and inc.close_to(ev, win, lines)), None)

    def count_benign(self, ev: Event) -> None:
        self.benign[ev["host"]] = self.benign.get(ev["host"], 0) + 1


def same_timeline(a: Event, b: Event) -> bool:
    """Two events whose times compare: wall clock on the same host, or the same file and boot."""
    if a["clock"] != b["clock"] or a["host"] != b["host"]:
        return False
    return bool(a["clock"] == "wall" or (a["source"] == b["source"] and a["boot"] == b["boot"]))


def merge_nvlink5_node(incs: list[Incident]) -> None:
    """Xid 45 'caused by previous Xid 14x' on several GPUs: the NVLink5 incidents are one node incident."""
    by_host: dict[str | None, list[Incident]] = {}
    for inc in incs:
        if inc.kind == "nvlink5" and 45 in {e["xid"] for e in inc.events if e["kind"] == "xid"}:
            by_host.setdefault(inc.host, []).append(inc)
    for group in by_host.values():
        if len({i.gpu for i in group}) < 2:
            continue
        keep = group[0]
        keep.facts["node_level"] = True
        keep.facts["gpus"] = {g for i in group for g in (i.facts.get("gpus") or {i.gpu}) if g}
        for other in group[1:]:
            for e in other.events:
                keep.add(e, other.level, ";".join(other.actions))
            for fact in ("xids", "chain_roots", "units", "links"):
                if other.facts.get(fact):
                    keep.facts.setdefault(fact, set()).update(other.facts[fact])
            keep.ranks_pid |= other.ranks_pid
            incs.remove(other)


def mark_fleet_patterns(incs: list[Incident], fleet_min_hosts: int) -> None:
    """The same GSP/firmware Xid on many hosts of one job: a driver/firmware problem, not N bad GPUs."""
    hosts: dict[int, set[str]] = {}
    for inc in incs:
        for x in inc.facts.get("xids", set()) & {62, 119, 120}:
            if inc.host:
                hosts.setdefault(x, set()).add(inc.host)
    for x, hs in hosts.items():
        if len(hs) < fleet_min_hosts:
            continue
        for inc in incs:
            if x in inc.facts.get("xids", set()):
                inc.facts["fleet_pattern"] = f"Xid {x} on {len(hs)} hosts: suspect the driver/firmware"
                if "INVESTIGATE_SW" not in inc.actions:
                    inc.actions.append("INVESTIGATE_SW")
