"""The Xid catalog (``forensics/base/data/xid_catalog.csv``) and the payload rules that refine it.

One row per Xid: NVIDIA's name and resolution buckets, our usual cause, class, severity and action,
and the same under a ``strict`` policy (Azure NHC / imbue / k8s-device-plugin / DCGM: fail on 63, 92,
109, 121) and a ``lenient`` one (NVIDIA catalog bucket / Meta gcm: 63, 92, 121 informational, 109 an
application warning). ``default`` is the research notes' consensus table (docs/gpu_health.md).

Severities use the four-level scale CRITICAL > HIGH > WARNING > INFO; findings map CRITICAL and HIGH
to ``critical``.

Names and resolution buckets follow NVIDIA's catalog, "Analyzing Xid Errors with the Xid Catalog"
(https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html, Ampere and newer). The NVLink5
Xids 144-150 (SAW, RLW, TLW, TREX, NVLPW_CTRL, NETIR, MSE; GB200/B200) all carry the bucket
WORKFLOW_NVLINK5_ERR there: their severity is read from the payload the driver prints, "<unit>
<Fatal|Nonfatal> XC<n> i<n> Link <n> (<intrinfo> <error status> ...)", by :func:`nvlink5_severity`
(sub-code = ``(intrinfo >> 20) & 0x3f``).
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


def nvlink5_severity(unit: str | None, fatal: bool | None, link: int | None, subcode: int | None) -> tuple[str, str,
                                                                                                           str]:
    """(severity, action, catalog bucket) for an NVLink5 Xid 144-150 from its decoded payload, after NVIDIA's
    NVLink5 rules: fatal MSE (firmware watchdog) -> reset; a fatal NETIR link event -> reset and inspect the
    link, unless its sub-code (0x15, 0x20-0x25) says the peer device is the source; a fatal error with no
    link (-1) is reported solo; non-fatal BER events are ignorable link-quality signals and RLW_SRC_TRACK
    asks to check for an Xid 154."""
    unit = unit or ""
    if fatal:
        if unit == "MSE_WATCHDOG" or unit.startswith("MSE"):
            return "HIGH", "RESET_GPU", "RESET_GPU"
        if unit in ("NETIR_LINK_EVT", "NETIR_LINK_DOWN"):
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


# Xid 74 register workflow (NVIDIA WORKFLOW_NVLINK_ERR as quoted in NVSentinel's design doc; registers
# numbered 1-7, Hopper uses 1, 3, 4, 5): register -> {bit: class}
_XID74_BITS: dict[int, dict[int, str]] = {
    1: {0: "ignore", 23: "ignore", 30: "ignore", 1: "sympathetic", 20: "sympathetic", 4: "ecc_parity", 5: "ecc_parity",
        8: "possible_hw", 9: "possible_hw", 12: "possible_hw", 16: "possible_hw", 17: "possible_hw", 24: "possible_hw",
        28: "possible_hw", 21: "marginal_si", 22: "marginal_si", 27: "bug_if_repeated", 29: "bug_if_repeated"},
    3: {0: "ecc_parity", 1: "ecc_parity", 2: "ecc_parity", 6: "ecc_parity", 13: "unexpected", 16: "diag_if_repeated",
        19: "diag_if_repeated", 17: "bug_if_repeated", 18: "bug_if_repeated"},
    4: {16: "sympathetic", 17: "sympathetic", 18: "sympathetic_fabric_reset"},
    5: {18: "ecc_parity", 19: "ecc_parity", 21: "ecc_parity", 22: "ecc_parity", 24: "ecc_parity", 25: "ecc_parity",
        27: "ecc_parity", 28: "ecc_parity", 20: "ecc_threshold", 23: "ecc_threshold", 26: "ecc_threshold",
        29: "ecc_threshold"},
}


def decode_xid74(regs: list[str]) -> tuple[list[str], str, str]:
    """(classes of the set bits, severity, action) for the seven Xid 74 registers."""
    classes: list[str] = []
    for reg, bits in _XID74_BITS.items():
        if reg - 1 >= len(regs):
            continue
        try:
            value = int(regs[reg - 1], 16)
        except ValueError:
            continue
        for bit, cls in bits.items():
            if value >> bit & 1 and cls not in classes:
                classes.append(cls)
    if any(c in ("possible_hw", "marginal_si", "unexpected") for c in classes):
        return classes, "HIGH", "RESET_GPU;INSPECT_LINK;RMA_CANDIDATE"
    if "sympathetic_fabric_reset" in classes:
        return classes, "HIGH", "RESET_GPU"
    if classes and all(c in ("ignore", "sympathetic", "ecc_threshold") for c in classes):
        return classes, "WARNING", "NONE" if "sympathetic" not in classes else "INSPECT_LINK"
    return classes, "HIGH", "RESET_GPU;INSPECT_LINK"
