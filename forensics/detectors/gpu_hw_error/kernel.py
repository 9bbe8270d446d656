"""Kernel-log events -> incidents: one handler per event kind, looked up in :data:`HANDLERS`.

Each handler either joins the event to an open incident of the same host (through :class:`Book`) or
opens a new one; lines that prove nothing are counted as benign.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from forensics.base.xid_catalog import lookup
from forensics.detectors.gpu_hw_error import xid
from forensics.detectors.gpu_hw_error.aer import aer_incidents
from forensics.detectors.gpu_hw_error.incident import Book, Incident, merge_nvlink5_node
from forensics.detectors.gpu_hw_error.memory import on_ghes, on_mce
from forensics.facts.kernel_events import Event

if TYPE_CHECKING:
    from forensics.detectors.gpu_hw_error.config import GpuHwErrorConfig

Handler = Callable[[Book, Event], None]

# imbue cluster-health allow-list of expected SXids
BENIGN_SXIDS = frozenset({11012, 11021, 11022, 11023, 12021, 12023, 15008, 15011, 19049, 19055, 19057, 19059,
                          19062, 19065, 19068, 19071, 24001, 24002, 24003, 22013})


# kinds whose bus id is a GPU's (the nvidia driver wrote it)
_GPU_LINE_KINDS = frozenset({"xid", "fallen_off_bus", "gpu_init_failed", "gpu_identity", "gsp"})


def kernel_incidents(rows: list[Event], cfg: GpuHwErrorConfig, benign: dict[str | None, int],
                     known_gpus: frozenset[str] = frozenset()) -> list[Incident]:
    """Every incident of the kernel logs' events (sorted per host, see events.prepare_events); ``known_gpus``
    are bus ids other inputs (nvidia-smi, NCCL) know as GPUs."""
    logged = {r["pci_bus_id"] for r in rows if r["kind"] in _GPU_LINE_KINDS and r["pci_bus_id"]}
    book = Book(cfg, benign, known_gpus | logged)
    for r in rows:  # "Timeout ... from GPU4 GSP" on an Xid names the bus id of driver instance GPU4
        if r["kind"] == "xid" and r["pci_bus_id"] and r["f"].get("gpu_instance") is not None:
            book.gsp_bus[(r["host"], r["source"], r["f"]["gpu_instance"])] = r["pci_bus_id"]
    for r in rows:
        book.host = r["host"]
        handler = HANDLERS.get(r["kind"])
        if handler is not None:
            handler(book, r)
    aer_incidents(book)
    merge_nvlink5_node(book.incs)
    return book.incs


def on_fallen_off_bus(book: Book, r: Event) -> None:
    info = lookup(79, book.cfg.policy)
    gpu, host = r["pci_bus_id"], r["host"]
    tgt = book.near(r, lambda i: i.track == ("gpu", gpu) and i.group == "hw" and i.host == host)
    if tgt:
        tgt.add(r, info.severity, info.action)
        return
    title = "GPU has fallen off the bus" + (" at driver probe" if r["f"].get("what") == "probe" else "")
    book.open(Incident("fallen_off_bus", r, ("gpu", gpu), info.severity, info.action, title))


def on_gpu_init_failed(book: Book, r: Event) -> None:
    """`RmInitAdapter failed` / `rm_init_adapter failed`: the driver could not bring the GPU up; it is
    missing from CUDA and nvidia-smi until a reset or reboot. Joins a fault of the same GPU (fallen off
    the bus at probe) when there is one, else the GPU's earlier init failure: the driver retries at each open
    of the device (after boot, at each job start) and the GPU stays down however far apart the retries are."""
    f, gpu, host = r["f"], r["pci_bus_id"], r["host"]
    tgt = book.near(r, lambda i: i.track == ("gpu", gpu) and i.group == "hw" and i.host == host)
    if tgt is None and gpu is not None:
        tgt = book.latest(lambda i: i.kind == "gpu_init_failed" and i.track == ("gpu", gpu) and i.host == host)
    if tgt is None:
        tgt = book.open(Incident("gpu_init_failed", r, ("gpu", gpu), "CRITICAL",
                                 "DRAIN_NODE;REBOOT_NODE;INSPECT_PCIE;INVESTIGATE_SW",
                                 f"GPU {gpu or '(bus id not in the log)'} failed to initialize (RmInitAdapter failed)"))
    else:
        tgt.add(r, "CRITICAL", "INVESTIGATE_SW")
    for key in ("init_status", "device_minor"):
        if f.get(key) is not None:
            tgt.facts[key] = f[key]


def on_gsp(book: Book, r: Event) -> None:
    host, idx = r["host"], r["f"].get("gpuidx")
    bus = r["pci_bus_id"] or (book.gsp_bus.get((host, r["source"], idx)) if idx is not None else None)

    def on_gpu(i: Incident) -> bool:
        return i.track == ("gpu", bus) if bus is not None else i.track[0] == "gpu"

    tgt = book.near(r, lambda i: i.host == host and i.group == "hw" and on_gpu(i))
    if tgt is None:
        tgt = book.near(r, lambda i: i.kind == "gsp" and i.host == host and i.facts.get("gpu_instance") == idx)
    if tgt:
        tgt.add(r)
        return
    inc = book.open(Incident("gsp", dict(r, pci_bus_id=bus), ("gpu", bus) if bus else ("gsp", idx), "CRITICAL",
                             "DRAIN_NODE;RESET_GPU;INVESTIGATE_SW",
                             "GSP firmware timeout (Xid 119/120-equivalent, no Xid printed)"))
    inc.gpu = bus
    inc.facts["gpu_instance"] = idx


def on_aer(book: Book, r: Event) -> None:
    book.aer_rows.append(r)


def on_sxid(book: Book, r: Event) -> None:
    f, gpu, host = r["f"], r["pci_bus_id"], r["host"]
    sx = f.get("sxid")
    fatal = bool(f.get("fatal")) or f.get("fatality") == "fatal"
    if sx in BENIGN_SXIDS and not fatal:
        book.count_benign(r)
        return
    level, act = ("CRITICAL", "DRAIN_NODE;REBOOT_NODE") if fatal else ("WARNING", "INVESTIGATE_SW")
    tgt = book.near(r, lambda i: i.track == ("switch", gpu) and i.host == host)
    if tgt:
        tgt.add(r, level, act)
        return
    inc = book.open(Incident("nvswitch", r, ("switch", gpu), level, act,
                             f"NVSwitch {'fatal' if fatal else 'non-fatal'} error SXid {sx}"))
    inc.facts["switch"] = gpu


def on_fabric_manager(book: Book, r: Event) -> None:
    if r["f"].get("sxid") is not None:
        on_sxid(book, r)
        return
    book.open(Incident("fabric_manager", r, ("fm", r["line"]), "WARNING", "INVESTIGATE_SW",
                       "Fabric manager error (NVLink/NVLS setup may fail)"))


def on_nvlink(book: Book, r: Event) -> None:
    host = r["host"]
    tgt = book.near(r, lambda i: i.kind == "nvlink" and i.host == host)
    if tgt:
        tgt.add(r)
        return
    book.open(Incident("nvlink", r, ("nvlink", host), "HIGH", "RESET_GPU;REBOOT_NODE;INSPECT_LINK",
                       "NVLink discovery/training failure (P2P over NVLink missing or degraded)"))


def on_ecc(book: Book, r: Event) -> None:
    host = r["host"]
    tgt = book.near(r, lambda i: i.host == host and i.track[0] == "gpu" and i.group == "hw")
    if tgt:
        tgt.add(r)
        return
    book.open(Incident("ecc", r, ("ecc", host), "WARNING", "RESET_GPU", "GPU ECC / memory-retirement event"))


def on_device_other(book: Book, r: Event) -> None:
    """Another function of the same GPU board (USB-C, I2C): sympathetic to that GPU's incident."""
    slot, host = (r["pci_bus_id"] or "")[:10], r["host"]
    tgt = book.near(r, lambda i: i.gpu is not None and i.gpu[:10] == slot and i.host == host)
    if tgt:
        tgt.add(r)


def on_pcie_link(book: Book, r: Event) -> None:
    f, gpu = r["f"], r["pci_bus_id"]
    tgt = book.latest(lambda i: i.kind == "pcie_link" and i.track == ("pcie_link", gpu))
    if tgt:
        tgt.add(r)
        return
    title = (f"PCIe link of {gpu} degraded: {f.get('speed')} x{f.get('width')} (limited at {f.get('at')})"
             if f.get("what") == "limited" else f"PCIe link down on {gpu}")
    inc = book.open(Incident("pcie_link", r, ("pcie_link", gpu), "WARNING", "INSPECT_PCIE", title))
    inc.gpu = None  # the device may be a NIC or a switch port; GPUs are named only by Xid lines
    inc.facts["device"] = gpu


def on_segfault(book: Book, r: Event) -> None:
    inc = book.open(Incident("segfault", r, ("segfault", r["pid"]), "INFO", "RESTART_APP",
                             f"Segfault of {r['process']} (pid {r['pid']})"))
    inc.ranks_pid.add(r["pid"])
    inc.facts["needs_rank"] = True


def on_benign(book: Book, r: Event) -> None:
    book.count_benign(r)


HANDLERS: dict[str, Handler] = {
    "xid": xid.on_xid, "fallen_off_bus": on_fallen_off_bus, "gpu_init_failed": on_gpu_init_failed, "gsp": on_gsp, "aer": on_aer, "sxid": on_sxid,
    "fabric_manager": on_fabric_manager, "nvlink": on_nvlink, "ecc": on_ecc, "device_other": on_device_other,
    "pcie_link": on_pcie_link, "mce": on_mce, "ghes": on_ghes, "segfault": on_segfault, "benign": on_benign,
}
# host-side kinds (EDAC, OOM, hung tasks, lockups, NIC links, CPU thermal, filesystems) are node_health's:
# forensics.facts.host_events.HOST_KINDS
