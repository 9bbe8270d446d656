"""Xid events -> incidents: graded by the Xid catalog and the payload, sympathetic Xids joined to their root."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from forensics.base.xid_catalog import RECOVERY_ACTIONS, XidInfo, decode_xid74, lookup, nvlink5_severity
from forensics.detectors.gpu_hw_error.incident import Book, Incident
from forensics.facts.kernel_events import Event

SYMPATHETIC_XIDS = frozenset({3, 43, 45})


def is_nvlink5(x: int) -> bool:
    return 144 <= x <= 150


def grade(x: int, info: XidInfo, f: dict[str, Any]) -> tuple[str, str]:
    """(level, actions) of one Xid: the catalog's, refined by the payload (records ``catalog_bucket`` in ``f``)."""
    level, action = info.severity, info.action
    if is_nvlink5(x):
        level, action, bucket = nvlink5_severity(f.get("nvlink_unit"), f.get("fatal"), f.get("link"), f.get("subcode"))
        f["catalog_bucket"] = bucket
    if x == 154:
        level, action = RECOVERY_ACTIONS.get(f.get("recovery_action", ""), ("WARNING", "INVESTIGATE_SW"))
    if x == 74 and f.get("nvlink_regs"):
        classes, level, action = decode_xid74(f["nvlink_regs"])
        f["catalog_bucket"] = "WORKFLOW_NVLINK_ERR: " + (",".join(classes) or "no known bit")
    return level, action


def on_xid(book: Book, r: Event) -> None:
    f, gpu = r["f"], r["pci_bus_id"]
    x = int(r["xid"])
    info = lookup(x, book.cfg.policy)
    level, action = grade(x, info, f)
    if (x in SYMPATHETIC_XIDS or x == 154) and _join_root(book, r, x, level, action):
        return
    group = "app" if info.xid_class in ("app", "sympathetic") else "hw"
    kind = "nvlink5" if is_nvlink5(x) else "xid"
    if x == 109 and _join_app_fault(book, r, level, action):
        return
    same_gpu = _on_gpu(r)
    if group == "hw" and info.xid_class == "memory":
        # 48 -> 63/64, 94 -> 63: one memory incident on the GPU
        tgt = book.near(r, lambda i: same_gpu(i) and bool(i.facts.get("memory")))
    else:
        tgt = book.near(r, lambda i: same_gpu(i) and i.group == group and i.kind == kind)
    if tgt is None:
        tgt = book.open(Incident(kind, r, ("gpu", gpu), level, action, "", group))
        tgt.gpu = gpu
    else:
        tgt.add(r, level, action)
    _record(tgt, r, x, info.xid_class == "memory")
    if r["pid"] is not None and x not in (119, 120):  # a 119/120 pid is the caller that timed out, not a culprit
        tgt.ranks_pid.add(r["pid"])


def _on_gpu(r: Event) -> Callable[[Incident], bool]:
    """Accepts the incidents of the event's GPU on its host."""
    track, host = ("gpu", r["pci_bus_id"]), r["host"]
    return lambda i: i.track == track and i.host == host


def _join_root(book: Book, r: Event, x: int, level: str, action: str) -> bool:
    """A sympathetic Xid (3, 43, 45) or Xid 154 joins the incident it follows; True when it did. An Xid 45
    that names its root ("caused by previous Xid N") whose root line is not in the log opens the root's
    incident: the driver wrote what caused it."""
    f, same_gpu = r["f"], _on_gpu(r)
    prev = f.get("caused_by_xid")
    tgt = _named_root(book, r, int(prev)) if prev is not None else None
    if tgt is None:
        tgt = book.near(r, lambda i: same_gpu(i) and (i.group == "hw" or x != 3), book.cfg.sympathetic_window_s)
    fresh = tgt is None and prev is not None
    if fresh:
        tgt = _open_unseen_root(book, r, int(prev))  # opened on this event
    if tgt is None:
        return False
    if not fresh:
        tgt.add(r, level if x == 154 else None, action if x == 154 else None)
    if x == 154:
        tgt.facts["recovery_action"] = f.get("recovery_action")
        if level in ("CRITICAL", "HIGH"):
            tgt.actions = [a for a in tgt.actions if a != "RESTART_APP"]
    if prev is not None:
        _chain(tgt, r, int(prev))
    if r["pid"] is not None:
        tgt.ranks_pid.add(r["pid"])
    return True


def _named_root(book: Book, r: Event, prev: int) -> Incident | None:
    """The incident of the Xid the driver names: on this GPU first; an NVLink5 root may be another GPU's
    (a link fault tears down the channels of every GPU mapped through it)."""
    same_gpu, host = _on_gpu(r), r["host"]
    tgt = book.near(r, lambda i: same_gpu(i) and prev in i.facts.get("xids", set()))
    if tgt is None and is_nvlink5(prev):
        tgt = (book.near(r, lambda i: same_gpu(i) and i.kind == "nvlink5")
               or book.near(r, lambda i: i.kind == "nvlink5" and i.host == host and prev in i.facts.get("xids", set()))
               or book.near(r, lambda i: i.kind == "nvlink5" and i.host == host))
    return tgt


def _open_unseen_root(book: Book, r: Event, prev: int) -> Incident:
    """An incident for a root Xid the log does not hold (rotated out, or filtered), graded by its catalog entry."""
    info = lookup(prev, book.cfg.policy)
    group = "app" if info.xid_class in ("app", "sympathetic") else "hw"
    kind = "nvlink5" if is_nvlink5(prev) else "xid"
    inc = book.open(Incident(kind, r, ("gpu", r["pci_bus_id"]), info.severity, info.action, "", group))
    inc.gpu = r["pci_bus_id"]
    inc.facts.setdefault("xids", set()).add(prev)
    inc.facts["unseen_root"] = prev
    return inc


def _chain(tgt: Incident, r: Event, prev: int) -> None:
    """Record "caused by previous Xid N" on the root incident: the named root, the GPUs whose channels it
    tore down, and the consequence: processes on a GPU lost to a hardware fault died of it (HIGH at least)."""
    tgt.facts["caused_by_xid"] = prev
    tgt.facts.setdefault("chain_roots", set()).add(prev)
    gpu = r["pci_bus_id"]
    if gpu and tgt.gpu and gpu != tgt.gpu:
        tgt.facts.setdefault("gpus", {tgt.gpu}).add(gpu)
        tgt.facts["node_level"] = tgt.kind == "nvlink5" or bool(tgt.facts.get("node_level"))
    if int(r["xid"]) == 45 and tgt.group == "hw":
        tgt.add_level("HIGH", "RESET_GPU")


def _join_app_fault(book: Book, r: Event, level: str, action: str) -> bool:
    """Xid 109 is often sympathetic to an application fault just before it; True when it joined one."""
    same_gpu = _on_gpu(r)
    tgt = book.near(r, lambda i: same_gpu(i) and i.group == "app", book.cfg.sympathetic_window_s)
    if tgt is None:
        return False
    tgt.add(r, level, action)
    tgt.facts.setdefault("xids", set()).add(109)
    if r["pid"] is not None:
        tgt.ranks_pid.add(r["pid"])
    return True


def _record(tgt: Incident, r: Event, x: int, memory: bool) -> None:
    """The Xid's facts on its incident: the Xid, memory class, NVLink links and units."""
    f = r["f"]
    tgt.facts.setdefault("xids", set()).add(x)
    if memory:
        tgt.facts["memory"] = True
    if is_nvlink5(x):
        tgt.facts.setdefault("links", set()).add(f.get("link"))
        tgt.facts.setdefault("units", set()).add(f"{f.get('nvlink_unit')} {'Fatal' if f.get('fatal') else 'Nonfatal'}")
    if x == 74 and f.get("link") is not None:
        tgt.facts.setdefault("links", set()).add(f["link"])
