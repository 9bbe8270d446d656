"""Firmware-reported hardware errors (APEI GHES, MCE context) -> incidents. Host DRAM errors (EDAC) are
node_health's (forensics/facts/host_events.py)."""

from __future__ import annotations

import re

from forensics.detectors.gpu_hw_error.incident import Book, Incident
from forensics.facts.kernel_events import Event


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


def on_mce(book: Book, r: Event) -> None:
    """`mce: ... logged`: context of a GHES incident just before, else benign."""
    host = r["host"]
    tgt = book.near(r, lambda i: i.kind == "ghes" and i.host == host)
    if tgt is not None:
        tgt.add(r)
    else:
        book.count_benign(r)
