"""Incidents -> findings: title, summary, metrics, evidence, ranks and the profiled-window placement."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from forensics.base.findings import Finding, FindingKind, Role, Severity, When
from forensics.base.xid_catalog import LEVELS, lookup
from forensics.detectors._fault_kinds import fault_kind
from forensics.detectors.gpu_hw_error.incident import Incident
from forensics.detectors.gpu_hw_error.xid import SYMPATHETIC_XIDS
from forensics.facts.placement import Placement, host_key

if TYPE_CHECKING:
    from forensics.detectors.gpu_hw_error.config import GpuHwErrorConfig

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
GPU_EVENT = FindingKind(
    "gpu_event", "a GPU event that does not make the GPU unusable: an application-level or recoverable Xid, "
    "corrected errors, throttling, a crashed process", Role.SYMPTOM,
    "Follow the finding's actions; fix the application first for an application-level Xid.", stage=4)

# facts that stay internal (sets of GPUs are the finding's ``gpus``; the rest is bookkeeping)
_HIDDEN_FACTS = ("xids", "gpus", "memory", "dev", "needs_rank", "seen_up", "chain_roots", "unseen_root")


def severity(level: str) -> Severity:
    return Severity.CRITICAL if level in ("CRITICAL",
                                          "HIGH") else Severity.WARNING if level == "WARNING" else Severity.INFO


def to_finding(inc: Incident, cfg: GpuHwErrorConfig, place: Placement) -> Finding:
    host = inc.host
    gpus = sorted(g for g in (inc.facts.get("gpus") or ([inc.gpu] if inc.gpu else [])) if g)
    ranks: set[int] = set()
    for g in gpus or [None]:
        ranks |= place.ranks_for(host, g, inc.ranks_pid)
    xids = sorted(inc.facts.get("xids", set()))
    _name_chain_root(inc, xids, cfg)
    title = inc.title or xid_title(inc, xids, cfg)
    metrics: dict[str, Any] = {
        "severity_level": inc.level, "policy": cfg.policy, "category": inc.kind, "events": len(inc.events),
        "evidence_total": len(inc.events), "actions": ";".join(inc.actions) or "NONE",
    }
    if xids:
        metrics.update(_xid_metrics(inc, xids, cfg))
    metrics.update(_fact_metrics(inc.facts))
    metrics.update(_time_metrics(inc, place))
    if not gpus and host and not ranks and place.ranks_by_host.get(host_key(host)):
        # a node-level cause (power, cooling, NIC, host memory): every rank there is exposed to it
        metrics["ranks_on_host"] = ",".join(map(str, sorted(place.ranks_by_host[host_key(host)])))
    traced = bool(ranks & place.traced_ranks)
    summary = _summary(inc, title, gpus, ranks, metrics, traced)
    if inc.group != "app":  # hardware first: contain (drain/reboot/reset), then inspect, then software
        inc.actions.sort(key=lambda a: ACTION_ORDER.index(a) if a in ACTION_ORDER else len(ACTION_ORDER))
        metrics["actions"] = ";".join(inc.actions) or "NONE"
    remediation = "; ".join(ACTION_TEXT.get(a, a) for a in inc.actions) or ACTION_TEXT["NONE"]
    first = inc.events[0]
    return Finding(
        detector="gpu_hw_error",
        severity=severity(inc.level),
        title=title,
        summary=summary,
        remediation=remediation[0].upper() + remediation[1:] + ".",
        ranks=tuple(sorted(ranks)),
        hosts=(host,) if host else (),
        gpus=tuple(gpus),
        metrics=metrics,
        evidence=_evidence(inc, cfg.max_evidence),
        key=f"{inc.kind}|{first['source']}|{first['line']}",
        confidence="high" if inc.kind in ("xid", "nvlink5", "fallen_off_bus", "nvidia_smi") else "medium",
        kind=fault_kind(inc.kind, metrics.get("root_xid"), GPU_EVENT).name,
        when=_placed(metrics), xids=tuple(xids),
    )


def _placed(metrics: dict[str, Any]) -> When:
    """The moment of the fault (the root event), else of the incident's first line, on the wall clock."""
    for key, what in (("fault_wall_ns", "the root event's"), ("first_wall_ns", "the incident's first line's")):
        t = metrics.get(key)
        if isinstance(t, int):
            return When.span(t, t, f"{what} wall-clock stamp")
    return When.unknown("the log gives no wall-clock time (monotonic or no stamp, boot time unknown)")


def _name_chain_root(inc: Incident, xids: list[int], cfg: GpuHwErrorConfig) -> None:
    """Where the driver named the root ("caused by previous Xid N"), the incident says so in its facts."""
    if not inc.facts.get("chain_roots"):
        return
    root = incident_root(inc, xids)
    inc.facts["caused_by_xid"] = root
    inc.facts["root_xid_in_log"] = root in _logged_xids(inc)
    inc.facts.setdefault("root_cause", f"Xid {root} ({lookup(root, cfg.policy).description}), named by the driver "
                                       f"in 'caused by previous Xid {root}'")


def _logged_xids(inc: Incident) -> set[int]:
    return {int(e["xid"]) for e in inc.events if e["kind"] == "xid" and e["xid"] is not None}


def incident_root(inc: Incident, xids: list[int]) -> int:
    """The incident's root Xid: of the Xids the driver named as causes, the earliest in the log (the first
    named when none is logged); otherwise :func:`root_xid`."""
    roots = inc.facts.get("chain_roots") or set()
    seen = [(e["t"] is None, e["t"] or 0, e["line"], int(e["xid"])) for e in inc.events
            if e["kind"] == "xid" and e["xid"] is not None and int(e["xid"]) in roots]
    if seen:
        return min(seen)[3]
    if roots:
        return min(roots)
    return root_xid(xids, first_xid(inc))


def _xid_metrics(inc: Incident, xids: list[int], cfg: GpuHwErrorConfig) -> dict[str, Any]:
    root = incident_root(inc, xids)
    info = lookup(root, cfg.policy)
    out: dict[str, Any] = {"xids": ",".join(map(str, xids)), "root_xid": root, "xid_name": info.name,
                           "usual_cause": info.usual_cause, "catalog_immediate": info.catalog_immediate,
                           "catalog_investigatory": info.catalog_investigatory}
    buckets = [e["f"].get("catalog_bucket") for e in inc.events if e["f"].get("catalog_bucket")]
    if buckets:
        out["catalog_bucket"] = list(dict.fromkeys(buckets))[-1]
    return out


def _fact_metrics(facts: dict[str, Any]) -> dict[str, Any]:
    """The incident's facts that are plain values (sets joined, sorted with numbers before text)."""
    out: dict[str, Any] = {}
    for k, v in facts.items():
        if k in _HIDDEN_FACTS:
            continue
        if isinstance(v, set):
            v = ",".join(str(x) for x in sorted((x for x in v if x is not None), key=lambda x: (isinstance(x, str), x)))
        if isinstance(v, (str, int, float, bool)) or v is None:
            out[k] = v
    return out


def _time_metrics(inc: Incident, place: Placement) -> dict[str, Any]:
    """Wall-clock placement of the incident and where its fault falls relative to the profiled window."""
    t_first = inc.first_t if inc.clock == "wall" else None
    t_fault = inc.root_t if inc.clock == "wall" else None
    out: dict[str, Any] = {
        "time_placed": t_first is not None, "first_wall_ns": t_first, "fault_wall_ns": t_fault,
        "first_mono_s": (inc.first_t / 1e9) if inc.clock == "mono" and inc.first_t is not None else None,
    }
    win = place.window_of(inc.host)
    if win is not None and t_fault is not None:
        out["in_profiled_window"] = bool(win[0] <= t_fault <= win[1])
        out["seconds_from_profile_end"] = round((t_fault - win[1]) / 1e9, 3)
    else:
        out["in_profiled_window"] = None
    return out


def _evidence(inc: Incident, limit: int) -> tuple[dict[str, Any], ...]:
    return tuple(
        {k: v for k, v in (("source", e["source"]), ("line", e["line"]), ("time", e.get("time_text")),
                           ("kind", e["kind"]), ("text", (e.get("message") or "")[:300])) if v is not None}
        for e in inc.events[:limit]
    )


def _when(metrics: dict[str, Any], traced: bool) -> str:
    when = ""
    if metrics["in_profiled_window"] is True:
        when = " It happened inside the profiled window: check whether this rank is the straggler or the rank " \
               "missing from a timed-out collective (see the straggler / nccl_timeout findings)."
    elif metrics["in_profiled_window"] is False:
        when = f" It happened outside the profiled window ({metrics['seconds_from_profile_end']:+.0f} s from its end)."
    elif not metrics["time_placed"]:
        when = (" The log gives no wall-clock time for it (monotonic or no stamp, boot time unknown), so it is not "
                "placed on the job timeline.")
    if traced and not when.startswith(" It happened inside"):
        when += " The rank on this GPU is in the traces."
    return when


def _summary(inc: Incident, title: str, gpus: list[str], ranks: set[int], metrics: dict[str, Any], traced: bool) -> str:
    where = f"host {inc.host}" if inc.host else "an unnamed host"
    gpu_txt = f", GPU {', '.join(gpus)}" if gpus else ""
    rank_txt = f", rank(s) {', '.join(map(str, sorted(ranks)))}" if ranks else ""
    cause = f" (root cause: {inc.facts['root_cause']})" if inc.facts.get("root_cause") else ""
    return (f"{title} on {where}{gpu_txt}{rank_txt}: {len(inc.events)} log line(s) grouped into one incident"
            f"{cause}." + _when(metrics, traced))


def with_benign(f: Finding, benign: dict[str | None, int]) -> Finding:
    """The finding with the final count of benign lines of its host."""
    host = f.hosts[0] if f.hosts else None
    m = dict(f.metrics)
    m["benign_events"] = benign.get(host, 0)
    return Finding(**{**f.__dict__, "metrics": m})


def root_xid(xids: list[int], first: int | None = None) -> int:
    """The most severe Xid of the incident (ties: the first), ignoring sympathetic and 154; for an
    application incident the first Xid (what follows it, e.g. 109, is a consequence)."""
    if first is not None:
        return first
    cands = [x for x in xids if x not in SYMPATHETIC_XIDS and x != 154] or xids
    return max(cands, key=lambda x: (LEVELS.get(lookup(x).severity, 0), -cands.index(x)))


def first_xid(inc: Incident) -> int | None:
    if inc.group != "app":
        return None
    return next((int(e["xid"]) for e in inc.events if e["kind"] == "xid" and e["xid"] is not None), None)


def xid_title(inc: Incident, xids: list[int], cfg: GpuHwErrorConfig) -> str:
    root = incident_root(inc, xids) if xids else None
    if root is None:
        return "GPU error"
    info = lookup(root, cfg.policy)
    extra = [x for x in xids if x != root]
    t = f"Xid {root} ({info.description})"
    if inc.facts.get("unseen_root") is not None:
        n = len(inc.facts.get("gpus") or [inc.gpu])
        return (f"{'NVLink5 ' if inc.kind == 'nvlink5' else ''}{t} tore down CUDA channels on {n} GPU(s) "
                f"(Xid 45 'caused by previous Xid {root}'; the Xid {root} line itself is not in the log)")
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
