"""GPU, fabric and host hardware errors from kernel logs, nvidia-smi and DCGM, one finding per incident.

What it detects
    NVIDIA Xids (graded by the Xid catalog, ``forensics/data/xid_catalog.csv``), NVSwitch SXids and
    fabric-manager errors, GSP timeouts, GPUs fallen off the bus, ECC / row-remap events, NVLink and
    NVLink5 faults, PCIe AER and GHES errors, InfiniBand / mlx5 link flaps and module errors, CPU
    thermal throttling, host EDAC/MCE memory errors, OOM kills, hung tasks, soft/hard lockups and
    segfaults of training processes; plus the persistent GPU state in ``nvidia-smi -q`` (pending or
    failed row remaps, SRAM/DRAM uncorrectable errors, reset required, HW slowdown / power brake) and
    ``dcgmi diag`` failures.

Why it matters
    Most unexpected interruptions of large training runs are hardware (Llama 3: ~78% of 419, led by
    faulty GPUs and HBM). A dead or sick GPU, link or host explains a hang, a crash or a straggler
    better than any software setting, and it must be drained or reset before the job is restarted.

How it measures
    Lines are grouped into incidents, not counted: events on the same GPU closer than
    ``incident_gap_s`` form one incident (application-class Xids separately from hardware ones);
    sympathetic lines (Xid 43/45, Xid 45 "caused by previous Xid N", Xid 154's recovery action, Xid
    3, GSP lines, AER recovery, devices on the same PCI slot) join the incident they follow; a fatal
    PCIe AER followed within ``aer_xid_window_s`` by Xid 79 is one "PCIe link loss" incident, with
    corrected AER on that port in the preceding ``precursor_window_s`` as precursors; Xid 45 caused by
    an NVLink5 Xid on several GPUs is one node-level NVLink incident; the same throttle reason on at
    least half of a node's GPUs is one node-level finding. Severity comes from the catalog under
    ``policy`` (default / strict / lenient, which disagree on Xids 63, 92, 109, 121), refined by the
    payload (NVLink5 unit and fatality, Xid 154 action). Benign lines (boot noise, INIT->ACTIVE link
    training, corrected AER below ``corrected_aer_min_count`` per ``corrected_aer_window_s``, allowed
    SXids) make no finding but are counted in ``benign_events`` of every finding. GPUs are joined to
    ranks through ``nccl_comms`` bus ids, ``gpu_health`` index order + ``ranks.device``, and the Xid's
    pid; monotonic-only stamps are placed on the wall clock only when the log carries a boot time.

What to do
    Follow the finding's action: RESTART_APP for application Xids (fix the code first), RESET_GPU
    (``nvidia-smi -r`` or reboot), REBOOT_NODE, DRAIN_NODE before restarting the job, RMA_CANDIDATE
    (run ``dcgmi diag -r 3`` and open an RMA if confirmed), INSPECT_PCIE / INSPECT_LINK (reseat,
    cables, riser, BMC SEL), CHECK_COOLING / CHECK_POWER, INVESTIGATE_SW / INVESTIGATE_STORAGE.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import orjson
import polars as pl

from forensics.context import JobContext
from forensics.detectors import Skip, detector
from forensics.findings import Finding, Severity
from forensics.frames import FRAME_SPECS, JobFrames
from forensics.hosts import short_host
from forensics.settings import setting
from forensics.xid_catalog import LEVELS, POLICIES, RECOVERY_ACTIONS, decode_xid74, lookup, max_level, nvlink5_severity

# imbue cluster-health allow-list of expected SXids
BENIGN_SXIDS = frozenset({11012, 11021, 11022, 11023, 12021, 12023, 15008, 15011, 19049, 19055, 19057, 19059,
                          19062, 19065, 19068, 19071, 24001, 24002, 24003, 22013})
BENIGN_CLOCK_REASONS = frozenset({"idle", "gpu idle", "applications clocks setting", "sw power cap", "sync boost",
                                  "display clock setting", "none"})
HW_CLOCK_REASONS = {"hw slowdown": "HIGH", "hw thermal slowdown": "HIGH", "hw power brake slowdown": "HIGH",
                    "sw thermal slowdown": "WARNING"}
SYMPATHETIC_XIDS = frozenset({3, 43, 45})
# filesystem clients named in a hung task's stack: GPFS, NFS, Lustre, BeeGFS, WekaFS, CephFS, FUSE
_STORAGE_MODULE = re.compile(r"\[(mmfs26|mmfslinux|nfs|nfsv4|sunrpc|lustre|ptlrpc|lnet|beegfs|wekafsio|ceph|fuse)\]")
ACTION_ORDER = ("DRAIN_NODE", "REBOOT_NODE", "RESET_GPU", "RMA_CANDIDATE", "INSPECT_PCIE", "INSPECT_LINK",
                "CHECK_POWER", "CHECK_COOLING", "RESTART_APP", "INVESTIGATE_SW", "INVESTIGATE_STORAGE", "NONE")
ACTION_TEXT = {
    "RESTART_APP": "restart the application (fix its bug first if the Xid is application-level)",
    "RESET_GPU": "reset the GPU (`nvidia-smi -r`, or reboot where a reset is impossible)",
    "REBOOT_NODE": "reboot (cold power-cycle) the node",
    "DRAIN_NODE": "drain the node before restarting the job",
    "RMA_CANDIDATE": "run field diagnostics (`dcgmi diag -r 3`) and RMA the part if confirmed",
    "INSPECT_PCIE": "inspect the PCIe slot, riser, cabling and the BMC event log",
    "INSPECT_LINK": "inspect the NVLink/IB cable or transceiver",
    "CHECK_COOLING": "check cooling (fans, airflow, thermal interface)",
    "CHECK_POWER": "check the chassis/BMC power configuration and PSUs",
    "INVESTIGATE_SW": "investigate driver, firmware or fabric-manager software",
    "INVESTIGATE_STORAGE": "investigate the storage client/filesystem",
    "NONE": "no action needed",
}


@dataclass(frozen=True)
class GpuHwErrorConfig:
    """Xid grading policy and the windows that group hardware events into incidents."""

    policy: str = setting("default", choices=POLICIES,
                          doc="Xid severity policy: default (research consensus), strict (Azure NHC/imbue/DCGM), "
                              "lenient (NVIDIA catalog/gcm)")
    incident_gap_s: float = setting(300.0, unit="s", low=0.0,
                                    doc="events on the same GPU (switch, port, host) closer than this are one incident")
    sympathetic_window_s: float = setting(10.0, unit="s", low=0.0,
                                          doc="Xid 43/45/154, GSP and device lines join the incident they follow within this")
    aer_xid_window_s: float = setting(5.0, unit="s", low=0.0,
                                      doc="a fatal AER and an Xid 79 / fallen-off-the-bus on one host this close are one incident")
    precursor_window_s: float = setting(600.0, unit="s", low=0.0,
                                        doc="corrected AER on a port up to this long before its fatal AER are its precursors")
    untimed_line_window: int = setting(5, unit="lines", low=0,
                                       doc="logs without timestamps: events at most this many lines apart may share an incident")
    corrected_aer_min_count: int = setting(3, unit="errors", low=1,
                                           doc="corrected AER errors on one port within corrected_aer_window_s for a finding")
    corrected_aer_window_s: float = setting(60.0, unit="s", low=0.0, doc="window for corrected_aer_min_count")
    carrier_flap_min: int = setting(5, unit="events", low=1,
                                    doc="Lost carrier events per interface for a link-flap finding (Azure NHC: 5 in 24 h)")
    node_level_min_fraction: float = setting(0.5, unit="fraction of GPUs", low=0.0, high=1.0,
                                             doc="one throttle reason on this share of a node's GPUs (and >= 2) is node-level")
    max_evidence: int = setting(20, unit="lines", low=1,
                                doc="evidence lines kept per finding (the total is in evidence_total)")
    fleet_min_hosts: int = setting(3, unit="hosts", low=1,
                                   doc="one GSP/firmware Xid (62, 119, 120) on this many hosts points at software")


# --- helpers ------------------------------------------------------------------------------------


def _hk(h: str | None) -> str | None:
    """Join key for host names: short and case-insensitive."""
    s = short_host(h)
    return s.lower() if s else None


def _norm_busid(v: str | None) -> str | None:
    """NCCL `busId 3b000` / `0000:3b:00.0` / nvidia-smi `00000000:3B:00.0` -> `0000:3b:00.0`."""
    if v is None:
        return None
    t = v.strip().lower()
    m = re.fullmatch(r"(?:([0-9a-f]{1,8}):)?([0-9a-f]{2}):([0-9a-f]{2})\.([0-7])", t)
    if m:
        return f"{(m.group(1) or '0').lstrip('0').rjust(4, '0')[-4:]}:{m.group(2)}:{m.group(3)}.{m.group(4)}"
    if re.fullmatch(r"[0-9a-f]{5,12}", t):
        t = t.rjust(9, "0")
        return f"{t[-9:-5]}:{t[-5:-3]}:{t[-3:-1]}.{t[-1]}"
    return None


def _sev(level: str) -> Severity:
    return Severity.CRITICAL if level in ("CRITICAL", "HIGH") else Severity.WARNING if level == "WARNING" else Severity.INFO


class _Inc:
    """An incident being assembled."""

    __slots__ = ("kind", "host", "gpu", "track", "events", "level", "actions", "title", "facts", "clock",
                 "first_t", "last_t", "last_line", "source", "boot", "group", "ranks_pid", "root_t")

    def __init__(self, kind: str, ev: dict[str, Any], track: tuple, level: str, actions: str, title: str,
                 group: str = "hw") -> None:
        self.kind = kind
        self.host = ev["host"]
        self.gpu = ev.get("pci_bus_id") if track and track[0] == "gpu" else None
        self.track = track
        self.events: list[dict[str, Any]] = []
        self.level = level
        self.actions: list[str] = []
        self.title = title
        self.facts: dict[str, Any] = {}
        self.clock = ev["clock"]
        self.first_t = ev["t"]
        self.root_t = ev["t"]  # the event that opened the incident (precursors may come earlier)
        self.last_t = ev["t"]
        self.last_line = ev["line"]
        self.source = ev["source"]
        self.boot = ev["boot"]
        self.group = group
        self.ranks_pid: set[int] = set()
        self.add(ev, level, actions)

    def add(self, ev: dict[str, Any], level: str | None = None, actions: str | None = None) -> None:
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

    def close_to(self, ev: dict[str, Any], window_s: float, lines: int) -> bool:
        if ev["source"] != self.source and (ev["clock"] != "wall" or self.clock != "wall"):
            return False
        if ev["clock"] != self.clock:
            return False
        if ev["clock"] == "none":
            return ev["boot"] == self.boot and 0 <= ev["line"] - self.last_line <= lines
        if ev["clock"] == "mono" and ev["boot"] != self.boot:
            return False
        lo = (self.first_t or 0) - window_s * 1e9
        hi = (self.last_t or 0) + window_s * 1e9
        return lo <= ev["t"] <= hi


# --- detector ------------------------------------------------------------------------------------


@detector("gpu_hw_error", settings=GpuHwErrorConfig, requires_any=("kernel_events", "gpu_health", "gpu_diag"))
def detect(ctx: JobContext, cfg: GpuHwErrorConfig) -> list[Finding]:
    frames = ctx.frames
    if cfg.policy not in POLICIES:
        raise Skip(f"unknown policy {cfg.policy!r}; use one of {', '.join(POLICIES)}")
    ctx = _JobContext(frames)
    incidents: list[_Inc] = []
    benign: dict[str | None, int] = {}
    if frames.has("kernel_events"):
        ev = _prepare_events(frames["kernel_events"], ctx)
        incidents += _kernel_incidents(ev, cfg, benign)
    if frames.has("gpu_health"):
        incidents += _smi_incidents(frames["gpu_health"], cfg, benign, ctx)
    if frames.has("gpu_diag"):
        incidents += _diag_incidents(frames["gpu_diag"], benign, ctx)
    _mark_fleet_patterns(incidents, cfg)
    for inc in incidents:  # a process the kernel killed or that crashed matters when it is a rank
        if inc.kind in ("oom", "segfault") and ctx.ranks_for(inc.host, None, inc.ranks_pid):
            inc.level = max_level(inc.level, "HIGH" if inc.kind == "oom" else "WARNING")
    findings = [_to_finding(inc, cfg, ctx, benign) for inc in incidents if LEVELS[inc.level] >= LEVELS["WARNING"]]
    for inc in incidents:
        if LEVELS[inc.level] < LEVELS["WARNING"]:
            benign[inc.host] = benign.get(inc.host, 0) + len(inc.events)
    # benign counts are final only now: refresh them in every finding
    return [_with_benign(f, benign) for f in findings]


class _JobContext:
    """Hosts, GPU -> rank maps and profiled windows from the other frames (all optional)."""

    def __init__(self, frames: JobFrames) -> None:
        ranks = frames["ranks"]
        self.known_hosts = sorted({short_host(h) for h in ranks["host"].drop_nulls().to_list()} - {None})  # type: ignore[type-var]
        self.rank_by_dev: dict[tuple[str | None, int], set[int]] = {}
        self.rank_by_pid: dict[tuple[str | None, int], set[int]] = {}
        self.ranks_by_host: dict[str | None, set[int]] = {}
        for r in ranks.filter(pl.col("rank").is_not_null()).iter_rows(named=True):
            h = _hk(r["host"])
            self.ranks_by_host.setdefault(h, set()).add(r["rank"])
            if r["device"] is not None:
                self.rank_by_dev.setdefault((h, r["device"]), set()).add(r["rank"])
            if r["pid"] is not None:
                self.rank_by_pid.setdefault((h, r["pid"]), set()).add(r["rank"])
        self.rank_by_bus: dict[tuple[str | None, str], set[int]] = {}
        if "nccl_comms" in FRAME_SPECS and frames.has("nccl_comms"):
            nc = frames["nccl_comms"]
            if {"host", "pid", "rank"} <= set(nc.columns):
                for h, pid, rk in nc.select("host", "pid", "rank").drop_nulls().unique().iter_rows():
                    self.rank_by_pid.setdefault((_hk(h), int(pid)), set()).add(int(rk))
            if {"host", "rank", "bus_id"} <= set(nc.columns):
                for h, rk, bus in nc.select("host", "rank", "bus_id").unique().iter_rows():
                    b = _norm_busid(str(bus)) if bus is not None else None
                    if b is not None and rk is not None:
                        self.rank_by_bus.setdefault((_hk(h), b), set()).add(int(rk))
                        if h:
                            self.known_hosts = sorted(set(self.known_hosts) | {short_host(h)})  # type: ignore[arg-type]
        self.index_by_bus: dict[tuple[str | None, str], int] = {}
        self.bus_by_index: dict[tuple[str | None, int], str] = {}
        gh = frames["gpu_health"]
        for h, src, idx, bus in gh.select("host", "source", "gpu_index", "pci_bus_id").iter_rows():
            if idx is not None and bus is not None:
                hk = _hk(h) or _hk(self.host_for(None, src))
                self.index_by_bus[(hk, bus)] = idx
                self.bus_by_index[(hk, idx)] = bus
        # profiled window per host (epoch ns only: trace clocks of another domain cannot be compared)
        self.window: dict[str | None, tuple[int, int]] = {}
        for name in ("steps", "kernels"):
            df = frames[name]
            if df.height:
                w = (df.filter(pl.col("start_ns") > 10**18)
                     .group_by(pl.col("host").map_elements(_hk, return_dtype=pl.String).alias("h"))
                     .agg(pl.col("start_ns").min().alias("lo"), pl.col("end_ns").max().alias("hi")))
                for h, lo, hi in w.iter_rows():
                    if lo is None:
                        continue
                    old = self.window.get(h)
                    self.window[h] = (min(lo, old[0]), max(hi, old[1])) if old else (lo, hi)
        self.traced_ranks: set[int] = set(ranks["rank"].drop_nulls().to_list())

    def host_for(self, host: str | None, source: str) -> str | None:
        if host:
            return short_host(host)
        parts = [p.lower() for p in re.split(r"[/._-]+", source) if p]
        whole = [p.lower() for p in source.split("/")]
        for host in self.known_hosts:
            h = host.lower()
            if h in whole or h in parts or any(p.startswith(h + ".") or p.startswith(h + "_") or
                                               p.startswith(h + "-") for p in whole):
                return host
        if len(self.known_hosts) == 1:
            return self.known_hosts[0]
        return None

    def ranks_for(self, host: str | None, gpu: str | None, pids: set[int]) -> set[int]:
        out: set[int] = set()
        host = _hk(host)
        if gpu:
            out |= self.rank_by_bus.get((host, gpu), set())
            idx = self.index_by_bus.get((host, gpu))
            if idx is None:
                # no nvidia-smi on that host: a single nvidia-smi of the whole job may still say it
                cands = {i for (h, b), i in self.index_by_bus.items() if b == gpu and h is None}
                idx = cands.pop() if len(cands) == 1 else None
            if idx is not None:
                out |= self.rank_by_dev.get((host, idx), set())
        for pid in pids:
            out |= self.rank_by_pid.get((host, pid), set())
        return out


def _place_across_files(ke: pl.DataFrame) -> pl.DataFrame:
    """A monotonic-only file (plain `dmesg`) of a host whose syslog/journal copy carries wall + monotonic
    stamps: lines present in both (same host, monotonic stamp and text) prove the same boot and give
    its boot time, which places every line of that file and boot."""
    hk = pl.col("host").fill_null("")
    stamped = (ke.filter(pl.col("wall_ns").is_not_null() & pl.col("mono_ns").is_not_null())
               .select(hk.alias("_h"), "mono_ns", "message", (pl.col("wall_ns") - pl.col("mono_ns")).alias("_off"),
                       pl.col("source").alias("_src2")))
    bare = ke.filter(pl.col("wall_ns").is_null() & pl.col("mono_ns").is_not_null())
    if stamped.height == 0 or bare.height == 0:
        return ke
    offsets = (bare.with_columns(hk.alias("_h"))
               .join(stamped, on=["_h", "mono_ns", "message"], how="inner")
               .filter(pl.col("source") != pl.col("_src2"))
               .group_by("source", "_h", "boot").agg(pl.col("_off").median().cast(pl.Int64).alias("_boot_ns")))
    if offsets.height == 0:
        return ke
    ke = ke.with_columns(hk.alias("_h")).join(offsets, on=["source", "_h", "boot"], how="left")
    fill = pl.col("wall_ns").is_null() & pl.col("mono_ns").is_not_null() & pl.col("_boot_ns").is_not_null()
    return ke.with_columns(
        pl.when(fill).then(pl.col("_boot_ns") + pl.col("mono_ns")).otherwise(pl.col("wall_ns")).alias("wall_ns"),
        pl.when(fill).then(pl.lit("boot_time_other_file")).otherwise(pl.col("wall_source")).alias("wall_source"),
    ).drop("_h", "_boot_ns")


def _prepare_events(ke: pl.DataFrame, ctx: _JobContext) -> list[dict[str, Any]]:
    # hosts named inside any kernel log are known hosts too: `n1/dmesg.log` then belongs to `n1`
    named = {short_host(h) for h in ke["host"].drop_nulls().unique().to_list()} - {None}
    ctx.known_hosts = sorted(set(ctx.known_hosts) | named)  # type: ignore[arg-type]
    pairs = ke.select("host", "source").unique()
    mapping = pl.DataFrame(
        {"host": pairs["host"], "source": pairs["source"],
         "_host": [ctx.host_for(h, s) for h, s in pairs.iter_rows()]},
        schema={"host": pl.String, "source": pl.String, "_host": pl.String},
    )
    ke = (ke.join(mapping, on=["host", "source"], how="left", nulls_equal=True)
          .with_columns(pl.col("_host").alias("host")).drop("_host"))
    ke = _place_across_files(ke)
    ke = ke.with_columns(
        pl.when(pl.col("wall_ns").is_not_null()).then(pl.lit("wall"))
        .when(pl.col("mono_ns").is_not_null()).then(pl.lit("mono")).otherwise(pl.lit("none")).alias("clock"),
        pl.coalesce("wall_ns", "mono_ns").alias("t"),
    )
    # the same line collected twice (syslog + journal + dmesg in one run dir) counts once; repeats
    # inside one file are real repeats and stay
    dup_key = [pl.col("host").fill_null(""), pl.col("wall_ns"), pl.col("message")]
    ke = ke.filter(pl.col("wall_ns").is_null() | (pl.col("source") == pl.col("source").first().over(dup_key)))
    rows = ke.sort("source", "boot", "line").to_dicts()
    for r in rows:
        r["f"] = orjson.loads(r["fields"]) if r["fields"] else {}
    # order: per host by time within a clock, file order as tie-breaker (quoted logs are not chronological)
    rows.sort(key=lambda r: (r["host"] or "", r["source"], r["boot"] or 0,
                             r["t"] if r["t"] is not None else -1, r["line"]))
    return rows


LATEST_SCAN_CAP = 128


def _kernel_incidents(rows: list[dict[str, Any]], cfg: GpuHwErrorConfig, benign: dict[str | None, int]) -> list[_Inc]:
    gsp_map: dict[tuple[str | None, str, int], str] = {}  # (host, source, GPU instance) -> bus id
    for r in rows:  # "Timeout ... from GPU4 GSP" on an Xid names the bus id of driver instance GPU4
        f = r["f"]
        if r["kind"] == "xid" and r["pci_bus_id"] and f.get("gpu_instance") is not None:
            gsp_map[(r["host"], r["source"], f["gpu_instance"])] = r["pci_bus_id"]

    def count_benign(r: dict[str, Any]) -> None:
        benign[r["host"]] = benign.get(r["host"], 0) + 1

    by_host: dict[str | None, list[_Inc]] = {}
    cur_host: list[str | None] = [None]

    def latest(pred) -> _Inc | None:
        # candidates: the current host's incidents, newest first; events are sorted per host, so an
        # incident far back in that list is far back in time (the cap keeps huge logs linear)
        seen = 0
        for inc in reversed(by_host.get(cur_host[0], ())):
            if pred(inc):
                return inc
            seen += 1
            if seen >= LATEST_SCAN_CAP:
                break
        return None

    class _Tracked(list):
        def append(self, inc: _Inc) -> None:  # type: ignore[override]
            super().append(inc)
            by_host.setdefault(inc.host, []).append(inc)

        def remove(self, inc: _Inc) -> None:  # type: ignore[override]
            super().remove(inc)
            by_host[inc.host].remove(inc)

    incs = _Tracked()

    aer_rows: list[dict[str, Any]] = []
    for r in rows:
        kind, f, host = r["kind"], r["f"], r["host"]
        cur_host[0] = host
        gpu = r["pci_bus_id"]
        if kind == "xid":
            _handle_xid(r, cfg, incs, latest)
        elif kind == "fallen_off_bus":
            info = lookup(79, cfg.policy)
            tgt = latest(lambda i: i.track == ("gpu", gpu) and i.group == "hw" and i.host == host
                         and i.close_to(r, cfg.incident_gap_s, cfg.untimed_line_window))
            if tgt:
                tgt.add(r, info.severity, info.action)
            else:
                inc = _Inc("fallen_off_bus", r, ("gpu", gpu), info.severity, info.action,
                           "GPU has fallen off the bus" + (" at driver probe" if f.get("what") == "probe" else ""))
                incs.append(inc)
        elif kind == "gsp":
            idx = f.get("gpuidx")
            bus = gpu or (gsp_map.get((host, r["source"], idx)) if idx is not None else None)
            tgt = latest(lambda i: i.host == host and i.group == "hw" and (
                (bus is not None and i.track == ("gpu", bus)) or
                (bus is None and i.track[0] == "gpu")) and i.close_to(r, cfg.incident_gap_s, cfg.untimed_line_window))
            if tgt:
                tgt.add(r)
            else:
                ev = dict(r, pci_bus_id=bus)
                tgt = latest(lambda i: i.kind == "gsp" and i.host == host and i.facts.get("gpu_instance") == idx
                             and i.close_to(r, cfg.incident_gap_s, cfg.untimed_line_window))
                if tgt:
                    tgt.add(r)
                else:
                    inc = _Inc("gsp", ev, ("gpu", bus) if bus else ("gsp", idx), "CRITICAL",
                               "DRAIN_NODE;RESET_GPU;INVESTIGATE_SW",
                               "GSP firmware timeout (Xid 119/120-equivalent, no Xid printed)")
                    inc.gpu = bus
                    inc.facts["gpu_instance"] = idx
                    incs.append(inc)
        elif kind == "aer":
            aer_rows.append(r)
        elif kind == "sxid" or (kind == "fabric_manager" and f.get("sxid") is not None):
            sx = f.get("sxid")
            fatal = bool(f.get("fatal")) or f.get("fatality") == "fatal"
            if sx in BENIGN_SXIDS and not fatal:
                count_benign(r)
                continue
            level, act = ("CRITICAL", "DRAIN_NODE;REBOOT_NODE") if fatal else ("WARNING", "INVESTIGATE_SW")
            tgt = latest(lambda i: i.track == ("switch", gpu) and i.host == host
                         and i.close_to(r, cfg.incident_gap_s, cfg.untimed_line_window))
            if tgt:
                tgt.add(r, level, act)
            else:
                inc = _Inc("nvswitch", r, ("switch", gpu), level, act,
                           f"NVSwitch {'fatal' if fatal else 'non-fatal'} error SXid {sx}")
                inc.facts["switch"] = gpu
                incs.append(inc)
        elif kind == "fabric_manager":
            incs.append(_Inc("fabric_manager", r, ("fm", r["line"]), "WARNING", "INVESTIGATE_SW",
                             "Fabric manager error (NVLink/NVLS setup may fail)"))
        elif kind == "nvlink":
            tgt = latest(lambda i: i.kind == "nvlink" and i.host == host
                         and i.close_to(r, cfg.incident_gap_s, cfg.untimed_line_window))
            if tgt:
                tgt.add(r)
            else:
                incs.append(_Inc("nvlink", r, ("nvlink", host), "HIGH", "RESET_GPU;REBOOT_NODE;INSPECT_LINK",
                                 "NVLink discovery/training failure (P2P over NVLink missing or degraded)"))
        elif kind == "ecc":
            tgt = latest(lambda i: i.host == host and i.track[0] == "gpu" and i.group == "hw"
                         and i.close_to(r, cfg.incident_gap_s, cfg.untimed_line_window))
            if tgt:
                tgt.add(r)
            else:
                incs.append(_Inc("ecc", r, ("ecc", host), "WARNING", "RESET_GPU", "GPU ECC / memory-retirement event"))
        elif kind == "device_other":
            slot = (gpu or "")[:10]
            tgt = latest(lambda i: i.gpu is not None and i.gpu[:10] == slot and i.host == host
                         and i.close_to(r, cfg.incident_gap_s, cfg.untimed_line_window))
            if tgt:
                tgt.add(r)  # another function of the same GPU board (USB-C, I2C): sympathetic
        elif kind == "pcie_link":
            what = f.get("what")
            tgt = latest(lambda i: i.kind == "pcie_link" and i.track == ("pcie_link", gpu))
            if tgt:
                tgt.add(r)
            else:
                title = (f"PCIe link of {gpu} degraded: {f.get('speed')} x{f.get('width')} (limited at {f.get('at')})"
                         if what == "limited" else f"PCIe link down on {gpu}")
                inc = _Inc("pcie_link", r, ("pcie_link", gpu), "WARNING", "INSPECT_PCIE", title)
                inc.gpu = None  # the device may be a NIC or a switch port; GPUs are named only by Xid lines
                inc.facts["device"] = gpu
                incs.append(inc)
        elif kind in ("ib_port", "mlx5", "netdev_carrier"):
            _handle_link(r, cfg, incs, latest, count_benign)
        elif kind == "cpu_thermal":
            if f.get("what") == "normal":
                tgt = latest(lambda i: i.kind == "cpu_thermal" and i.host == host)
                if tgt:
                    tgt.add(r)
                continue
            tgt = latest(lambda i: i.kind == "cpu_thermal" and i.host == host
                         and i.close_to(r, cfg.incident_gap_s, cfg.untimed_line_window))
            if tgt is None:
                tgt = _Inc("cpu_thermal", r, ("cpu_thermal", host), "WARNING", "CHECK_COOLING",
                           "Host CPU thermal throttling")
                incs.append(tgt)
            else:
                tgt.add(r)
            tgt.facts.setdefault("cpus", set()).add(f.get("cpu"))
            tgt.facts["max_total_events"] = max(tgt.facts.get("max_total_events", 0), f.get("n") or 0)
        elif kind in ("edac", "mce", "ghes"):
            _handle_host_mem(r, cfg, incs, latest, count_benign)
        elif kind == "oom":
            if f.get("what") in ("killed", "context") and r["pid"] is not None:
                tgt = latest(lambda i: i.kind == "oom" and i.host == host and i.facts.get("pid") == r["pid"])
                if tgt is None:
                    tgt = _Inc("oom", r, ("oom", r["pid"]), "WARNING", "INVESTIGATE_SW",
                               f"OOM killer killed {r['process']} (pid {r['pid']})")
                    tgt.facts.update(pid=r["pid"], process=r["process"])
                    tgt.ranks_pid.add(r["pid"])
                    incs.append(tgt)
                else:
                    tgt.add(r)
                if f.get("anon_rss_kb"):
                    tgt.facts["anon_rss_gb"] = round(f["anon_rss_kb"] / 1024**2, 1)
            else:
                tgt = latest(lambda i: i.kind == "oom" and i.host == host
                             and i.close_to(r, cfg.sympathetic_window_s, cfg.untimed_line_window))
                if tgt:
                    tgt.add(r)
                else:
                    # "invoked oom-killer" precedes the kill: hold it as the start of the incident
                    inc = _Inc("oom", r, ("oom", None), "WARNING", "INVESTIGATE_SW", "OOM killer invoked")
                    incs.append(inc)
        elif kind in ("soft_lockup", "hard_lockup", "hung_task"):
            group = "lockup" if kind != "hung_task" else "hung"
            tgt = latest(lambda i: i.kind == group and i.host == host
                         and i.close_to(r, cfg.incident_gap_s, cfg.untimed_line_window))
            level, act, title = (("CRITICAL", "REBOOT_NODE", "Host soft/hard lockups (unstable host)") if group == "lockup"
                                 else ("WARNING", "INVESTIGATE_STORAGE;INVESTIGATE_SW", "Hung tasks (blocked > timeout)"))
            if tgt is None:
                tgt = _Inc(group, r, (group, host), level, act, title)
                incs.append(tgt)
            else:
                tgt.add(r, level)
            if f.get("cpu") is not None:
                tgt.facts.setdefault("cpus", set()).add(f["cpu"])
            tgt.facts[kind] = tgt.facts.get(kind, 0) + 1
        elif kind == "segfault":
            inc = _Inc("segfault", r, ("segfault", r["pid"]), "INFO", "RESTART_APP",
                       f"Segfault of {r['process']} (pid {r['pid']})")
            inc.ranks_pid.add(r["pid"])
            inc.facts["needs_rank"] = True
            incs.append(inc)
        elif kind == "context":
            tgt = latest(lambda i: i.kind == "hung" and i.close_to(r, 2.0, 40))
            if tgt is not None:
                tgt.add(r)
                m = _STORAGE_MODULE.search(r["message"] or "")
                if m and "storage_client" not in tgt.facts:  # the innermost frame names it first
                    tgt.facts["storage_client"] = m.group(1)
                    tgt.title = f"Hung tasks blocked in the {m.group(1)} storage client (storage, not GPU)"
                    tgt.actions = ["INVESTIGATE_STORAGE"]
        elif kind in ("benign",):
            count_benign(r)
    _handle_aer(aer_rows, cfg, incs, by_host, count_benign)
    _merge_nvlink5_node(incs, cfg)
    _join_oom_invocations(incs)
    return incs


def _handle_xid(r: dict[str, Any], cfg: GpuHwErrorConfig, incs: list[_Inc], latest) -> None:
    f, host, gpu = r["f"], r["host"], r["pci_bus_id"]
    xid = int(r["xid"])
    info = lookup(xid, cfg.policy)
    level, action = info.severity, info.action
    if 144 <= xid <= 150:
        level, action, bucket = nvlink5_severity(f.get("nvlink_unit"), f.get("fatal"), f.get("link"), f.get("subcode"))
        f["catalog_bucket"] = bucket
    if xid == 154:
        level, action = RECOVERY_ACTIONS.get(f.get("recovery_action", ""), ("WARNING", "INVESTIGATE_SW"))
    if xid == 74 and f.get("nvlink_regs"):
        classes, level, action = decode_xid74(f["nvlink_regs"])
        f["catalog_bucket"] = "WORKFLOW_NVLINK_ERR: " + (",".join(classes) or "no known bit")
    win = cfg.sympathetic_window_s
    same_gpu = lambda i: i.track == ("gpu", gpu) and i.host == host  # noqa: E731
    if xid in SYMPATHETIC_XIDS or xid == 154:
        prev = f.get("caused_by_xid")
        tgt = None
        if prev is not None and 144 <= int(prev) <= 150:
            tgt = latest(lambda i: i.kind == "nvlink5" and i.host == host and i.close_to(r, cfg.incident_gap_s, cfg.untimed_line_window))
        elif prev is not None:  # the driver names the root: join it even beyond the sympathetic window
            tgt = latest(lambda i: same_gpu(i) and int(prev) in i.facts.get("xids", set())
                         and i.close_to(r, cfg.incident_gap_s, cfg.untimed_line_window))
        if tgt is None:
            tgt = latest(lambda i: same_gpu(i) and i.close_to(r, win, cfg.untimed_line_window)
                         and (i.group == "hw" or xid != 3))
        if tgt is not None:
            tgt.add(r, level if xid == 154 else None, action if xid == 154 else None)
            if xid == 154:
                tgt.facts["recovery_action"] = f.get("recovery_action")
                if level in ("CRITICAL", "HIGH"):
                    tgt.actions = [a for a in tgt.actions if a != "RESTART_APP"]
            if prev is not None:
                tgt.facts["caused_by_xid"] = int(prev)
            if r["pid"] is not None:
                tgt.ranks_pid.add(r["pid"])
            return
    group = "app" if info.xid_class in ("app", "sympathetic") else "hw"
    kind = "nvlink5" if 144 <= xid <= 150 else "xid"
    if xid == 109:  # often sympathetic to an application fault just before it
        tgt = latest(lambda i: same_gpu(i) and i.group == "app" and i.close_to(r, win, cfg.untimed_line_window))
        if tgt is not None:
            tgt.add(r, level, action)
            tgt.facts.setdefault("xids", set()).add(xid)
            if r["pid"] is not None:
                tgt.ranks_pid.add(r["pid"])
            return
    if group == "hw" and info.xid_class == "memory":
        # 48 -> 63/64, 94 -> 63: one memory incident on the GPU
        tgt = latest(lambda i: same_gpu(i) and i.facts.get("memory") and i.close_to(r, cfg.incident_gap_s, cfg.untimed_line_window))
    else:
        tgt = latest(lambda i: same_gpu(i) and i.group == group and i.kind == kind
                     and i.close_to(r, cfg.incident_gap_s, cfg.untimed_line_window))
    if tgt is None:
        tgt = _Inc(kind, r, ("gpu", gpu), level, action, "", group)
        tgt.gpu = gpu
        incs.append(tgt)
    else:
        tgt.add(r, level, action)
    tgt.facts.setdefault("xids", set()).add(xid)
    if info.xid_class == "memory":
        tgt.facts["memory"] = True
    if 144 <= xid <= 150:
        tgt.facts.setdefault("links", set()).add(f.get("link"))
        tgt.facts.setdefault("units", set()).add(f"{f.get('nvlink_unit')} {'Fatal' if f.get('fatal') else 'Nonfatal'}")
    if xid == 74 and f.get("link") is not None:
        tgt.facts.setdefault("links", set()).add(f["link"])
    if r["pid"] is not None and xid not in (119, 120):  # a 119/120 pid is the caller that timed out, not a culprit
        tgt.ranks_pid.add(r["pid"])


def _handle_link(r: dict[str, Any], cfg: GpuHwErrorConfig, incs: list[_Inc], latest, count_benign) -> None:
    f, host = r["f"], r["host"]
    what = f.get("what")
    if r["kind"] == "netdev_carrier":
        dev = f.get("netdev")
        tgt = latest(lambda i: i.kind == "carrier" and i.host == host and i.facts.get("dev") == dev)
        if tgt is None:
            tgt = _Inc("carrier", r, ("carrier", dev), "INFO", "INSPECT_LINK", f"Link flapping on {dev}")
            tgt.facts.update(dev=dev, lost=0)
            incs.append(tgt)
        else:
            tgt.add(r)
        if "lost" in str(f.get("state", "")).lower():
            tgt.facts["lost"] += 1
            if tgt.facts["lost"] >= cfg.carrier_flap_min:
                tgt.level = max_level(tgt.level, "WARNING")
        return
    if r["kind"] == "ib_port" or what == "link":
        dev = f.get("ibdev") or f.get("netdev")
        port = f.get("port")
        state = str(f.get("state", "")).upper()
        tgt = latest(lambda i: i.kind == "ib_port" and i.host == host and i.facts.get("dev") == (dev, port))
        if tgt is None:
            tgt = _Inc("ib_port", r, ("ib", dev, port), "INFO", "INSPECT_LINK",
                       f"InfiniBand/RoCE link flap on {dev} port {port}")
            tgt.facts.update(dev=(dev, port), seen_up=False, downs=0)
            tgt.gpu = None
            incs.append(tgt)
        else:
            tgt.add(r)
        if state in ("ACTIVE", "UP"):
            tgt.facts["seen_up"] = True
        elif state in ("DOWN", "ERR") and tgt.facts["seen_up"]:
            tgt.facts["downs"] += 1
            tgt.level = max_level(tgt.level, "WARNING")  # INIT -> ACTIVE at boot is not a flap
        return
    level = "WARNING"
    if what == "pcie_power" and "sufficient power" in str(f.get("msg", "")) and "insufficient" not in str(f.get("msg", "")):
        count_benign(r)
        return
    if what == "module" and str(f.get("status", "")).lower() in ("cable plugged",):
        count_benign(r)
        return
    incs.append(_Inc("mlx5", r, ("mlx5", r["line"]), level, "INSPECT_LINK", f"mlx5 NIC event: {what}"))


def _handle_host_mem(r: dict[str, Any], cfg: GpuHwErrorConfig, incs: list[_Inc], latest, count_benign) -> None:
    f, host, kind = r["f"], r["host"], r["kind"]
    if kind == "ghes":
        rec = f.get("rec")
        tgt = latest(lambda i: i.kind == "ghes" and i.host == host and i.facts.get("rec") == rec
                     and i.close_to(r, cfg.sympathetic_window_s, cfg.untimed_line_window))
        if tgt is None:
            tgt = _Inc("ghes", r, ("ghes", rec), "WARNING", "INSPECT_PCIE", "Firmware-reported (APEI GHES) hardware error")
            tgt.facts["rec"] = rec
            incs.append(tgt)
        else:
            tgt.add(r)
        msg = str(f.get("msg", ""))
        m = re.search(r"event severity: (\w+)", msg)
        if m:
            sev = m.group(1).lower()
            tgt.facts["ghes_severity"] = sev
            tgt.level = "CRITICAL" if sev == "fatal" else "INFO" if sev in ("corrected", "info") else "WARNING"
        m = re.search(r"section_type: (.+)$", msg)
        if m:
            tgt.facts["section"] = m.group(1).strip()
            tgt.title = f"Firmware-reported (APEI GHES) {m.group(1).strip()}"
        if r["pci_bus_id"]:
            tgt.facts["device"] = r["pci_bus_id"]
        m = re.search(r"vendor_id: (0x[0-9a-f]+), device_id: (0x[0-9a-f]+)", msg)
        if m:
            tgt.facts["vendor_device"] = f"{m.group(1)}:{m.group(2)}"
        return
    if kind == "edac" and f.get("ekind") in ("UE", "CE"):
        ue = f["ekind"] == "UE"
        tgt = latest(lambda i: i.kind == "edac" and i.host == host and i.facts.get("dimm") == f.get("dimm")
                     and i.close_to(r, cfg.incident_gap_s, cfg.untimed_line_window))
        level = "CRITICAL" if ue else "WARNING"
        if tgt is None:
            tgt = _Inc("edac", r, ("edac", f.get("dimm")), level, "DRAIN_NODE;RMA_CANDIDATE" if ue else "RMA_CANDIDATE",
                       f"Host DRAM {'uncorrectable' if ue else 'correctable'} error (EDAC) on {f.get('dimm')} - not a GPU")
            tgt.facts["dimm"] = f.get("dimm")
            incs.append(tgt)
        else:
            tgt.add(r, level)
        tgt.facts["count"] = tgt.facts.get("count", 0) + int(f.get("count") or 1)
        return
    # mce logged / EDAC "HANDLING MCE": context of an EDAC or GHES incident just before
    tgt = latest(lambda i: i.kind in ("edac", "ghes") and i.host == host
                 and i.close_to(r, cfg.incident_gap_s, cfg.untimed_line_window))
    if tgt is not None:
        tgt.add(r)
    else:
        count_benign(r)


def _handle_aer(rows: list[dict[str, Any]], cfg: GpuHwErrorConfig, incs: list[_Inc],
                by_host: dict[str | None, list[_Inc]], count_benign) -> None:
    """Group AER lines into per-port error records, then make incidents of them."""
    records: list[dict[str, Any]] = []
    for r in rows:
        f = r["f"]
        port = r["pci_bus_id"]
        starts = f.get("what") == "received" or (f.get("what") == "bus_error" and not (
            records and records[-1]["port"] == port and records[-1]["has_bus"] is False
            and records[-1]["rows"][-1]["source"] == r["source"]))
        if f.get("what") == "recovery" and r["pci_bus_id"] and f.get("drv") not in ("pcieport",):
            # "nvidia 0000:02:00.0: device has no AER-aware driver": names the GPU behind the port
            if records:
                records[-1]["rows"].append(r)
                records[-1]["gpu"] = r["pci_bus_id"]
            continue
        if starts or not records or (records[-1]["port"] != port):
            records.append({"port": port, "rows": [r], "sev": None, "has_bus": f.get("what") == "bus_error", "gpu": None})
        else:
            records[-1]["rows"].append(r)
            if f.get("what") == "bus_error":
                records[-1]["has_bus"] = True
        sev = str(f.get("sev", ""))
        if sev:
            rank = 3 if "Fatal" in sev and "Non" not in sev else 2 if sev.startswith("Uncorrect") else 1
            records[-1]["sev"] = max(records[-1]["sev"] or 0, rank)
    fatal = [rec for rec in records if (rec["sev"] or 0) >= 2]
    corrected = [rec for rec in records if (rec["sev"] or 0) < 2]
    used: set[int] = set()
    corrected_by_port: dict[tuple, list[int]] = {}
    for j, c in enumerate(corrected):
        corrected_by_port.setdefault((c["rows"][0]["host"], c["port"]), []).append(j)
    for rec in fatal:
        first = rec["rows"][0]
        level = "CRITICAL" if rec["sev"] == 3 else "HIGH"
        # an Xid 79 / fallen-off-the-bus on this host shortly after: one "PCIe link loss" incident
        tgt = None
        for inc in by_host.get(first["host"], ()):
            if inc.source != first["source"] and inc.clock != "wall":
                continue
            if inc.track[0] == "gpu" and (
                    79 in inc.facts.get("xids", set()) or inc.kind == "fallen_off_bus"):
                t0 = inc.first_t
                if _same_timeline(inc.events[0], first) and first["t"] is not None and t0 is not None and \
                        -1e9 <= t0 - first["t"] <= cfg.aer_xid_window_s * 1e9:
                    tgt = inc
                    break
                if first["clock"] == "none" and inc.clock == "none" and 0 <= inc.last_line - first["line"] <= 20:
                    tgt = inc
                    break
        if tgt is None:
            tgt = _Inc("aer", dict(first, pci_bus_id=rec["gpu"]), ("gpu", rec["gpu"]) if rec["gpu"] else ("pcie", rec["port"]),
                       level, "REBOOT_NODE;INSPECT_PCIE",
                       f"PCIe {'fatal' if rec['sev'] == 3 else 'uncorrected'} AER on {rec['port']}")
            tgt.gpu = rec["gpu"]
            incs.append(tgt)
            for r in rec["rows"][1:]:
                tgt.add(r)
        else:
            for r in rec["rows"]:
                tgt.add(r, level, "INSPECT_PCIE")
        tgt.facts["root_cause"] = f"PCIe link loss on port {rec['port']}" if rec["sev"] == 3 else f"PCIe uncorrected error on {rec['port']}"
        tgt.facts["aer_port"] = rec["port"]
        bits = [r["f"].get("name") for r in rec["rows"] if r["f"].get("what") == "bit"]
        if bits:
            tgt.facts["aer_errors"] = ", ".join(b for b in bits if b)
        # corrected errors on the same port before it are precursors
        for j in corrected_by_port.get((first["host"], rec["port"]), ()):
            c = corrected[j]
            cf = c["rows"][0]
            if j not in used and _same_timeline(cf, first) and cf["t"] is not None and first["t"] is not None \
                    and 0 <= first["t"] - cf["t"] <= cfg.precursor_window_s * 1e9:
                for r in c["rows"]:
                    tgt.add(r)
                tgt.facts["precursor_corrected_aer"] = tgt.facts.get("precursor_corrected_aer", 0) + 1
                used.add(j)
    # corrected AER: a finding only above a rate, else benign (counted)
    by_port: dict[tuple, list[dict[str, Any]]] = {}
    for j, c in enumerate(corrected):
        if j not in used:
            by_port.setdefault((c["rows"][0]["host"], c["port"]), []).append(c)
    for (_host, port), recs in by_port.items():
        times = [c["rows"][0]["t"] for c in recs]
        burst = 0
        if all(t is not None for t in times):
            ts = sorted(times)  # type: ignore[type-var]
            lo = 0
            for hi in range(len(ts)):
                while ts[hi] - ts[lo] > cfg.corrected_aer_window_s * 1e9:
                    lo += 1
                burst = max(burst, hi - lo + 1)
        else:
            burst = len(recs)
        if burst >= cfg.corrected_aer_min_count:
            inc = _Inc("aer_corrected", recs[0]["rows"][0], ("pcie", port), "WARNING", "INSPECT_PCIE",
                       f"Burst of corrected PCIe AER errors on {port}")
            for c in recs:
                for r in (c["rows"] if c is not recs[0] else c["rows"][1:]):
                    inc.add(r)
            inc.facts.update(aer_port=port, corrected_errors=len(recs), max_per_window=burst)
            bits = sorted({r["f"].get("name") for c in recs for r in c["rows"] if r["f"].get("what") == "bit"} - {None})
            if bits:
                inc.facts["aer_errors"] = ", ".join(bits)
            incs.append(inc)
        else:
            for c in recs:
                for r in c["rows"]:
                    count_benign(r)


def _mark_fleet_patterns(incs: list[_Inc], cfg: GpuHwErrorConfig) -> None:
    """The same GSP/firmware Xid on many hosts of one job: a driver/firmware problem, not N bad GPUs."""
    hosts: dict[int, set[str]] = {}
    for inc in incs:
        for x in inc.facts.get("xids", set()) & {62, 119, 120}:
            if inc.host:
                hosts.setdefault(x, set()).add(inc.host)
    for x, hs in hosts.items():
        if len(hs) >= cfg.fleet_min_hosts:
            for inc in incs:
                if x in inc.facts.get("xids", set()):
                    inc.facts["fleet_pattern"] = f"Xid {x} on {len(hs)} hosts: suspect the driver/firmware"
                    if "INVESTIGATE_SW" not in inc.actions:
                        inc.actions.append("INVESTIGATE_SW")


def _same_timeline(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Two events whose times compare: wall clock on the same host, or the same file and boot."""
    if a["clock"] != b["clock"] or a["host"] != b["host"]:
        return False
    return a["clock"] == "wall" or (a["source"] == b["source"] and a["boot"] == b["boot"])


def _merge_nvlink5_node(incs: list[_Inc], cfg: GpuHwErrorConfig) -> None:
    """Xid 45 'caused by previous Xid 14x' on several GPUs: the NVLink5 incidents are one node incident."""
    by_host: dict[str | None, list[_Inc]] = {}
    for inc in incs:
        if inc.kind == "nvlink5" and 45 in {e["xid"] for e in inc.events if e["kind"] == "xid"}:
            by_host.setdefault(inc.host, []).append(inc)
    for _host, group in by_host.items():
        if len({i.gpu for i in group}) < 2:
            continue
        keep = group[0]
        keep.facts["node_level"] = True
        keep.facts["gpus"] = sorted({i.gpu for i in group if i.gpu})
        for other in group[1:]:
            for e in other.events:
                keep.add(e, other.level, ";".join(other.actions))
            keep.facts.setdefault("xids", set()).update(other.facts.get("xids", set()))
            keep.ranks_pid |= other.ranks_pid
            incs.remove(other)


def _join_oom_invocations(incs: list[_Inc]) -> None:
    """'X invoked oom-killer' then the kill: fold the invocation into the kill incident."""
    ooms = [i for i in incs if i.kind == "oom"]
    for inc in ooms:
        if inc.facts.get("pid") is None:
            nxt = next((i for i in ooms if i.facts.get("pid") is not None and i.host == inc.host
                        and i.close_to(inc.events[0], 10.0, 50)), None)
            if nxt is not None:
                for e in inc.events:
                    nxt.add(e)
                incs.remove(inc)


# --- nvidia-smi / dcgmi -----------------------------------------------------------------------------


def _smi_incidents(gh: pl.DataFrame, cfg: GpuHwErrorConfig, benign: dict[str | None, int], ctx: _JobContext) -> list[_Inc]:
    incs: list[_Inc] = []
    rows = gh.to_dicts()
    for i, r in enumerate(rows):
        host = ctx.host_for(r["host"], r["source"])
        ev = {"host": host, "pci_bus_id": r["pci_bus_id"], "source": r["source"], "line": i + 1, "t": r["snapshot_ns"],
              "clock": "wall" if r["snapshot_ns"] else "none", "boot": 0, "kind": "nvidia_smi", "xid": None,
              "message": "", "f": {}, "time_text": None}
        problems: list[tuple[str, str, str]] = []  # (level, action, text)
        if r["remap_failure"]:
            problems.append(("CRITICAL", "DRAIN_NODE;RESET_GPU;RMA_CANDIDATE", "row remapping failure occurred"))
        if r["remap_pending"]:
            problems.append(("HIGH", "DRAIN_NODE;RESET_GPU",
                             f"row remap pending ({r['remapped_rows_ue'] or 0} uncorrectable-error rows): reset to activate"))
        if (r["ecc_volatile_dram_ue"] or 0) > 0:
            problems.append(("CRITICAL", "DRAIN_NODE;RESET_GPU", f"{r['ecc_volatile_dram_ue']} volatile DRAM uncorrectable ECC error(s)"))
        sram_v, sram_a = r["ecc_volatile_sram_ue"] or 0, r["ecc_aggregate_sram_ue"] or 0
        if sram_v > 0 or sram_a > 0:
            problems.append(("HIGH", "RESET_GPU;RMA_CANDIDATE",
                             f"SRAM uncorrectable ECC: volatile {sram_v}, aggregate {sram_a}"
                             + (" (more than 4 aggregate: usually RMA)" if sram_a > 4 else "")))
        if r["sram_threshold_exceeded"]:
            problems.append(("HIGH", "RMA_CANDIDATE", "SRAM threshold exceeded"))
        if r["retired_pages_pending"]:
            problems.append(("HIGH", "REBOOT_NODE", "page retirement pending"))
        if (r["remap_banks_none"] or 0) > 0:
            problems.append(("WARNING", "RMA_CANDIDATE", f"{r['remap_banks_none']} bank(s) with no spare rows left"))
        if r["reset_required"] or r["drain_and_reset"]:
            problems.append(("HIGH", "DRAIN_NODE;RESET_GPU", "driver says a GPU reset is required"))
        if problems:
            worst = max(problems, key=lambda p: LEVELS[p[0]])
            inc = _Inc("nvidia_smi", ev, ("gpu", r["pci_bus_id"]), worst[0], "", "GPU memory health (nvidia-smi -q): " + worst[2])
            for _lvl, act, _txt in problems:
                inc.actions += [a for a in act.split(";") if a not in inc.actions]
            inc.events = [dict(ev, message="; ".join(p[2] for p in problems))]
            inc.facts.update(remapped_rows_ue=r["remapped_rows_ue"], aggregate_dram_ue=r["ecc_aggregate_dram_ue"],
                             aggregate_sram_ue=r["ecc_aggregate_sram_ue"], gpu_index=r["gpu_index"])
            incs.append(inc)
        else:
            benign[host] = benign.get(host, 0) + 1
    # throttle reasons: the same HW reason on >= half of a snapshot's GPUs is a node-level cause
    groups: dict[tuple, list[int]] = {}
    for i, r in enumerate(rows):
        for reason in r["clock_reasons_active"] or []:
            lr = reason.lower()
            if lr in HW_CLOCK_REASONS:
                groups.setdefault((ctx.host_for(r["host"], r["source"]), r["source"], r["snapshot_ns"], lr), []).append(i)
    per_snapshot: dict[tuple, int] = {}
    for r in rows:
        k = (ctx.host_for(r["host"], r["source"]), r["source"], r["snapshot_ns"])
        per_snapshot[k] = per_snapshot.get(k, 0) + 1
    # the most specific reason carries the cause: a power brake implies "HW Slowdown" too
    for (host, source, snap, reason), idxs in sorted(groups.items(), key=lambda kv: -len(kv[0][3])):
        if reason == "hw slowdown" and any(k[:3] == (host, source, snap) and k[3] != "hw slowdown"
                                           and set(v) >= set(idxs) for k, v in groups.items()):
            continue
        n = per_snapshot[(host, source, snap)]
        node = len(idxs) >= 2 and len(idxs) >= cfg.node_level_min_fraction * n
        targets = [idxs] if node else [[i] for i in idxs]
        for tg in targets:
            r = rows[tg[0]]
            ev = {"host": host, "pci_bus_id": r["pci_bus_id"] if not node else None, "source": source, "line": tg[0] + 1,
                  "t": snap, "clock": "wall" if snap else "none", "boot": 0, "kind": "nvidia_smi", "xid": None,
                  "message": f"Clocks event reason active: {reason} (SM clock {r['sm_clock_mhz']} MHz)", "f": {},
                  "time_text": None}
            action = "CHECK_POWER" if "power" in reason else "CHECK_COOLING"
            inc = _Inc("throttle", ev, ("node", host) if node else ("gpu", r["pci_bus_id"]), HW_CLOCK_REASONS[reason],
                       action, f"GPU clocks throttled: {reason}" + (f" on {len(idxs)} of {n} GPUs (node-level cause)" if node else ""))
            inc.gpu = None if node else r["pci_bus_id"]
            inc.facts.update(reason=reason, gpus_affected=len(idxs), gpus_in_snapshot=n, node_level=node,
                             sm_clock_mhz=r["sm_clock_mhz"])
            if node:
                inc.facts["gpus"] = sorted({rows[i]["pci_bus_id"] for i in idxs if rows[i]["pci_bus_id"]})
            incs.append(inc)
    return incs


def _diag_incidents(gd: pl.DataFrame, benign: dict[str | None, int], ctx: _JobContext) -> list[_Inc]:
    incs: list[_Inc] = []
    for r in gd.to_dicts():
        host = ctx.host_for(r["host"], r["source"])
        msg = r["message"] or ""
        ev = {"host": host, "pci_bus_id": None, "source": r["source"], "line": r["line"], "t": None, "clock": "none",
              "boot": 0, "kind": "dcgmi", "xid": None, "message": f"{r['test']}: {msg}", "f": {}, "time_text": None}
        res = r["result"]
        low = msg.lower()
        if res == "fail":
            level, act, title = "CRITICAL", "DRAIN_NODE;RMA_CANDIDATE", f"DCGM diagnostic '{r['test']}' failed"
        elif res == "error" and "pending" in low:
            level, act, title = "HIGH", "DRAIN_NODE;RESET_GPU", "DCGM: row remappings pending"
        elif res == "error":
            level, act, title = "HIGH", "DRAIN_NODE;INVESTIGATE_SW", f"DCGM error in {r['test']}"
        elif res == "warning":
            cooling = "thermal" in low
            level, act = "WARNING", "CHECK_COOLING" if cooling else "INVESTIGATE_SW"
            title = "DCGM: thermal violations" if cooling else f"DCGM warning in {r['test']}"
        else:
            benign[host] = benign.get(host, 0) + 1
            continue
        # DCGM GPU ids are NVML indices: nvidia-smi -q of the same host names their bus ids
        bus = ctx.bus_by_index.get((_hk(host), r["gpu_index"])) if r["gpu_index"] is not None else None
        inc = _Inc("dcgmi", dict(ev, pci_bus_id=bus), ("gpu", bus) if bus else ("dcgm", r["gpu_index"], r["line"]),
                   level, act, title + (f" on GPU {r['gpu_index']}" if r["gpu_index"] is not None else ""))
        inc.gpu = bus
        inc.facts["dcgm_gpu_index"] = r["gpu_index"]
        m = re.search(r"totaling ([\d.]+) seconds?", msg.replace("second s", "seconds"))
        if m:
            inc.facts["thermal_violation_s"] = float(m.group(1))
        incs.append(inc)
    return incs


# --- finding ---------------------------------------------------------------------------------------


def _to_finding(inc: _Inc, cfg: GpuHwErrorConfig, ctx: _JobContext, benign: dict[str | None, int]) -> Finding:
    host = inc.host
    gpus = list(inc.facts.get("gpus") or ([inc.gpu] if inc.gpu else []))
    ranks: set[int] = set()
    for g in gpus or [None]:
        ranks |= ctx.ranks_for(host, g, inc.ranks_pid)
    level = inc.level
    xids = sorted(inc.facts.get("xids", set()))
    first = inc.events[0]
    title = inc.title or _xid_title(inc, xids, cfg)
    metrics: dict[str, Any] = {
        "severity_level": level,
        "policy": cfg.policy,
        "category": inc.kind,
        "events": len(inc.events),
        "evidence_total": len(inc.events),
        "actions": ";".join(inc.actions) or "NONE",
    }
    if xids:
        metrics["xids"] = ",".join(map(str, xids))
        root = _root_xid(xids, _first_xid(inc))
        info = lookup(root, cfg.policy)
        metrics.update(root_xid=root, xid_name=info.name, usual_cause=info.usual_cause,
                       catalog_immediate=info.catalog_immediate, catalog_investigatory=info.catalog_investigatory)
        nvl5 = [e["f"].get("catalog_bucket") for e in inc.events if e["f"].get("catalog_bucket")]
        if nvl5:
            metrics["catalog_bucket"] = list(dict.fromkeys(nvl5))[-1]
    for k, v in inc.facts.items():
        if k in ("xids", "gpus", "memory", "dev", "needs_rank", "seen_up"):
            continue
        if isinstance(v, set):
            v = ",".join(str(x) for x in sorted((x for x in v if x is not None), key=lambda x: (isinstance(x, str), x)))
        if isinstance(v, (str, int, float, bool)) or v is None:
            metrics[k] = v
    # time placement and the profiled window
    t_first = inc.first_t if inc.clock == "wall" else None
    t_fault = inc.root_t if inc.clock == "wall" else None
    metrics["time_placed"] = t_first is not None
    metrics["first_wall_ns"] = t_first
    metrics["fault_wall_ns"] = t_fault
    metrics["first_mono_s"] = (inc.first_t / 1e9) if inc.clock == "mono" and inc.first_t is not None else None
    win = ctx.window.get(_hk(host)) or (next(iter(ctx.window.values())) if len(ctx.window) == 1 and host is None else None)
    if win is not None and t_fault is not None:
        metrics["in_profiled_window"] = bool(win[0] <= t_fault <= win[1])
        metrics["seconds_from_profile_end"] = round((t_fault - win[1]) / 1e9, 3)
    else:
        metrics["in_profiled_window"] = None
    if not gpus and host and not ranks and ctx.ranks_by_host.get(_hk(host)):
        # a node-level cause (power, cooling, NIC, host memory): every rank there is exposed to it
        metrics["ranks_on_host"] = ",".join(map(str, sorted(ctx.ranks_by_host[_hk(host)])))
    traced = sorted(ranks & ctx.traced_ranks)
    evidence = tuple(
        {k: v for k, v in (("source", e["source"]), ("line", e["line"]), ("time", e.get("time_text")),
                           ("kind", e["kind"]), ("text", (e.get("message") or "")[:300])) if v is not None}
        for e in inc.events[: cfg.max_evidence]
    )
    where = f"host {host}" if host else "an unnamed host"
    gpu_txt = f", GPU {', '.join(gpus)}" if gpus else ""
    rank_txt = f", rank(s) {', '.join(map(str, sorted(ranks)))}" if ranks else ""
    when = ""
    if metrics["in_profiled_window"] is True:
        when = " It happened inside the profiled window: check whether this rank is the straggler or the rank " \
               "missing from a timed-out collective (see the straggler / nccl_timeout findings)."
    elif metrics["in_profiled_window"] is False:
        when = f" It happened outside the profiled window ({metrics['seconds_from_profile_end']:+.0f} s from its end)."
    elif not metrics["time_placed"]:
        when = " The log gives no wall-clock time for it (monotonic or no stamp, boot time unknown), so it is not placed on the job timeline."
    if traced and not when.startswith(" It happened inside"):
        when += " The rank on this GPU is in the traces."
    summary = (f"{title} on {where}{gpu_txt}{rank_txt}: {len(inc.events)} log line(s) grouped into one incident"
               + (f" (root cause: {inc.facts['root_cause']})" if inc.facts.get("root_cause") else "") + "." + when)
    if inc.group != "app":  # hardware first: contain (drain/reboot/reset), then inspect, then software
        inc.actions.sort(key=lambda a: ACTION_ORDER.index(a) if a in ACTION_ORDER else len(ACTION_ORDER))
        metrics["actions"] = ";".join(inc.actions) or "NONE"
    remediation = "; ".join(ACTION_TEXT.get(a, a) for a in inc.actions) or ACTION_TEXT["NONE"]
    key = f"{inc.kind}|{first['source']}|{first['line']}"
    return Finding(
        detector="gpu_hw_error",
        severity=_sev(level),
        title=title,
        summary=summary,
        remediation=remediation[0].upper() + remediation[1:] + ".",
        ranks=tuple(sorted(ranks)),
        hosts=(host,) if host else (),
        gpus=tuple(gpus),
        metrics=metrics,
        evidence=evidence,
        key=key,
        confidence="high" if inc.kind in ("xid", "nvlink5", "fallen_off_bus", "nvidia_smi") else "medium",
    )


def _with_benign(f: Finding, benign: dict[str | None, int]) -> Finding:
    host = f.hosts[0] if f.hosts else None
    m = dict(f.metrics)
    m["benign_events"] = benign.get(host, 0)
    return Finding(**{**f.__dict__, "metrics": m})


def _root_xid(xids: list[int], first: int | None = None) -> int:
    """The most severe Xid of the incident (ties: the first), ignoring sympathetic and 154; for an
    application incident the first Xid (what follows it, e.g. 109, is a consequence)."""
    if first is not None:
        return first
    cands = [x for x in xids if x not in SYMPATHETIC_XIDS and x != 154] or xids
    return max(cands, key=lambda x: (LEVELS.get(lookup(x).severity, 0), -cands.index(x)))


def _first_xid(inc: _Inc) -> int | None:
    if inc.group != "app":
        return None
    return next((int(e["xid"]) for e in inc.events if e["kind"] == "xid" and e["xid"] is not None), None)


def _xid_title(inc: _Inc, xids: list[int], cfg: GpuHwErrorConfig) -> str:
    root = _root_xid(xids, _first_xid(inc)) if xids else None
    if root is None:
        return "GPU error"
    info = lookup(root, cfg.policy)
    extra = [x for x in xids if x != root]
    t = f"Xid {root} ({info.description})"
    if inc.kind == "nvlink5":
        units = inc.facts.get("units")
        if units:
            t = f"NVLink5 Xid {','.join(map(str, xids))}: {', '.join(sorted(units))}"
        if inc.facts.get("node_level"):
            t += " (node-level NVLink incident)"
        return t
    if extra:
        t += " with Xid " + ", ".join(map(str, extra))
    if inc.group == "app":
        t = "Application-level " + t
    return t
