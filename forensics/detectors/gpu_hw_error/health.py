"""``nvidia-smi -q`` and ``dcgmi diag`` reports -> incidents (persistent GPU state rather than log lines)."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import polars as pl

from forensics.base.xid_catalog import LEVELS
from forensics.detectors.gpu_hw_error.incident import Incident
from forensics.facts.kernel_events import synthetic_event
from forensics.facts.placement import Placement, host_key

if TYPE_CHECKING:
    from forensics.detectors.gpu_hw_error.config import GpuHwErrorConfig

Row = dict[str, Any]
HW_CLOCK_REASONS = {"hw slowdown": "HIGH", "hw thermal slowdown": "HIGH", "hw power brake slowdown": "HIGH",
                    "sw thermal slowdown": "WARNING"}


def _sram_text(r: Row) -> str:
    v, a = r["ecc_volatile_sram_ue"] or 0, r["ecc_aggregate_sram_ue"] or 0
    return f"SRAM uncorrectable ECC: volatile {v}, aggregate {a}" + (" (more than 4 aggregate: usually RMA)" if a > 4 else "")


# (does the row show it, level, actions, what to say), in the order the finding lists them
SMI_CHECKS: tuple[tuple[Callable[[Row], Any], str, str, Callable[[Row], str]], ...] = (
    (lambda r: r["remap_failure"], "CRITICAL", "DRAIN_NODE;RESET_GPU;RMA_CANDIDATE",
     lambda r: "row remapping failure occurred"),
    (lambda r: r["remap_pending"], "HIGH", "DRAIN_NODE;RESET_GPU",
     lambda r: f"row remap pending ({r['remapped_rows_ue'] or 0} uncorrectable-error rows): reset to activate"),
    (lambda r: (r["ecc_volatile_dram_ue"] or 0) > 0, "CRITICAL", "DRAIN_NODE;RESET_GPU",
     lambda r: f"{r['ecc_volatile_dram_ue']} volatile DRAM uncorrectable ECC error(s)"),
    (lambda r: (r["ecc_volatile_sram_ue"] or 0) > 0 or (r["ecc_aggregate_sram_ue"] or 0) > 0, "HIGH",
     "RESET_GPU;RMA_CANDIDATE", _sram_text),
    (lambda r: r["sram_threshold_exceeded"], "HIGH", "RMA_CANDIDATE", lambda r: "SRAM threshold exceeded"),
    (lambda r: r["retired_pages_pending"], "HIGH", "REBOOT_NODE", lambda r: "page retirement pending"),
    (lambda r: (r["remap_banks_none"] or 0) > 0, "WARNING", "RMA_CANDIDATE",
     lambda r: f"{r['remap_banks_none']} bank(s) with no spare rows left"),
    (lambda r: r["reset_required"] or r["drain_and_reset"], "HIGH", "DRAIN_NODE;RESET_GPU",
     lambda r: "driver says a GPU reset is required"),
)


def smi_incidents(gh: pl.DataFrame, cfg: GpuHwErrorConfig, benign: dict[str | None, int],
                  place: Placement) -> list[Incident]:
    """GPU memory health per GPU, then HW clock throttling per GPU or per node."""
    rows = gh.to_dicts()
    incs = [inc for i, r in enumerate(rows) if (inc := _memory_health(i, r, benign, place)) is not None]
    return incs + _throttling(rows, cfg, place)


def _memory_health(i: int, r: Row, benign: dict[str | None, int], place: Placement) -> Incident | None:
    host = place.host_for(r["host"], r["source"])
    problems = [(level, act, text(r)) for shows, level, act, text in SMI_CHECKS if shows(r)]
    if not problems:
        benign[host] = benign.get(host, 0) + 1
        return None
    ev = synthetic_event(host, r["pci_bus_id"], r["source"], i + 1, r["snapshot_ns"], "nvidia_smi", "")
    worst = max(problems, key=lambda p: LEVELS[p[0]])
    inc = Incident("nvidia_smi", ev, ("gpu", r["pci_bus_id"]), worst[0], "",
                   "GPU memory health (nvidia-smi -q): " + worst[2])
    for _lvl, act, _txt in problems:
        inc.actions += [a for a in act.split(";") if a not in inc.actions]
    inc.events = [dict(ev, message="; ".join(p[2] for p in problems))]
    inc.facts.update(remapped_rows_ue=r["remapped_rows_ue"], aggregate_dram_ue=r["ecc_aggregate_dram_ue"],
                     aggregate_sram_ue=r["ecc_aggregate_sram_ue"], gpu_index=r["gpu_index"])
    return inc


def _throttling(rows: list[Row], cfg: GpuHwErrorConfig, place: Placement) -> list[Incident]:
    """The same HW reason on >= ``node_level_min_fraction`` of a snapshot's GPUs is a node-level cause."""
    groups: dict[tuple, list[int]] = {}
    per_snapshot: dict[tuple, int] = {}
    for i, r in enumerate(rows):
        snap = (place.host_for(r["host"], r["source"]), r["source"], r["snapshot_ns"])
        per_snapshot[snap] = per_snapshot.get(snap, 0) + 1
        for reason in r["clock_reasons_active"] or []:
            if reason.lower() in HW_CLOCK_REASONS:
                groups.setdefault((*snap, reason.lower()), []).append(i)
    incs: list[Incident] = []
    # the most specific reason carries the cause: a power brake implies "HW Slowdown" too
    for key, idxs in sorted(groups.items(), key=lambda kv: -len(kv[0][3])):
        if key[3] == "hw slowdown" and any(k[:3] == key[:3] and k[3] != "hw slowdown" and set(v) >= set(idxs)
                                           for k, v in groups.items()):
            continue
        n = per_snapshot[key[:3]]
        node = len(idxs) >= 2 and len(idxs) >= cfg.node_level_min_fraction * n
        for tg in [idxs] if node else [[i] for i in idxs]:
            incs.append(_throttle_incident(rows, key, tg, idxs, n, node))
    return incs


def _throttle_incident(rows: list[Row], key: tuple, tg: list[int], idxs: list[int], n: int, node: bool) -> Incident:
    host, source, snap, reason = key
    r = rows[tg[0]]
    ev = synthetic_event(host, r["pci_bus_id"] if not node else None, source, tg[0] + 1, snap, "nvidia_smi",
                         f"Clocks event reason active: {reason} (SM clock {r['sm_clock_mhz']} MHz)")
    action = "CHECK_POWER" if "power" in reason else "CHECK_COOLING"
    inc = Incident("throttle", ev, ("node", host) if node else ("gpu", r["pci_bus_id"]), HW_CLOCK_REASONS[reason],
                   action, f"GPU clocks throttled: {reason}" + (f" on {len(idxs)} of {n} GPUs (node-level cause)" if node else ""))
    inc.gpu = None if node else r["pci_bus_id"]
    inc.facts.update(reason=reason, gpus_affected=len(idxs), gpus_in_snapshot=n, node_level=node,
                     sm_clock_mhz=r["sm_clock_mhz"])
    if node:
        inc.facts["gpus"] = sorted({rows[i]["pci_bus_id"] for i in idxs if rows[i]["pci_bus_id"]})
    return inc


def _diag_grade(r: Row) -> tuple[str, str, str] | None:
    """(level, actions, title) of a dcgmi diag result; None when it passed."""
    res, low = r["result"], (r["message"] or "").lower()
    if res == "fail":
        return "CRITICAL", "DRAIN_NODE;RMA_CANDIDATE", f"DCGM diagnostic '{r['test']}' failed"
    if res == "error" and "pending" in low:
        return "HIGH", "DRAIN_NODE;RESET_GPU", "DCGM: row remappings pending"
    if res == "error":
        return "HIGH", "DRAIN_NODE;INVESTIGATE_SW", f"DCGM error in {r['test']}"
    if res == "warning":
        if "thermal" in low:
            return "WARNING", "CHECK_COOLING", "DCGM: thermal violations"
        return "WARNING", "INVESTIGATE_SW", f"DCGM warning in {r['test']}"
    return None


def diag_incidents(gd: pl.DataFrame, benign: dict[str | None, int], place: Placement) -> list[Incident]:
    incs: list[Incident] = []
    for r in gd.to_dicts():
        host = place.host_for(r["host"], r["source"])
        grade = _diag_grade(r)
        if grade is None:
            benign[host] = benign.get(host, 0) + 1
            continue
        level, act, title = grade
        msg, idx = r["message"] or "", r["gpu_index"]
        # DCGM GPU ids are NVML indices: nvidia-smi -q of the same host names their bus ids
        bus = place.bus_by_index.get((host_key(host), idx)) if idx is not None else None
        ev = synthetic_event(host, bus, r["source"], r["line"], None, "dcgmi", f"{r['test']}: {msg}")
        inc = Incident("dcgmi", ev, ("gpu", bus) if bus else ("dcgm", idx, r["line"]),
                       level, act, title + (f" on GPU {idx}" if idx is not None else ""))
        inc.gpu = bus
        inc.facts["dcgm_gpu_index"] = idx
        m = re.search(r"totaling ([\d.]+) seconds?", msg.replace("second s", "seconds"))
        if m:
            inc.facts["thermal_violation_s"] = float(m.group(1))
        incs.append(inc)
    return incs
