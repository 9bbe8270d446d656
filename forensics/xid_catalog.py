"""The Xid catalog (``forensics/data/xid_catalog.csv``) and the payload rules that refine it.

One row per Xid: NVIDIA's name and resolution buckets, our usual cause, class, severity and action,
and the same under a ``strict`` policy (Azure NHC / imbue / k8s-device-plugin / DCGM: fail on 63, 92,
109, 121) and a ``lenient`` one (NVIDIA catalog bucket / Meta gcm: 63, 92, 121 informational, 109 an
application warning). ``default`` is the research notes' consensus table (docs/gpu_health.md).

Severities use the four-level scale CRITICAL > HIGH > WARNING > INFO; findings map CRITICAL and HIGH
to ``critical``.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

CATALOG_PATH = Path(__file__).resolve().parent / "data" / "xid_catalog.csv"
POLICIES = ("default", "strict", "lenient")
LEVELS = {"INFO": 1, "WARNING": 2, "HIGH": 3, "CRITICAL": 4}

# Xid 154 recovery actions (gpu.c::_gpuRecoveryActionName) -> (severity, action)
RECOVERY_ACTIONS = {
    "None": ("INFO", "NONE"),
    "GPU Reset Required": ("CRITICAL", "RESET_GPU"),
    "Node Reboot Required": ("CRITICAL", "REBOOT_NODE"),
    "Drain P2P": ("HIGH", "DRAIN_NODE"),
    "Drain and Reset": ("CRITICAL", "DRAIN_NODE;RESET_GPU"),
    "Recover IMEX Domain": ("HIGH", "INVESTIGATE_SW"),
}


@dataclass(frozen=True)
class XidInfo:
    xid: int
    name: str
    description: str
    usual_cause: str
    catalog_immediate: str
    catalog_investigatory: str
    xid_class: str  # app, memory, nvlink, nvlink5, pcie, gsp, firmware, hardware, driver, power, recovery, sympathetic
    severity: str
    action: str
    known: bool = True


@lru_cache(maxsize=1)
def _rows() -> dict[int, dict[str, str]]:
    with CATALOG_PATH.open(newline="") as fh:
        return {int(r["xid"]): r for r in csv.DictReader(fh)}


def catalog_codes() -> list[int]:
    return sorted(_rows())


def lookup(xid: int, policy: str = "default") -> XidInfo:
    """Catalog entry under ``policy``; an unknown Xid is WARNING 'unknown Xid N' so the catalog can grow."""
    if policy not in POLICIES:
        raise ValueError(f"unknown Xid policy {policy!r}; known: {', '.join(POLICIES)}")
    r = _rows().get(xid)
    if r is None:
        return XidInfo(xid, f"UNKNOWN_XID_{xid}", f"unknown Xid {xid}", "unknown", "", "", "unknown",
                       "WARNING", "INVESTIGATE_SW", known=False)
    prefix = "" if policy == "default" else policy + "_"
    return XidInfo(
        xid, r["name"], r["description"], r["usual_cause"], r["catalog_immediate"], r["catalog_investigatory"],
        r["class"], r[prefix + "severity"], r[prefix + "action"],
    )


def nvlink5_severity(unit: str | None, fatal: bool | None, link: int | None, subcode: int | None) -> tuple[str, str, str]:
    """(severity, action, catalog bucket) for an NVLink5 Xid 144-150 from its decoded payload."""
    unit = unit or ""
    if fatal:
        if unit == "MSE_WATCHDOG" or unit.startswith("MSE"):
            return "HIGH", "RESET_GPU", "RESET_GPU"
        if unit == "NETIR_LINK_EVT":
            if subcode is not None and (subcode == 0x15 or 0x20 <= subcode <= 0x25):
                return "HIGH", "RESET_GPU;INSPECT_LINK", "RESET_GPU (INVESTIGATE_PEER_DEVICE)"
            return "CRITICAL", "RESET_GPU;INSPECT_LINK", "RESET_GPU (INVESTIGATE_LINK_SI)"
        if link == -1:
            return "HIGH", "RESET_GPU", "RESET_GPU (Link Fatal, SYMPATHETIC_REPORT_SOLO)"
        return "HIGH", "RESET_GPU;INSPECT_LINK", "WORKFLOW_NVLINK5_ERR"
    if unit.endswith("BER_EVENT"):
        return "INFO", "INSPECT_LINK", "IGNORE (INVESTIGATE_LINK_SI_AND_CABLES)"
    if unit == "RLW_SRC_TRACK":
        return "WARNING", "INVESTIGATE_SW", "XID_154_EVAL"
    return "WARNING", "INVESTIGATE_SW", "IGNORE"


def max_level(*levels: str) -> str:
    return max(levels, key=lambda s: LEVELS.get(s, 0))
