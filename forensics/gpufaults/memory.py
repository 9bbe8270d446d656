"""Host memory and firmware errors (EDAC, MCE, APEI GHES) -> incidents: these are not GPU faults."""

from __future__ import annotations

import re

from forensics.gpufaults.events import Event
from forensics.gpufaults.incident import Book, Incident


def on_ghes(book: Book, r: Event) -> None:
    f, host = r["f"], r["host"]
    rec = f.get("rec")
    tgt = book.near(r, lambda i: i.kind == "ghes" and i.host == host and i.facts.get("rec") == rec,
                    book.cfg.sympathetic_window_s)
    if tgt is None:
        tgt = book.open(Incident("ghes", r, ("ghes", rec), "WARNING", "INSPECT_PCIE",
                                 "Firmware-reported (APEI GHES) hardware error"))
        tgt.facts["rec"] = rec
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


def on_edac(book: Book, r: Event) -> None:
    f, host = r["f"], r["host"]
    if f.get("ekind") not in ("UE", "CE"):
        on_mce(book, r)
        return
    ue = f["ekind"] == "UE"
    tgt = book.near(r, lambda i: i.kind == "edac" and i.host == host and i.facts.get("dimm") == f.get("dimm"))
    level = "CRITICAL" if ue else "WARNING"
    if tgt is None:
        tgt = book.open(Incident(
            "edac", r, ("edac", f.get("dimm")), level, "DRAIN_NODE;RMA_CANDIDATE" if ue else "RMA_CANDIDATE",
            f"Host DRAM {'uncorrectable' if ue else 'correctable'} error (EDAC) on {f.get('dimm')} - not a GPU"))
        tgt.facts["dimm"] = f.get("dimm")
    else:
        tgt.add(r, level)
    tgt.facts["count"] = tgt.facts.get("count", 0) + int(f.get("count") or 1)


def on_mce(book: Book, r: Event) -> None:
    """`mce: ... logged` / EDAC "HANDLING MCE": context of an EDAC or GHES incident just before, else benign."""
    host = r["host"]
    tgt = book.near(r, lambda i: i.kind in ("edac", "ghes") and i.host == host)
    if tgt is not None:
        tgt.add(r)
    else:
        book.count_benign(r)
