"""PCIe AER lines -> per-port error records -> incidents.

A fatal or uncorrected record followed by an Xid 79 / fallen-off-the-bus on the same host is one "PCIe
link loss" incident, with corrected records on that port shortly before as precursors; corrected records
make a finding only in bursts (``corrected_aer_min_count`` per ``corrected_aer_window_s``), else benign.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from forensics.base.bus_ids import normalize_bus_id
from forensics.detectors.gpu_hw_error.incident import Book, Incident, same_timeline
from forensics.facts.kernel_events import Event


@dataclass
class AerRecord:
    """The lines of one AER error on one port (header, severity line, error bits, the driver's recovery)."""

    port: str | None
    rows: list[Event]
    has_bus: bool
    sev: int | None = None  # 3 fatal, 2 uncorrected (non-fatal), 1 corrected
    src: str | None = None  # the errant device the port names ("error received: <bdf>" / "id=<bus devfn>")
    first: Event = field(init=False)

    def __post_init__(self) -> None:
        self.first = self.rows[0]


def _source_device(port: str | None, f: dict) -> str | None:
    """The device a root port's "error received" line names, as a normalised bus id."""
    if f.get("src"):
        return normalize_bus_id(f["src"])
    if f.get("id") and port:  # id = bus << 8 | device << 3 | function, in the port's domain
        v = int(f["id"], 16)
        return f"{port[:4]}:{v >> 8:02x}:{(v >> 3) & 0x1F:02x}.{v & 7}"
    return None


def _continues(rec: AerRecord, r: Event) -> bool:
    """Whether an AER line belongs to the record being read: the port's or the errant device's own lines
    (the kernel prints the details from the device that reported them), a driver's recovery line."""
    f, dev = r["f"], r["pci_bus_id"]
    what = f.get("what")
    if what == "received":
        return False
    if what == "recovery" and dev and f.get("drv") != "pcieport":
        return True  # "nvidia 0000:02:00.0: device has no AER-aware driver"
    if dev not in (rec.port, rec.src):
        return False
    return what != "bus_error" or (not rec.has_bus and rec.rows[-1]["source"] == r["source"])


def aer_records(rows: list[Event]) -> list[AerRecord]:
    """Group AER lines into per-port error records."""
    records: list[AerRecord] = []
    for r in rows:
        f = r["f"]
        if records and _continues(records[-1], r):
            records[-1].rows.append(r)
            records[-1].has_bus |= f.get("what") == "bus_error"
        else:
            port = r["pci_bus_id"]
            src = _source_device(port, f) if f.get("what") == "received" else None
            records.append(AerRecord(port, [r], f.get("what") == "bus_error", src=src))
        sev = str(f.get("sev", ""))
        if sev:
            rank = 3 if "Fatal" in sev and "Non" not in sev else 2 if sev.startswith("Uncorrect") else 1
            records[-1].sev = max(records[-1].sev or 0, rank)
    return records


def aer_device(rec: AerRecord, known_gpus: frozenset[str]) -> tuple[str | None, str | None]:
    """(the GPU an AER record belongs to, the errant device and its driver). The GPU is the function the
    nvidia driver owns, else a bus id known as a GPU (nvidia-smi, NCCL, the driver's own lines), else the
    function 0 of a known GPU's slot (its HDMI audio or USB-C function erred); a device no GPU owns is
    named, never taken for a GPU."""
    drivers: dict[str, str | None] = {}
    for r in rec.rows:
        dev = r["pci_bus_id"]
        if dev and dev != rec.port:
            drivers[dev] = r["f"].get("drv") or drivers.get(dev)
    gpu = next((d for d, drv in drivers.items() if drv == "nvidia"), None)
    gpu = gpu or next((d for d in drivers if d in known_gpus), None)
    gpu = gpu or next((d[:-1] + "0" for d in drivers if d[:-1] + "0" in known_gpus), None)
    reported = [r["pci_bus_id"] for r in rec.rows if r["f"].get("what") != "recovery"]
    errant = rec.src if rec.src not in (None, rec.port) else next((d for d in reported if d != rec.port), None)
    if errant is None:
        return gpu, None
    drv = drivers.get(errant)
    return gpu, f"{errant} ({drv})" if drv else errant


def aer_incidents(book: Book) -> None:
    """Incidents of the book's AER lines (after every other kernel event is in the book)."""
    records = aer_records(book.aer_rows)
    fatal = [rec for rec in records if (rec.sev or 0) >= 2]
    corrected = [rec for rec in records if (rec.sev or 0) < 2]
    used: set[int] = set()
    for rec in fatal:
        tgt = _fatal_incident(book, rec)
        used |= _add_precursors(book, tgt, rec, corrected, used)
    _corrected_bursts(book, [c for j, c in enumerate(corrected) if j not in used])


def _link_loss_target(book: Book, rec: AerRecord) -> Incident | None:
    """An Xid 79 / fallen-off-the-bus incident on the record's host shortly after it."""
    first, cfg = rec.first, book.cfg
    for inc in book.by_host.get(first["host"], ()):
        if inc.source != first["source"] and inc.clock != "wall":
            continue
        if inc.track[0] != "gpu" or not (79 in inc.facts.get("xids", set()) or inc.kind == "fallen_off_bus"):
            continue
        t0 = inc.first_t
        if same_timeline(inc.events[0], first) and first["t"] is not None and t0 is not None and \
                -1e9 <= t0 - first["t"] <= cfg.aer_xid_window_s * 1e9:
            return inc
        if first["clock"] == "none" and inc.clock == "none" and 0 <= inc.last_line - first["line"] <= 20:
            return inc
    return None


def _fatal_incident(book: Book, rec: AerRecord) -> Incident:
    level = "CRITICAL" if rec.sev == 3 else "HIGH"
    gpu, errant = aer_device(rec, book.known_gpus)
    tgt = _link_loss_target(book, rec)
    if tgt is None:
        track = ("gpu", gpu) if gpu else ("pcie", rec.port)
        tgt = book.open(Incident("aer", dict(rec.first, pci_bus_id=gpu), track, level, "REBOOT_NODE;INSPECT_PCIE",
                                 f"PCIe {'fatal' if rec.sev == 3 else 'uncorrected'} AER on {rec.port}"))
        tgt.gpu = gpu
        for r in rec.rows[1:]:
            tgt.add(r)
    else:
        for r in rec.rows:
            tgt.add(r, level, "INSPECT_PCIE")
    tgt.facts["root_cause"] = (f"PCIe link loss on port {rec.port}" if rec.sev == 3
                               else f"PCIe uncorrected error on {rec.port}") + (f", reported by {errant}" if errant else "")
    tgt.facts["aer_port"] = rec.port
    if errant:
        tgt.facts["aer_device"] = errant
    bits = [r["f"].get("name") for r in rec.rows if r["f"].get("what") == "bit"]
    if bits:
        tgt.facts["aer_errors"] = ", ".join(b for b in bits if b)
    return tgt


def _add_precursors(book: Book, tgt: Incident, rec: AerRecord, corrected: list[AerRecord], used: set[int]) -> set[int]:
    """Corrected errors on the same port shortly before a fatal one are its precursors; their indexes."""
    first, took = rec.first, set()
    for j, c in enumerate(corrected):
        cf = c.first
        if j in used or (cf["host"], c.port) != (first["host"], rec.port):
            continue
        if same_timeline(cf, first) and cf["t"] is not None and first["t"] is not None \
                and 0 <= first["t"] - cf["t"] <= book.cfg.precursor_window_s * 1e9:
            for r in c.rows:
                tgt.add(r)
            tgt.facts["precursor_corrected_aer"] = tgt.facts.get("precursor_corrected_aer", 0) + 1
            took.add(j)
    return took


def _burst(recs: list[AerRecord], window_s: float) -> int:
    """Most records within ``window_s`` of each other (all of them when some are untimed)."""
    times = [c.first["t"] for c in recs]
    if not all(t is not None for t in times):
        return len(recs)
    ts = sorted(times)
    burst, lo = 0, 0
    for hi in range(len(ts)):
        while ts[hi] - ts[lo] > window_s * 1e9:
            lo += 1
        burst = max(burst, hi - lo + 1)
    return burst


def _corrected_bursts(book: Book, corrected: list[AerRecord]) -> None:
    """Corrected AER: a finding only above a rate, else benign (counted)."""
    cfg = book.cfg
    by_port: dict[tuple, list[AerRecord]] = {}
    for c in corrected:
        by_port.setdefault((c.first["host"], c.port), []).append(c)
    for (_host, port), recs in by_port.items():
        burst = _burst(recs, cfg.corrected_aer_window_s)
        if burst < cfg.corrected_aer_min_count:
            for c in recs:
                for r in c.rows:
                    book.count_benign(r)
            continue
        inc = book.open(Incident("aer_corrected", recs[0].first, ("pcie", port), "WARNING", "INSPECT_PCIE",
                                 f"Burst of corrected PCIe AER errors on {port}"))
        for c in recs:
            for r in (c.rows if c is not recs[0] else c.rows[1:]):
                inc.add(r)
        inc.facts.update(aer_port=port, corrected_errors=len(recs), max_per_window=burst)
        bits = sorted({r["f"].get("name") for c in recs for r in c.rows if r["f"].get("what") == "bit"} - {None})
        if bits:
            inc.facts["aer_errors"] = ", ".join(bits)
