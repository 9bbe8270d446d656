"""Node health: what the host's kernel log says went wrong that is not the GPU's fault.

Its documentation (what it detects, why it matters, how it measures, what to do) is data: ``DOC``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import polars as pl

from forensics.base.findings import Finding, FindingKind, Role, Severity, When
from forensics.base.settings import setting
from forensics.detectors import DetectorDoc, detector
from forensics.detectors._fault_kinds import HOST_FAULT, NIC_FAULT, fault_kind
from forensics.facts.context import JobContext
from forensics.facts.host_events import STORAGE_MODULES, episodes, host_events, name_matches, summarize
from forensics.facts.placement import Placement, host_key

TRAINERS = r"^(?:python[\d.]*|torchrun|pt_main_thread|pt_autograd_\d+|pt_data_worker|deepspeed|accelerate|ray::.*)$"
VIRTUAL_IFACES = r"^(?:veth|docker|br-|virbr|cali|flannel|cni|tun|tap|lo$|vnet|kube)"
_STORAGE_PROCS = r"^(?:nfs|rpciod|ll_|ldlm_|ptlrpc|lnet|mmfs|beegfs|weka|ceph|fuse|kcifsd|cifsd)"


@dataclass(frozen=True)
class NodeHealthConfig:
    """Episode window, CE rate and hang thresholds, and the names of training processes and virtual NICs."""

    incident_gap_s: float = setting(300.0, unit="s", low=0.0,
                                    doc="events of one host, category and device closer than this are one finding")
    ce_warning_per_hour: float = setting(10.0, unit="errors/h", low=0.0,
                                         doc="correctable DRAM errors per hour on one DIMM for a warning (below: info)")
    hung_critical_s: float = setting(600.0, unit="s", low=0.0,
                                     doc="a storage-client or training task blocked this long is critical "
                                         "(NCCL's default watchdog timeout)")
    link_flap_min: int = setting(1, unit="flaps", low=1,
                                 doc="link downs after the link was up, per port or interface, for a warning")
    trainer_processes: str = setting(TRAINERS, regex=True,
                                     doc="process names of the training job (an OOM kill or hang of one is critical)")
    ignore_interfaces: str = setting(VIRTUAL_IFACES, regex=True,
                                     doc="network interfaces that are not NICs (containers, bridges, tunnels)")
    max_evidence: int = setting(20, unit="lines", low=1, doc="evidence lines kept per finding")


@dataclass
class Grade:
    """What one episode means: its level (critical / warning / info; None: nothing to report), title,
    actions (codes) and what to do (words), the facts that become metrics, the ranks it names."""

    level: str | None
    title: str = ""
    actions: tuple[str, ...] = ()
    todo: str = ""
    facts: dict[str, Any] = field(default_factory=dict)
    ranks: set[int] = field(default_factory=set)
    confidence: str = "medium"


HOST_EVENT = FindingKind(
    "host_event", "a host event below the level that explains anything (e.g. correctable DRAM errors below the "
    "rate): a fact to watch, not a cause", Role.SYMPTOM, "Watch the rate; act when it grows.", stage=4)


DOC = DetectorDoc(
    summary=(
        "Node health: what the host's kernel log says went wrong that is not the GPU's fault."
    ),
    detects=(
        "Host DRAM errors (EDAC correctable / uncorrectable, per DIMM), tasks hung in D state (and whether "
        "they are blocked in a storage client: NFS, Lustre, GPFS, BeeGFS, WekaFS, CephFS, FUSE), soft / hard "
        "lockups and RCU stalls, OOM kills (and whether the victim is the training process), filesystem and "
        "block-device errors (EXT4 / XFS / BTRFS errors, read-only remounts, I/O errors), network-storage "
        "servers not responding, NIC link flaps (mlx5 / InfiniBand ports, Ethernet links, lost carrier) and "
        "mlx5 NIC hardware events, CPU thermal throttling, and the node going down (a kernel panic, the "
        "kernel's `reboot: Power down` / `Restarting system`, systemd-shutdown's final stage, logind's `System "
        "is powering down`). GPU faults are gpu_hw_error's."
    ),
    matters=(
        "A job that hangs or dies is often blamed on the GPUs or NCCL when the host under them failed: the "
        "OOM killer took a rank, the rank blocked on a storage server, a CPU locked up, a NIC port flapped. "
        "The peers then time out in NCCL on healthy GPUs. Naming the host fault first saves draining good "
        "GPUs."
    ),
    measures=(
        "Kernel-log lines (``kernel_events``) are placed on the job's hosts (the identity frame's host names,"
        " the log's own host, the host its path names) and clocks (wall clock when the log gives it, else "
        "monotonic per file and boot). Events of one host, category and key (DIMM, device, server, OOM "
        "victim) closer than ``incident_gap_s`` form one episode and one finding, with its first and last "
        "time and where it falls relative to the profiled window. Severity by consequence: an uncorrectable "
        "DRAM error, a lockup, a read-only remount / filesystem shutdown, a NIC link left down, or an OOM "
        "kill of the training process (its process name matches ``trainer_processes`` or its pid is a rank's)"
        ", a kernel panic or the node shutting down or rebooting is critical; correctable DRAM errors are a "
        "warning from ``ce_warning_per_hour`` errors per hour "
        "(over the episode, at least one hour) and info below; a task blocked in a storage client or a "
        "training process for ``hung_critical_s`` or more (the longest reported block, or the time from the "
        "first report to the last plus the first report's block) is critical, shorter or other hung tasks a "
        "warning; link flaps (a port or interface going down after it had been up; INIT -> ACTIVE at boot is "
        "not one) of ``link_flap_min`` or more are a warning; CPU thermal throttling, filesystem / I/O "
        "errors, storage servers not responding, mlx5 hardware events, other OOM kills and RCU stalls are "
        "warnings. Interfaces matching ``ignore_interfaces`` (containers, bridges) are not NICs."
    ),
    todo=(
        "Follow the finding: drain the node and replace the DIMM (UE, or a CE rate that keeps rising); reboot"
        " a node with lockups and check BIOS/firmware; for an OOM kill of a rank reduce host memory use "
        "(data-loader workers, pinned memory, dataset caching) or raise the job's memory limit; for hung "
        "tasks and storage errors check the storage servers, the client and the network to them before "
        "restarting; reseat or replace the cable/transceiver of a flapping NIC port; check cooling for CPU "
        "throttling; for a node that went down find who or what shut it down (or the panic's trace) before "
        "restarting the job there: its peers' connection errors and timeouts are consequences."
    ),
)


@detector("node_health", doc=DOC, settings=NodeHealthConfig, requires=("kernel_events",),
          kinds=(HOST_FAULT, NIC_FAULT, HOST_EVENT), view="hw-events")
def detect(ctx: JobContext, cfg: NodeHealthConfig) -> list[Finding]:
    place = ctx.placement
    ev = host_events(ctx.kernel_events, cfg.ignore_interfaces)
    if ev.height == 0:
        return []
    ep = summarize(episodes(ev, cfg.incident_gap_s), cfg.trainer_processes, cfg.max_evidence)
    ep = ep.with_columns(name_matches("victim", cfg.trainer_processes).alias("victim_is_trainer"))
    findings = []
    for row in ep.iter_rows(named=True):  # one row per episode, not per event
        grade = GRADERS[row["category"]](row, cfg, place)
        if grade.level is not None:
            findings.append(_finding(row, grade, place))
    return findings


# --- grading, one function per category ------------------------------------------------------------


def _hours(row: dict[str, Any]) -> float:
    span = (row["last_t"] - row["first_t"]) / 3.6e12 if row["clock"] != "none" and row["first_t"] is not None else 0.0
    return max(span, 1.0)


def _edac(row: dict[str, Any], cfg: NodeHealthConfig, place: Placement) -> Grade:
    ue, ce, dimm = row["ue"] or 0, row["ce"] or 0, row["key"]
    facts = {"dimm": dimm, "memory_controller": row["mc"], "ue_count": ue, "ce_count": ce}
    if ue:
        return Grade("critical", f"Host DRAM uncorrectable error (EDAC UE) on {dimm}: not a GPU fault",
                     ("DRAIN_NODE", "RMA_CANDIDATE"), "drain the node and replace the DIMM named here (host memory, "
                     "not the GPU); the process that read the bad memory may have crashed", facts, confidence="high")
    rate = ce / _hours(row)
    facts["ce_per_hour"] = round(rate, 3)
    level = "warning" if rate >= cfg.ce_warning_per_hour else "info"
    return Grade(level, f"Host DRAM correctable errors (EDAC CE) on {dimm}: {ce} error(s), {rate:.1f}/h",
                 ("RMA_CANDIDATE",), "watch the DIMM's correctable-error rate; schedule its replacement if it keeps "
                 "rising (a rising CE rate often precedes an uncorrectable error)", facts)


def _blocked_s(row: dict[str, Any]) -> float:
    secs = float(row["max_secs"] or 0)
    if row["clock"] != "none" and row["first_t"] is not None and row["min_secs"] is not None:
        secs = max(secs, (row["last_t"] - row["first_t"]) / 1e9 + row["min_secs"])
    return secs


def _hung(row: dict[str, Any], cfg: NodeHealthConfig, place: Placement) -> Grade:
    mods = [m for m in row["stack_modules"] if m in STORAGE_MODULES]
    procs = row["processes"]
    storage = mods[0] if mods else next((p for p in procs if _matches(_STORAGE_PROCS, p)), None)
    trainer = bool(row["trainer_blocked"])
    blocked = _blocked_s(row)
    ranks = place.ranks_for(row["host"], None, set(row["pids"]))
    facts = {"processes": ",".join(procs), "blocked_s": round(blocked, 1), "storage_client": storage,
             "training_process_blocked": trainer or bool(ranks),
             "stack_modules": ",".join(row["stack_modules"]) or None}
    level = "critical" if (storage or trainer or ranks) and blocked >= cfg.hung_critical_s else "warning"
    who = "the training process" if trainer or ranks else ", ".join(procs[:3]) or "tasks"
    if storage:
        title = f"Hung tasks blocked in the {storage} storage client ({who}, {blocked:.0f} s): storage, not GPU"
        return Grade(level, title, ("INVESTIGATE_STORAGE",), f"check the {storage} servers, the client and the network "
                     "to them; the ranks on this host stall while their I/O is blocked", facts, ranks)
    if "nvidia" in row["stack_modules"] or "nvidia_uvm" in row["stack_modules"]:
        return Grade(level, f"Hung tasks blocked in the NVIDIA driver ({who}, {blocked:.0f} s)",
                     ("INVESTIGATE_SW",), "see the gpu_hw_error findings of this host; a task stuck in the driver "
                     "usually follows a GPU fault", facts, ranks)
    return Grade(level, f"Hung tasks: {who} blocked for {blocked:.0f} s", ("INVESTIGATE_STORAGE", "INVESTIGATE_SW"),
                 "look at the stack trace under the hung-task report: I/O (local disk, network filesystem) or a "
                 "kernel lock", facts, ranks)


def _matches(pattern: str, text: str | None) -> bool:
    return bool(text) and pl.Series([text]).str.contains(pattern).item()


def _lockup(row: dict[str, Any], cfg: NodeHealthConfig, place: Placement) -> Grade:
    facts = {"soft_lockup": row["soft"], "hard_lockup": row["hard"], "rcu_stall": row["rcu"],
             "cpus": ",".join(map(str, row["cpus"])) or None, "max_stuck_s": row["max_secs"]}
    if row["soft"] or row["hard"]:
        return Grade("critical", "Host CPU lockups (soft/hard lockup): the host is unstable",
                     ("REBOOT_NODE", "DRAIN_NODE"), "drain and reboot the node; check BIOS/firmware, the kernel "
                     "and the hardware (CPU, memory, power) if it recurs", facts, confidence="high")
    return Grade("warning", "RCU stalls on the host (CPUs not making progress)", ("INVESTIGATE_SW",),
                 "check what held the CPUs (the stall report's tasks); recurring stalls precede lockups", facts)


def _oom(row: dict[str, Any], cfg: NodeHealthConfig, place: Placement) -> Grade:
    pid, victim = row["victim_pid"], row["victim"]
    if pid is None and victim is None:
        return Grade(None)  # the OOM killer ran but the log does not show whom it killed
    ranks = place.ranks_for(row["host"], None, {pid} if pid is not None else set())
    trainer = bool(row["victim_is_trainer"]) or bool(ranks)
    rss = round(row["anon_rss_kb"] / 1024**2, 1) if row["anon_rss_kb"] else None
    facts = {"pid": pid, "process": victim, "anon_rss_gb": rss, "constraint": row["constraint"],
             "invoked_by": row["invoker"], "training_process": trainer}
    scope = "cgroup " if str(row["constraint"] or "").endswith("MEMCG") else ""
    if trainer:
        return Grade("critical", f"OOM killer killed the training process {victim} (pid {pid})",
                     ("RESTART_APP", "INVESTIGATE_SW"), f"host memory ran out ({scope}OOM): reduce host memory "
                     "use (data-loader workers, pinned memory, dataset caching) or raise the job's memory limit, then "
                     "restart", facts, ranks, "high")
    return Grade("warning", f"OOM killer killed {victim} (pid {pid})", ("INVESTIGATE_SW",),
                 f"host memory ran out ({scope}OOM): find what used it (the victim's anon-rss) before it takes a rank",
                 facts, ranks)


def _fs_error(row: dict[str, Any], cfg: NodeHealthConfig, place: Placement) -> Grade:
    dev, fs = row["key"], row["fs"]
    facts = {"device": dev, "filesystem": fs, "detail": row["detail"], "read_only_or_shutdown": bool(row["readonly"])}
    what = f"{fs} filesystem" if fs else "block device"
    if row["readonly"]:
        return Grade("critical", f"{what} on {dev} went read-only / shut down", ("DRAIN_NODE", "INVESTIGATE_STORAGE"),
                     "drain the node: writes (checkpoints, logs) to it fail; check the disk and run fsck/xfs_repair",
                     facts, confidence="high")
    return Grade("warning", f"I/O or {what} errors on {dev}", ("INVESTIGATE_STORAGE",),
                 "check the disk (SMART, nvme smart-log) and the filesystem; replace a failing drive", facts)


def _storage(row: dict[str, Any], cfg: NodeHealthConfig, place: Placement) -> Grade:
    if not row["downs"]:
        return Grade(None)
    facts = {"server": row["key"], "not_responding": row["downs"], "recovered": row["ups"] > 0}
    back = "recovered" if row["ups"] else "no recovery in the log"
    return Grade("warning", f"Storage server {row['key']} not responding ({back})", ("INVESTIGATE_STORAGE",),
                 "check the storage server and the network to it; ranks reading or writing through it stall", facts)


def _nic_link(row: dict[str, Any], cfg: NodeHealthConfig, place: Placement) -> Grade:
    flaps, last = row["flaps"] or 0, row["last_state"]
    stayed_down = flaps > 0 and last in ("DOWN", "ERR", "LOST CARRIER")
    if flaps < cfg.link_flap_min and not stayed_down:
        return Grade(None)  # INIT -> ACTIVE at boot, or a down before the link was ever up
    dev = row["key"]
    facts = {"device": dev, "bus_id": row["bus_id"], "flaps": flaps, "last_state": last}
    if stayed_down:
        return Grade("critical", f"NIC link {dev} went down and stayed down", ("DRAIN_NODE", "INSPECT_LINK"),
                     "traffic over this port fails (NCCL over it times out): drain the node; reseat or replace the "
                     "cable/transceiver, check the switch port", facts)
    return Grade("warning", f"NIC link flapping on {dev}: {flaps} down(s) after it was up", ("INSPECT_LINK",),
                 "reseat or replace the cable/transceiver and check the switch port; NCCL over a flapping port "
                 "retries or falls back to a slower path", facts)


def _mlx5(row: dict[str, Any], cfg: NodeHealthConfig, place: Placement) -> Grade:
    # the lines normal at boot or on a re-plug never reach an episode (host_events.BENIGN_NIC_LINES): what is
    # left is a fault (insufficient slot power, a module error or unplugged, temperature, health)
    facts = {"device": row["key"], "event": row["what"]}
    return Grade("warning", f"mlx5 NIC hardware event ({row['what']}) on {row['key']}", ("INSPECT_LINK",),
                 "check the NIC's cable/module, slot power and temperature (mlxlink, mlxconfig, the BMC log)", facts)


def _cpu_thermal(row: dict[str, Any], cfg: NodeHealthConfig, place: Placement) -> Grade:
    if not row["throttles"]:
        return Grade(None)  # "temperature/speed normal" alone
    facts = {"cpus": ",".join(map(str, row["cpus"])) or None, "max_total_events": row["max_total_events"]}
    return Grade("warning", "Host CPU thermal throttling", ("CHECK_COOLING",),
                 "check the node's cooling (fans, airflow, heat sinks); a throttled CPU launches kernels late and "
                 "makes its ranks stragglers", facts)


def _shutdown(row: dict[str, Any], cfg: NodeHealthConfig, place: Placement) -> Grade:
    facts = {"panic": bool(row["panic"]), "last_words": row["last_words"]}
    ranks = set(place.ranks_by_host.get(host_key(row["host"]), set()))  # a node going down takes every rank on it
    if row["panic"]:
        return Grade("critical", f"Kernel panic on the host ({row['last_words'] or 'not syncing'})",
                     ("DRAIN_NODE", "INVESTIGATE_SW"), "the node crashed and every rank on it died with it: drain it, "
                     "read the panic's stack trace (kdump / the console log) and the lines before it", facts,
                     ranks, "high")
    return Grade("critical", "The host shut down or rebooted", ("INVESTIGATE_SW",),
                 "every rank on it died with it: find who shut it down (an administrator, the scheduler's health "
                 "check, an unattended upgrade, the BMC) before restarting the job there; its peers' connection "
                 "errors and timeouts are consequences", facts, ranks, "high")


Grader = Callable[[dict[str, Any], NodeHealthConfig, Placement], Grade]
GRADERS: dict[str, Grader] = {
    "edac": _edac, "hung": _hung, "lockup": _lockup, "oom": _oom, "fs_error": _fs_error, "storage": _storage,
    "nic_link": _nic_link, "mlx5": _mlx5, "cpu_thermal": _cpu_thermal, "shutdown": _shutdown,
}

# --- findings ---------------------------------------------------------------------------------------


def _time_metrics(row: dict[str, Any], place: Placement) -> dict[str, Any]:
    wall = row["clock"] == "wall"
    out: dict[str, Any] = {
        "time_placed": wall, "first_wall_ns": row["first_t"] if wall else None,
        "fault_wall_ns": row["first_t"] if wall else None, "last_wall_ns": row["last_t"] if wall else None,
        "first_mono_s": row["first_t"] / 1e9 if row["clock"] == "mono" and row["first_t"] is not None else None,
        "in_profiled_window": None,
    }
    win = place.window_of(row["host"])
    if win is not None and wall:
        out["in_profiled_window"] = bool(row["first_t"] <= win[1] and row["last_t"] >= win[0])
        out["seconds_from_profile_end"] = round((row["first_t"] - win[1]) / 1e9, 3)
    return out


def _when(m: dict[str, Any]) -> str:
    if m["in_profiled_window"] is True:
        return " It overlaps the profiled window."
    if m["in_profiled_window"] is False:
        return f" It began {m['seconds_from_profile_end']:+.0f} s from the end of the profiled window."
    if not m["time_placed"]:
        return " The log gives no wall-clock time for it, so it is not placed on the job timeline."
    return ""


def _finding(row: dict[str, Any], g: Grade, place: Placement) -> Finding:
    host = row["host"]
    m: dict[str, Any] = {"category": row["category"], "events": row["events"], "actions": ";".join(g.actions)}
    m.update({k: v for k, v in g.facts.items() if v is not None})
    m.update(_time_metrics(row, place))
    on_host = sorted(place.ranks_by_host.get(host_key(host), set()))
    if on_host:
        m["ranks_on_host"] = ",".join(map(str, on_host))
    where = f"host {host}" if host else "an unnamed host"
    ranks = f", rank(s) {', '.join(map(str, sorted(g.ranks)))}" if g.ranks else ""
    exposed = f" Ranks on this host: {m['ranks_on_host']}." if on_host and not g.ranks else ""
    summary = f"{g.title} on {where}{ranks}: {row['events']} kernel-log line(s).{_when(m)}{exposed}"
    return Finding(
        detector="node_health", severity=Severity(g.level), title=g.title, summary=summary,
        remediation=g.todo[0].upper() + g.todo[1:] + ".", ranks=tuple(sorted(g.ranks)),
        hosts=(host,) if host else (), metrics=m, evidence=tuple(row["evidence"]),
        key=f"{row['category']}|{row['key']}|{row['source']}|{row['first_line']}", confidence=g.confidence,
        kind=(HOST_EVENT if g.level == "info" else fault_kind(row["category"], None, HOST_EVENT)).name,
        when=_placed(row),
    )


def _placed(row: dict[str, Any]) -> When:
    if row["clock"] != "wall" or row["first_t"] is None:
        return When.unknown("the log gives no wall-clock time for the episode")
    first = int(row["first_t"])
    return When.span(first, max(first, int(row["last_t"] if row["last_t"] is not None else first)),
                     "the episode's first and last wall-clock stamps")
