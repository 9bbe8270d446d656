"""Kernel-log message classes: (kind, tag, pattern) tables, first match wins, and the kernel_events columns each
class fills."""

from __future__ import annotations

import re
from typing import Any

from forensics.parsers.kernel_log.xid import xid_fields

from forensics.base.bus_ids import normalize_bus_id

HEX = r"[0-9a-fA-F]"
BDF3 = rf"{HEX}{{4}}:{HEX}{{2}}:{HEX}{{2}}"
BDF4 = rf"{HEX}{{4,8}}:{HEX}{{2}}:{HEX}{{2}}\.[0-7]"

# ---------------------------------------------------------------------------------------------
# Messages: (kind, tag, regex). The first match wins; ``tag`` goes into fields["what"].
# ---------------------------------------------------------------------------------------------
_XID = re.compile(
    rf"NVRM: Xid \((?:PCI:)?(?P<bdf>{BDF3}(?:\.[0-7])?|{HEX}{{2}}:{HEX}{{2}}(?:\.[0-7])?|\.\.\.)"
    r"(?: GPU-I:(?P<gi>\d+))?(?: GPU-CI:(?P<ci>\d+))?\): (?P<xid>\d+)"
    r"(?:, pid=(?P<pid>'<unknown>'|<unknown>|[^,\s]+))?(?:, name=(?P<pname>[^,]*))?"
    r"(?:, (?P<msg>.*?))?(?: caused by previous Xid (?P<prev_xid>\d+))?\s*$"
)
_SXID = re.compile(
    rf"nvidia-nvswitch(?P<sw>\d+): SXid \(PCI:(?P<bdf>{BDF4})\): (?P<sxid>\d+), "
    r"(?:(?P<fatality>Non-fatal|Fatal), )?(?P<msg>.*)"
)
_FM_NVSWITCH = re.compile(
    rf"detected NVSwitch (?P<fatality>fatal|non-fatal) error (?P<sxid>\d+) on fid (?P<fid>\d+) on NVSwitch "
    rf"pci bus id (?P<bdf>{BDF4}) physical id (?P<phys>\d+) port (?P<port>\d+)"
)

# RmInitAdapter: "NVRM: GPU <bdf>: RmInitAdapter failed! (0x<init>:0x<rm>:<line>)", then
# "NVRM: GPU <bdf>: rm_init_adapter failed, device minor number <n>" (osinit.c); old drivers print no bus id.
_RM_INIT = re.compile(
    rf"NVRM: (?:GPU (?P<bdf>{BDF4}): )?(?:RmInitAdapter failed! \((?P<init_status>[^)]*)\)|"
    r"rm_init_adapter failed(?:, device minor number| for device bearing minor number) (?P<device_minor>\d+))"
)

_M: list[tuple[str, str, re.Pattern[str]]] = [
    ("gpu_identity", "uuid", re.compile(rf"NVRM: GPU at PCI:(?P<bdf>{BDF3}): (?P<uuid>GPU-[0-9a-fA-F-]{{36}})")),
    ("gpu_identity", "serial", re.compile(r"NVRM: GPU Board Serial Number: ?(?P<serial>\S*)")),
    ("fallen_off_bus", "fallen_off_bus", re.compile(
        rf"NVRM: GPU (?:at (?:PCI:)?)?(?P<bdf>{BDF3}(?:\.[0-7])?)(?::| has) (?:GPU has )?fallen off the bus")),
    ("fallen_off_bus", "probe", re.compile(
        rf"NVRM: The NVIDIA GPU (?P<bdf>{BDF4})\b.*fallen off the bus")),
    ("driver_load", "driver_load",
     re.compile(r"NVRM: loading NVIDIA .*?Kernel Module(?: for \w+)?\s+(?P<version>[\d.]+)")),
    ("gsp", "rate_limit", re.compile(rf"NVRM: Rate limiting GSP RPC error prints for GPU at PCI:(?P<bdf>{BDF3})")),
    ("gsp", "heartbeat", re.compile(r"NVRM: GPU(?P<gpuidx>\d+) _kgspIsHeartbeatTimedOut: Heartbeat timed out")),
    ("gsp", "timeout_banner", re.compile(r"NVRM: GPU(?P<gpuidx>\d+) _kgspLogRpcTimeout: \*+ GSP Timeout")),
    ("gsp", "pmu_halt", re.compile(r"NVRM: GPU(?P<gpuidx>\d+) _kgspRpcGspEventPmuHalted: ")),
    ("gsp", "memsys_error", re.compile(
        r"NVRM: GPU(?P<gpuidx>\d+) (?:kgmmuCheckMemSubsysError_IMPL: Memory Subsystem "
        r"Error|_kgspCheckIfMemsysError:)")),
    ("gsp", "thread_timeout", re.compile(r"NVRM: GPU(?P<gpuidx>\d+) _threadNodeCheckTimeout: ")),
    ("gsp", "sysmembar_timeout", re.compile(r"NVRM: GPU(?P<gpuidx>\d+) kbusSendSysmembar\w*: - timeout")),
    ("gsp", "gsp_exception", re.compile(r"GSP kernel exception: (?P<what2>[^@]+?) \(cause:(?P<cause>0x[0-9a-f]+)\)")),
    ("nvlink", "postrx_failed", re.compile(
        r"NVRM: knvlink\w+: (?:Getting peer(?P<peer>\d+)'s postRxDetLinkMask failed!|Failed to update Rx Detect Link "
        r"mask!)")),
    ("nvlink", "nvlink", re.compile(r"NVRM: (?:GPU\d+ )?\w*[Nn][Vv][Ll]ink\w*: .*(?:fail|error|timeout|down)", re.I)),
    ("ecc", "sbe_interrupts_disabled", re.compile(r"Disabling ECC single-bit error interrupts")),
    ("ecc", "uncorrectable", re.compile(r"An uncorrectable ECC error detected")),
    ("ecc", "row_remap", re.compile(r"Row Remapper(?: Error)?: ")),
    ("ecc", "page_retirement", re.compile(r"Dynamic Page Retirement: ")),
    ("nvrm_other", "crash_dump", re.compile(r"NVRM: A GPU crash dump has been created")),
    ("gpu_init_failed", "rm_init_failed", _RM_INIT),
    ("fallen_off_bus", "probe_tail", re.compile(r"NVRM: fallen off the bus and is not responding")),
    ("nvrm_other", "gpu_named", re.compile(rf"NVRM: The NVIDIA GPU (?P<bdf>{BDF4})\s*$")),
    ("benign", "peermem", re.compile(r"nvidia-peermem \S+ ERROR detected invalid context")),
    # --- PCIe AER / GHES ---
    ("aer", "received", re.compile(
        rf"(?P<drv>[\w-]+) (?P<bdf>{BDF4}): AER: (?P<multi>Multiple )?(?P<sev>Corrected|Correctable|"
        rf"Uncorrected \((?:Non-)?Fatal\)|Uncorrectable \((?:Non-)?Fatal\)) error (?:message )?received:? "
        rf"(?:from )?(?:id=(?P<id>{HEX}+)|(?P<src>{BDF4}))?")),
    ("aer", "bus_error", re.compile(
        rf"(?P<drv>[\w-]+) (?P<bdf>{BDF4}): (?:AER: )?(?:PCIe|CXL) Bus Error: severity=(?P<sev>[^,]+), "
        rf"type=(?P<type>[^,]+), (?:id=(?P<id>{HEX}+))?\((?P<agent>[^)]+)\)")),
    ("aer", "status", re.compile(
        rf"(?P<bdf>{BDF4}): (?:AER: )?\s*device \[(?P<vid>{HEX}{{4}}):(?P<did>{HEX}{{4}})\] "
        rf"error status/mask=(?P<status>{HEX}{{8}})/(?P<mask>{HEX}{{8}})")),
    ("aer", "bit",
     re.compile(rf"(?P<bdf>{BDF4}): (?:AER: )?\s*\[\s*(?P<bit>\d+)\] (?P<name>.+?)\s*(?P<first>\(First\))?\s*$")),
    ("aer", "recovery", re.compile(
        rf"(?P<drv>[\w-]+) (?P<bdf>{BDF4}): (?P<what2>AER: can't recover \(no error_detected callback\)|"
        r"device has no AER-aware driver|AER: device recovery failed|AER: Root Port link has been reset|"
        r"AER: device recovery successful|broadcast error_detected message)")),
    ("aer", "other", re.compile(rf"(?P<drv>[\w-]+) (?P<bdf>{BDF4}): AER: ")),
    ("pcie_link", "limited", re.compile(
        rf"(?P<drv>[\w-]+) (?P<bdf>{BDF4}): (?P<gbps>[\d.]+) Gb/s available PCIe bandwidth, limited by "
        rf"(?P<speed>[\d.]+ GT/s(?: PCIe)?) x(?P<width>\d+) link at (?P<at>{BDF4})")),
    ("pcie_link", "link_down",
     re.compile(rf"(?P<drv>[\w-]+) (?P<bdf>{BDF4}): (?:pciehp: )?(?:Slot\(\S+\): )?Link Down")),
    ("ghes", "ghes", re.compile(r"\{(?P<rec>\d+)\}\[Hardware Error\]: (?P<msg>.*)")),
    # --- Mellanox / InfiniBand / links ---
    ("ib_port", "port_state", re.compile(
        rf"mlx5_core (?P<bdf>{BDF4}) (?P<ibdev>mlx5_\w+): Port: (?P<port>\d+) Link "
        rf"(?P<state>DOWN|INIT|ARMED|ACTIVE_DEFER|ACTIVE)")),
    ("ib_port", "port_event", re.compile(
        r"(?:mlx5_ib|ib_core|infiniband) .*?(?P<ibdev>mlx5_\w+).*?port (?P<port>\d+).*?(?P<state>ERR|DOWN|ACTIVE)\b",
        re.I)),
    ("mlx5", "link", re.compile(rf"mlx5_core (?P<bdf>{BDF4}) (?P<netdev>\S+): Link (?P<state>up|down)\b")),
    ("mlx5", "module", re.compile(
        rf"(?:mlx5_core (?P<bdf>{BDF4}): )?(?:mlx5_port_module_event:\d+:\(pid \d+\): )?Port module "
        r"event(?:\[(?P<lvl>error|warning)\])?: module (?P<module>\d+), (?P<status>[^,]+)(?:, (?P<err>.+))?")),
    ("mlx5", "pcie_power", re.compile(
        rf"mlx5_core (?P<bdf>{BDF4}): mlx5_pcie_event:\d+:\(pid \d+\): (?P<msg>Detected insufficient power|PCIe slot "
        rf"advertised sufficient power)")),
    ("mlx5", "temperature", re.compile(r"High temperature on sensors with bit set")),
    ("mlx5", "health",
     re.compile(rf"mlx5_core (?P<bdf>{BDF4}): .*(?:health compromised|fatal error|syndrome|firmware (?:fatal|error))",
                re.I)),
    ("netdev_carrier", "carrier", re.compile(r"(?P<netdev>\S+): (?P<state>(?i:lost|gained) carrier)")),
    # --- thermal / power ---
    ("cpu_thermal", "throttle", re.compile(
        r"CPU(?P<cpu>\d+): (?P<scope>Core|Package) temperature (?:is )?above threshold, cpu clock (?:is )?"
        r"throttled \(total events = (?P<n>\d+)\)")),
    ("cpu_thermal", "normal", re.compile(r"CPU(?P<cpu>\d+): (?P<scope>Core|Package) temperature/speed normal")),
    ("cpu_thermal", "power_limit",
     re.compile(r"CPU(?P<cpu>\d+): (?P<scope>Core|Package) power limit notification \(total events = (?P<n>\d+)\)")),
    # --- host memory ---
    ("edac", "error", re.compile(
        r"EDAC (?:\w+ )?MC(?P<mc>\d+): (?P<count>\d+) (?P<ekind>CE|UE) (?P<what2>.*?)on (?P<dimm>\S+) "
        r"\((?P<detail>.*)\)")),
    ("edac", "mce_handling", re.compile(r"EDAC (?:\w+ )?MC(?P<mc>\d+): HANDLING MCE MEMORY ERROR")),
    ("mce", "logged", re.compile(r"mce: \[Hardware Error\]: Machine check events logged")),
    ("mce", "hardware_error", re.compile(r"mce: \[Hardware Error\]: (?P<msg>.*)")),
    # --- OOM ---
    ("oom", "invoked", re.compile(r"(?P<comm>\S+) invoked oom-killer: gfp_mask=(?P<gfp>0x[0-9a-f]+)")),
    ("oom", "killed", re.compile(
        r"(?:Memory cgroup )?[Oo]ut of memory(?: \([^)]*\))?: Kill(?:ed)? process (?P<pid>\d+) \((?P<comm>[^)]+)\)"
        r"(?:.*?anon-rss:(?P<anon_rss_kb>\d+)kB)?")),
    ("oom", "context",
     re.compile(r"oom-kill:constraint=(?P<constraint>\w+),.*?task=(?P<comm>[^,]+),pid=(?P<pid>\d+),uid=(?P<uid>\d+)")),
    ("oom", "reaped", re.compile(r"oom_reaper: reaped process (?P<pid>\d+) \((?P<comm>[^)]+)\)")),
    # --- hangs ---
    ("hung_task", "hung_task",
     re.compile(r"INFO: task (?P<comm>.+?):(?P<pid>\d+) blocked for more than (?P<secs>\d+) seconds\.")),
    ("soft_lockup", "soft_lockup", re.compile(
        r"BUG: soft lockup - CPU#(?P<cpu>\d+) stuck for (?P<secs>\d+)s! \[(?P<comm>.+?):(?P<pid>\d+)\]")),
    ("hard_lockup", "hard_lockup", re.compile(r"Watchdog detected hard LOCKUP on cpu (?P<cpu>\d+)")),
    ("segfault", "segfault", re.compile(
        r"(?P<comm>\S+)\[(?P<pid>\d+)\]: segfault at (?P<addr>[0-9a-f]+) ip (?P<ip>[0-9a-f]+) sp (?P<sp>[0-9a-f]+) "
        r"error (?P<err>[0-9a-f]+)(?: in (?P<obj>[^\[]+)\[(?P<base>[0-9a-f]+)\+(?P<size>[0-9a-f]+)\])?")),
    ("boot", "linux_version", re.compile(r"^Linux version (?P<version>\S+)")),
    # --- context: stack traces, register dumps, tables ---
    ("context", "stack", re.compile(
        r"^\s*(?:Call Trace:|<TASK>|</TASK>|<IRQ>|</IRQ>|\? )|^\s*\??\s*[\w.]+\+0x[0-9a-f]+/0x[0-9a-f]+|"
        r"^(?:CPU: \d+ PID: \d+|Hardware name: |RIP: |RSP: |RAX: |RDX: |RBP: |R\d+: |FS: |CS: |CR2: |Code: |"
        r"WARNING: kernel stack|unwind stack|Modules linked in:|Tainted: )")),
    ("context", "oom_table", re.compile(r"^\[\s*(?:pid|\d+)\s*\]\s+")),
    ("context", "rpc_history",
     re.compile(r"NVRM: (?:GPU\d+ (?:RPC (?:event )?history|GSP RPC buffer)|\s+(?:entry|-?\d+)\s+\d*)")),
    # --- known noise ---
    ("benign", "noise", re.compile(
        r"workqueue: .* hogged CPU|clocksource: |EXT4-fs |sched: RT throttling activated|"
        r"nvidia-nvswitch\d+: open \(major=|audit: |IPv6: ADDRCONF|systemd-journald")),
]
# Host-side events that no GPU pattern above knows (node_health reads them): filesystem and block-device
# errors, network-storage clients losing their server, NIC link changes of any driver, RCU stalls.
# Tried before the patterns above (they overlap none of them, and must win over the `EXT4-fs ` noise).
# (kind, tag, regex, needle)
_HOST_M4: list[tuple[str, str, re.Pattern[str], str | None]] = [
    ("fs_error", "readonly", re.compile(
        r"(?P<fs>EXT4-fs|EXT3-fs)(?: \w+)? \((?:device )?(?P<dev>[^)]+)\): (?P<what2>Remounting filesystem read-only"
        r"|.*[Dd]etected aborted journal.*)"), "-fs"),
    ("fs_error", "readonly", re.compile(
        r"(?P<fs>BTRFS|XFS)(?: \w+)? \((?:device )?(?P<dev>[^)]+)\): (?P<what2>[Ff]ilesystem has been shut down.*"
        r"|.*forc(?:ing|ed) read-?only.*|.*[Ff]orce[_ ][Ss]hutdown.*|Corruption of in-memory data.*)"), "FS"),
    ("fs_error", "fs_error", re.compile(
        r"(?P<fs>EXT4-fs|EXT3-fs|BTRFS) (?:error|critical) \(device (?P<dev>[^)]+)\): (?P<what2>.*?)"
        r"(?:comm (?P<comm>[^:]+):.*)?$"), "(device "),
    ("fs_error", "fs_error", re.compile(
        r"(?P<fs>XFS) \((?P<dev>[^)]+)\): (?P<what2>.*(?:[Cc]orruption|I/O [Ee]rror|log error).*)"), "XFS ("),
    ("fs_error", "fs_error", re.compile(r"(?P<fs>EXT4-fs|EXT3-fs) \((?P<dev>[^)]+)\): (?P<what2>.*I/O error.*)"),
     "I/O error"),
    ("fs_error", "io_error", re.compile(
        r"(?:blk_update_request|print_req_error)?:? ?(?P<what2>I/O error|critical medium error|critical target error), "
        r"dev (?P<dev>[\w-]+), sector (?P<sector>\d+)"), " error, dev "),
    ("fs_error", "io_error", re.compile(r"(?P<what2>Buffer I/O error) on dev(?:ice)? (?P<dev>[\w-]+),"), "Buffer I/O"),
    ("fs_error", "io_timeout", re.compile(r"nvme (?P<dev>nvme\d+): (?P<what2>I/O \d+ QID \d+ timeout.*)"), "timeout"),
    ("storage_client", "nfs_down", re.compile(r"nfs: server (?P<server>\S+) not responding"), "not responding"),
    ("storage_client", "nfs_ok", re.compile(r"nfs: server (?P<server>\S+) OK"), "nfs: server"),
    ("storage_client", "lustre_lost", re.compile(
        r"Lustre: .*?Connection to (?P<server>\S+) \(at (?P<nid>[^)]+)\) was lost"), "was lost"),
    ("storage_client", "lustre_ok", re.compile(
        r"Lustre: .*?Connection restored to (?P<server>\S+)"), "Connection restored"),
    ("storage_client", "lustre_error", re.compile(r"LustreError: (?P<what2>.*)"), "LustreError"),
    ("netdev_link", "link", re.compile(
        r"(?:(?P<drv>[\w-]+) (?P<bdf>[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]) )?(?P<netdev>[\w.@-]+):? "
        r"(?:NIC )?Link is (?P<state>[Uu]p|[Dd]own)\b"), "Link is "),
    ("rcu_stall", "rcu_stall", re.compile(r"rcu: INFO: (?P<flavor>\w+) (?:self-)?detected stalls? on CPUs?"),
     "rcu: INFO"),
    # the node going down: the kernel's last words (kernel/reboot.c `reboot: ` prefix, panic.c), systemd's final
    # stage (systemd-shutdown runs as PID 1) and logind's announcement
    ("shutdown", "panic", re.compile(r"Kernel panic - not syncing: ?(?P<what2>.*)"), "Kernel panic"),
    ("shutdown", "kernel", re.compile(r"reboot: (?P<what2>Power down|Restarting system|System halted)"), "reboot: "),
    ("shutdown", "systemd", re.compile(
        r"(?:systemd-shutdown\[1\]: )?(?P<what2>Syncing filesystems and block devices\.|Sending SIGTERM to remaining "
        r"processes\.\.\.|Sending SIGKILL to remaining processes\.\.\.)"), "remaining processes"),
    ("shutdown", "systemd", re.compile(r"(?P<what2>Syncing filesystems and block devices\.)"), "Syncing filesystems"),
    ("shutdown", "logind", re.compile(r"(?P<what2>System is (?:powering down|rebooting|halting))\."), "System is "),
]

# A literal every match of the pattern contains: `in` is far cheaper than a regex search, and most
# lines of a real log match nothing. None = always try.
_NEEDLE: dict[tuple[str, str], str | None] = {
    ("gpu_identity", "uuid"): "NVRM: GPU at", ("gpu_identity", "serial"): "Serial Number",
    ("fallen_off_bus", "fallen_off_bus"): "fallen off", ("fallen_off_bus", "probe"): "fallen off",
    ("driver_load", "driver_load"): "NVRM: loading", ("gsp", "rate_limit"): "Rate limiting GSP",
    ("gsp", "heartbeat"): "Heartbeat", ("gsp", "timeout_banner"): "GSP Timeout", ("gsp", "pmu_halt"): "PmuHalted",
    ("gsp", "memsys_error"): "NVRM: GPU", ("gsp", "thread_timeout"): "_threadNodeCheckTimeout",
    ("gsp", "sysmembar_timeout"): "kbusSendSysmembar", ("gsp", "gsp_exception"): "GSP kernel exception",
    ("nvlink", "postrx_failed"): "knvlink", ("nvlink", "nvlink"): "NVRM: ",
    ("ecc", "sbe_interrupts_disabled"): "Disabling ECC", ("ecc", "uncorrectable"): "uncorrectable ECC",
    ("ecc", "row_remap"): "Row Remapper", ("ecc", "page_retirement"): "Page Retirement",
    ("nvrm_other", "crash_dump"): "crash dump", ("gpu_init_failed", "rm_init_failed"): "dapter failed",
    ("fallen_off_bus", "probe_tail"): "fallen off", ("nvrm_other", "gpu_named"): "The NVIDIA GPU",
    ("benign", "peermem"): "nvidia-peermem",
    ("aer", "received"): "AER", ("aer", "bus_error"): "Bus Error", ("aer", "status"): "error status",
    ("aer", "bit"): "] ", ("aer", "recovery"): ": ", ("aer", "other"): "AER",
    ("pcie_link", "limited"): "limited by", ("pcie_link", "link_down"): "Link Down",
    ("ghes", "ghes"): "[Hardware Error]", ("ib_port", "port_state"): "Port:", ("ib_port", "port_event"): "mlx5_",
    ("mlx5", "link"): "mlx5_core", ("mlx5", "module"): "module event", ("mlx5", "pcie_power"): "mlx5_pcie_event",
    ("mlx5", "temperature"): "High temperature", ("mlx5", "health"): "mlx5_core",
    ("netdev_carrier", "carrier"): "arrier", ("cpu_thermal", "throttle"): "above threshold",
    ("cpu_thermal", "normal"): "speed normal", ("cpu_thermal", "power_limit"): "power limit",
    ("edac", "error"): "EDAC", ("edac", "mce_handling"): "EDAC", ("mce", "logged"): "mce:",
    ("mce", "hardware_error"): "mce:", ("oom", "invoked"): "oom-killer", ("oom", "killed"): "ut of memory",
    ("oom", "context"): "oom-kill:", ("oom", "reaped"): "oom_reaper", ("hung_task", "hung_task"): "blocked for more",
    ("soft_lockup", "soft_lockup"): "soft lockup", ("hard_lockup", "hard_lockup"): "hard LOCKUP",
    ("segfault", "segfault"): "segfault", ("boot", "linux_version"): "Linux version",
    ("context", "stack"): None, ("context", "oom_table"): "[", ("context", "rpc_history"): "NVRM:",
    ("benign", "noise"): None,
}
_M4 = _HOST_M4 + [(kind, tag, rx, _NEEDLE[(kind, tag)]) for kind, tag, rx in _M]

# NVRM lines no specific pattern knows, and generic ``driver dddd:bb:dd.f: text`` device lines.
_NVRM_ANY = re.compile(r"NVRM: ")
_DEVICE_ANY = re.compile(rf"^(?P<drv>[\w-]+) (?P<bdf>{BDF4}): ")


_INT_KEYS = frozenset({"cpu", "n", "count", "mc", "pid", "secs", "port", "rec", "bit", "module", "gpuidx", "uid",
                       "anon_rss_kb", "peer", "width", "phys", "fid", "tid", "sw", "device_minor"})


def classify(msg: str) -> tuple[str, dict[str, Any]]:
    """(kind, fields) for one message."""
    m = _XID.search(msg)
    if m:
        return "xid", xid_fields(m)
    m = _SXID.search(msg)
    if m:
        f = {k: v for k, v in m.groupdict().items() if v is not None}
        f["sxid"] = int(f["sxid"])
        return "sxid", f
    m = _FM_NVSWITCH.search(msg)
    if m:
        f = {k: v for k, v in m.groupdict().items() if v is not None}
        f["sxid"] = int(f["sxid"])
        f["what"] = "nvswitch_error"
        return "fabric_manager", f
    for kind, tag, rx, needle in _M4:
        if needle is not None and needle not in msg:
            continue
        m = rx.search(msg)
        if m:
            f = {k: (int(v) if k in _INT_KEYS and v.isdigit() else v)
                 for k, v in m.groupdict().items() if v is not None}
            detail = f.pop("what2", None)
            f["what"] = tag
            if detail:
                f["detail"] = detail.strip()
            return kind, f
    if _NVRM_ANY.search(msg):
        return "nvrm_other", {}
    m = _DEVICE_ANY.match(msg)
    if m:
        return "device_other", {"drv": m.group("drv"), "bdf": m.group("bdf")}
    return "unknown", {}


def column_values(kind: str, f: dict[str, Any]) -> tuple[str | None, int | None, int | None, str | None]:
    bdf = f.get("bdf")
    if kind == "ghes":
        mm = re.search(rf"device_id: ({BDF4})", f.get("msg", ""))
        bdf = mm.group(1) if mm else None
    xid = f.get("xid") if kind == "xid" else f.get("sxid") if kind in ("sxid", "fabric_manager") else None
    pid = f.get("pid")
    try:
        pid = int(pid) if pid is not None else None
    except (TypeError, ValueError):
        pid = None
    proc = f.get("process") if kind == "xid" else f.get("comm")
    return normalize_bus_id(bdf), xid, pid, proc
