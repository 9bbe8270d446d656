"""Xid payloads: the fields each Xid's text carries (NVLink, NVLink5, contained/uncontained ECC, recovery action,
DBE, row remap, GSP timeout, SM/channel/MMU location)."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

# Xid detail decoders (applied to the Xid's text).
_X74 = re.compile(r"NVLink: fatal error detected on link (?P<link>\d+)\((?P<regs>0x[0-9a-fA-F]+(?:,\s*0x[0-9a-fA-F]+){6})\)")
# NVLink5 payload (Xid 144-150): "<UNIT> <Fatal|Nonfatal> XC<n> i<n> Link <n> (<intrinfo> <error status> ...)".
# Newer drivers pad the columns ("NETIR_LINK_EVT  Fatal   XC0"), pre-R575 ones print "XC 1 i 2" and
# "[0x...]"; the words after the link may be one, two, six, elided "(...)" or absent.
_NVL5 = re.compile(
    r"(?P<unit>[A-Z][A-Z0-9_]+)\s+(?P<fatality>Nonfatal|Fatal)\s+XC\s*(?P<xc>\d+)\s+i\s*(?P<inst>\d+)\s+"
    r"Link\s+(?P<link>-?\d+)"
    r"(?:\s*[(\[](?P<intrinfo>0x[0-9a-fA-F]+)(?:\s+(?P<errstatus>0x[0-9a-fA-F]+))?(?P<rest>[^)\]]*)[)\]])?"
)
_X9495 = re.compile(
    r"(?P<containment>Contained|Uncontained): (?P<unit>[A-Za-z0-9 ]+?)(?: \((?P<loc>0x[0-9a-f]+(?:, ?0x[0-9a-f]+)?)\))?\."
    r"(?: physAddr: (?P<phys>0x[0-9a-f]+))? RST: (?P<rst>Yes|No), D-RST: (?P<drst>Yes|No)"
)
_X154 = re.compile(
    r"GPU recovery action changed from (?P<from_code>0x[0-9a-f]+) \((?P<from_name>[^)]*)\) to "
    r"(?P<to_code>0x[0-9a-f]+) \((?P<to_name>[^)]*)\)"
)
_X48 = re.compile(r"double bit error \(DBE\) has been detected on GPU(?: in the framebuffer at physAddr (?P<phys>0x[0-9a-f]+))?")
_XREMAP = re.compile(
    r"Row Remapper(?: Error)?: (?:New row(?: \((?P<row>0x[0-9a-f]+)\))? marked for remapping|\((?P<row2>0x[0-9a-f]+)\) - (?P<why>[^.]+))"
)
_XGSP = re.compile(
    r"Timeout (?:after (?P<secs>\d+)s of waiting for RPC response from GPU(?P<gpuidx>\d+) GSP|waiting for RPC from GSP)! "
    r"Expected function (?P<fn>\d+) \((?P<fn_name>\w+)\)"
)
_XSM = re.compile(r"\(GPC (?P<gpc>\d+), TPC (?P<tpc>\d+), SM (?P<sm>\d+)\)")
_XCH = re.compile(r"\b(?:Ch|channel) (?:0x)?(?P<ch>[0-9a-f]{8})\b")
_XMMU = re.compile(r"MMU Fault: ENGINE (?P<engine>.+?) faulted @ (?P<addr>\S+)\. Fault is of type (?P<ftype>\S+)")


def xid_fields(m: re.Match[str]) -> dict[str, Any]:
    f: dict[str, Any] = {"xid": int(m.group("xid"))}
    if m.group("bdf"):
        f["bdf"] = m.group("bdf")
    for key in ("gi", "ci"):
        if m.group(key):
            f[f"gpu_{key}"] = int(m.group(key))
    pid = m.group("pid")
    if pid is not None:
        f["pid"] = int(pid) if pid.isdigit() else None
    if m.group("pname") is not None:
        name = m.group("pname").strip()
        f["process"] = None if name in ("<unknown>", "'<unknown>'") else name
    text = (m.group("msg") or "").strip()
    f["text"] = text
    if m.group("prev_xid"):
        f["caused_by_xid"] = int(m.group("prev_xid"))
    xid = f["xid"]
    decoder = _XID_DECODERS.get(xid)
    if decoder is not None:
        f.update(decoder(text))
    f.update(_xid_location(xid, text))
    return f


def _xid_location(xid: int, text: str) -> dict[str, Any]:
    """Where on the GPU: SM coordinates (Xid 13), the MMU fault (Xid 31), the channel (any Xid)."""
    f: dict[str, Any] = {}
    if xid == 13 and (d := _XSM.search(text)):
        f.update(gpc=int(d.group("gpc")), tpc=int(d.group("tpc")), sm=int(d.group("sm")))
    if xid == 31 and (d := _XMMU.search(text)):
        f.update(mmu_engine=d.group("engine"), fault_addr=d.group("addr"), fault_type=d.group("ftype"))
    if d := _XCH.search(text):
        f["channel"] = d.group("ch")
    return f


# Per-Xid message decoders: the fields one Xid's free text carries (empty when the text does not match).
def _x74(text: str) -> dict[str, Any]:
    d = _X74.search(text)
    return {"link": int(d.group("link")), "nvlink_regs": [r.strip() for r in d.group("regs").split(",")]} if d else {}


def _x_nvl5(text: str) -> dict[str, Any]:
    d = _NVL5.search(text)
    if not d:
        return {}
    f: dict[str, Any] = dict(nvlink_unit=d.group("unit"), fatal=d.group("fatality") == "Fatal", link=int(d.group("link")),
                             xc=f"XC{int(d.group('xc'))}", instance=f"i{int(d.group('inst'))}")
    if d.group("intrinfo"):
        intr = int(d.group("intrinfo"), 16)
        f.update(intrinfo=d.group("intrinfo"), subcode=(intr >> 20) & 0x3F)
        if d.group("errstatus"):
            f["error_status"] = d.group("errstatus")
    return f


def _x9495(text: str) -> dict[str, Any]:
    d = _X9495.search(text)
    if not d:
        return {}
    f: dict[str, Any] = dict(containment=d.group("containment"), unit=d.group("unit"), rst=d.group("rst") == "Yes",
                             deferred_rst=d.group("drst") == "Yes")
    if d.group("phys"):
        f["phys_addr"] = d.group("phys")
    return f


def _x154(text: str) -> dict[str, Any]:
    d = _X154.search(text)
    return {"recovery_from": d.group("from_name"), "recovery_action": d.group("to_name")} if d else {}


def _x48(text: str) -> dict[str, Any]:
    d = _X48.search(text)
    return {"phys_addr": d.group("phys")} if d and d.group("phys") else {}


def _x_remap(text: str) -> dict[str, Any]:
    d = _XREMAP.search(text)
    if not d:
        return {}
    f: dict[str, Any] = {"row": d.group("row") or d.group("row2")}
    if d.group("why"):
        f["remap_error"] = d.group("why").strip()
    return f


def _x_gsp(text: str) -> dict[str, Any]:
    d = _XGSP.search(text)
    if not d:
        return {}
    f: dict[str, Any] = dict(rpc_function=int(d.group("fn")), rpc_function_name=d.group("fn_name"))
    if d.group("gpuidx"):
        f["gpu_instance"] = int(d.group("gpuidx"))
    if d.group("secs"):
        f["timeout_s"] = int(d.group("secs"))
    return f


_XID_DECODERS: dict[int, Callable[[str], dict[str, Any]]] = {
    74: _x74, **{x: _x_nvl5 for x in range(144, 151)}, 94: _x9495, 95: _x9495, 154: _x154, 48: _x48,
    63: _x_remap, 64: _x_remap, 119: _x_gsp, 120: _x_gsp,
}
