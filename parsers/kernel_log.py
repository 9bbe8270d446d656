"""Kernel logs (dmesg, journalctl -k, syslog, /dev/kmsg, fabric-manager log) -> ``kernel_events``.

Every timestamp style of docs/gpu_health.md is recognised: monotonic ``[  123.456]`` (with an optional
``[T123]`` caller), ``dmesg -T`` ctime (any locale: whatever ends in ``HH:MM:SS YYYY``), ``dmesg -H``
absolute + ``[+delta]`` lines, ``--time-format iso``, syslog without a year, journalctl short /
short-iso / short-full / short-monotonic, raw ``/dev/kmsg``, talosctl, fabric-manager
``[Mon DD YYYY HH:MM:SS]``. Wrapper prefixes (grep file name, ``host:`` from pdsh/clush/srun -l, AWS
alert text, syslogd wall broadcasts, ``==> file <==`` headers) are peeled off repeatedly, so several
nodes concatenated in one file keep their hosts. A line that starts with 2+ spaces and carries no
stamp continues the previous record.

Times: ``mono_ns`` is what the line says; ``wall_ns`` only when the log lets us place the record on
the wall clock (an absolute stamp, or a monotonic stamp whose boot time is derived from lines that
carry both a wall and a monotonic stamp on the same host and boot). Nothing is guessed beyond the
year of year-less syslog stamps (taken from the file's own absolute stamps, else its mtime).
"""

from __future__ import annotations

import datetime as dt
import functools
import re
import zlib
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import polars as pl
from forensics.parsers.common import LongLines, ParseContext, ParseResult, open_bounded, read_capped
from forensics.parsers.timestamps import DOW, MON, MONTHS, ctime_ns, epoch_ns, iso_ns

from forensics.base import frames as fr
from forensics.base.bus_ids import normalize_bus_id

HEX = r"[0-9a-fA-F]"
BDF3 = rf"{HEX}{{4}}:{HEX}{{2}}:{HEX}{{2}}"
BDF4 = rf"{HEX}{{4,8}}:{HEX}{{2}}:{HEX}{{2}}\.[0-7]"

# ---------------------------------------------------------------------------------------------
# Prefixes, peeled repeatedly in this order.
# ---------------------------------------------------------------------------------------------
_FILE_HEADER = re.compile(r"^==> (?P<file>.+) <==\s*$")
_WALL_HEADER = re.compile(
    rf"^Message from syslogd@(?P<host>\S+) at (?:{DOW} )?(?P<mon>{MON}) +(?P<day>\d{{1,2}}) "
    r"(?P<hms>\d{2}:\d{2}:\d{2})(?: (?P<year>\d{4}))? \.\.\.\s*$"
)
_P_GREP = re.compile(rf"^(?P<srcfile>/[\w./-]+):(?={MON} |\d{{4}}-\d{{2}}-\d{{2}}T|\[|<\d)")
_P_ALERT = re.compile(r"^Xid errors on instance: (?P<host>[^,]+), Error: ")
_P_TALOS = re.compile(
    r"^(?P<host>[\w.:-]+?): (?P<facility>kern|user|daemon): +(?P<level>\w+): \[(?P<iso>[^\]]+)\]: "
)
_P_PDSH = re.compile(
    rf"^(?!kernel: |NVRM: |mce: |Message )(?P<host>[A-Za-z0-9][\w.-]*): "
    rf"(?=\[|{MON} |\d{{4}}-\d{{2}}-\d{{2}}T|kernel:|NVRM:|<\d>|\d+,\d+,\d+,)"
)
_P_KMSG = re.compile(r"^(?P<prio>\d+),(?P<seq>\d+),(?P<usec>\d+),(?P<flags>[^;]*);")
_P_PRIO = re.compile(r"^<(?P<prio>\d{1,3})>")
_P_DECODE = re.compile(
    r"^(?P<facility>kern|user|mail|daemon|auth|syslog|lpr|news)\s*:"
    r"(?P<level>emerg|alert|crit|err|warn|notice|info|debug)\s*: "
)
_P_ISO = re.compile(
    r"^(?P<iso>\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:[.,]\d{1,9})?(?:Z|[+-]\d{2}:?\d{2})?) "
    r"(?:(?P<host>[^\s:\[]+) (?=kernel:|[\w.@/-]+\[\d+\]:))?(?:(?P<ident>kernel|[\w.@/-]+\[\d+\]): )?"
)
_P_SHORT_FULL = re.compile(
    rf"^{DOW} (?P<date>\d{{4}}-\d{{2}}-\d{{2}}) (?P<hms>\d{{2}}:\d{{2}}:\d{{2}}(?:\.\d+)?) "
    r"(?P<tz>[A-Z]{2,5}|[+-]\d{2}:?\d{2}) (?:(?P<host>[^\s:]+) )?(?P<ident>kernel|[\w.@/-]+\[\d+\]): "
)
_P_SYSLOG = re.compile(
    rf"^(?P<mon>{MON}) +(?P<day>\d{{1,2}}) (?P<hms>\d{{2}}:\d{{2}}:\d{{2}})(?P<frac>\.\d+)? "
    r"(?:(?P<host>[^\s:]+) )?(?P<ident>kernel|[\w.@/-]+\[\d+\]|[\w.@/-]+):\s?"
)
_P_WALL_KERNEL = re.compile(r"^\s*kernel:\s*(?=\[)")
_P_BARE_KERNEL = re.compile(r"^kernel: ")
_P_FM = re.compile(
    rf"^\[(?P<fmts>{MON} \d{{2}} \d{{4}} \d{{2}}:\d{{2}}:\d{{2}})\] \[(?P<level>[A-Z]+)\] \[tid (?P<tid>\d+)\] "
)
_P_CTIME = re.compile(r"^\[(?P<ctime>[^\]\d+][^\]]*?\d{1,2}:\d{2}:\d{2} \d{4})\] ?")
_P_HUMAN_ABS = re.compile(rf"^\[(?P<mon>{MON}) ?(?P<day>\d{{1,2}}) (?P<hm>\d{{2}}:\d{{2}})(?::(?P<s>\d{{2}}))?\] ?")
_P_HUMAN_REL = re.compile(r"^\[\s*\+\s*(?P<delta>\d+\.\d+)\] ?")
_P_MONO = re.compile(r"^\[\s*(?P<mono>\d+\.\d+)\](?:\[\s*(?P<caller>[TC]\d+)\])? ?")
_P_AFTER_MONO_HOST = re.compile(r"^(?P<host>[A-Za-z0-9][\w.-]*) (?P<ident>kernel|[\w.@/-]+\[\d+\]): ")
_CONTINUATION = re.compile(r"^(?:\s{2,}|\t)(?=\S)")
_KMSG_DICT = re.compile(r"^ [A-Z_]+=")
_STAMP_START = re.compile(r"^\s*(?:\[\s*[\d+]|\d{4}-\d{2}-\d{2}T|" + MON + r" )")

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
    ("driver_load", "driver_load", re.compile(r"NVRM: loading NVIDIA .*?Kernel Module(?: for \w+)?\s+(?P<version>[\d.]+)")),
    ("gsp", "rate_limit", re.compile(rf"NVRM: Rate limiting GSP RPC error prints for GPU at PCI:(?P<bdf>{BDF3})")),
    ("gsp", "heartbeat", re.compile(r"NVRM: GPU(?P<gpuidx>\d+) _kgspIsHeartbeatTimedOut: Heartbeat timed out")),
    ("gsp", "timeout_banner", re.compile(r"NVRM: GPU(?P<gpuidx>\d+) _kgspLogRpcTimeout: \*+ GSP Timeout")),
    ("gsp", "pmu_halt", re.compile(r"NVRM: GPU(?P<gpuidx>\d+) _kgspRpcGspEventPmuHalted: ")),
    ("gsp", "memsys_error", re.compile(
        r"NVRM: GPU(?P<gpuidx>\d+) (?:kgmmuCheckMemSubsysError_IMPL: Memory Subsystem Error|_kgspCheckIfMemsysError:)")),
    ("gsp", "thread_timeout", re.compile(r"NVRM: GPU(?P<gpuidx>\d+) _threadNodeCheckTimeout: ")),
    ("gsp", "sysmembar_timeout", re.compile(r"NVRM: GPU(?P<gpuidx>\d+) kbusSendSysmembar\w*: - timeout")),
    ("gsp", "gsp_exception", re.compile(r"GSP kernel exception: (?P<what2>[^@]+?) \(cause:(?P<cause>0x[0-9a-f]+)\)")),
    ("nvlink", "postrx_failed", re.compile(
        r"NVRM: knvlink\w+: (?:Getting peer(?P<peer>\d+)'s postRxDetLinkMask failed!|Failed to update Rx Detect Link mask!)")),
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
    ("aer", "bit", re.compile(rf"(?P<bdf>{BDF4}): (?:AER: )?\s*\[\s*(?P<bit>\d+)\] (?P<name>.+?)\s*(?P<first>\(First\))?\s*$")),
    ("aer", "recovery", re.compile(
        rf"(?P<drv>[\w-]+) (?P<bdf>{BDF4}): (?P<what2>AER: can't recover \(no error_detected callback\)|"
        r"device has no AER-aware driver|AER: device recovery failed|AER: Root Port link has been reset|"
        r"AER: device recovery successful|broadcast error_detected message)")),
    ("aer", "other", re.compile(rf"(?P<drv>[\w-]+) (?P<bdf>{BDF4}): AER: ")),
    ("pcie_link", "limited", re.compile(
        rf"(?P<drv>[\w-]+) (?P<bdf>{BDF4}): (?P<gbps>[\d.]+) Gb/s available PCIe bandwidth, limited by "
        rf"(?P<speed>[\d.]+ GT/s(?: PCIe)?) x(?P<width>\d+) link at (?P<at>{BDF4})")),
    ("pcie_link", "link_down", re.compile(rf"(?P<drv>[\w-]+) (?P<bdf>{BDF4}): (?:pciehp: )?(?:Slot\(\S+\): )?Link Down")),
    ("ghes", "ghes", re.compile(r"\{(?P<rec>\d+)\}\[Hardware Error\]: (?P<msg>.*)")),
    # --- Mellanox / InfiniBand / links ---
    ("ib_port", "port_state", re.compile(
        rf"mlx5_core (?P<bdf>{BDF4}) (?P<ibdev>mlx5_\w+): Port: (?P<port>\d+) Link (?P<state>DOWN|INIT|ARMED|ACTIVE_DEFER|ACTIVE)")),
    ("ib_port", "port_event", re.compile(
        r"(?:mlx5_ib|ib_core|infiniband) .*?(?P<ibdev>mlx5_\w+).*?port (?P<port>\d+).*?(?P<state>ERR|DOWN|ACTIVE)\b", re.I)),
    ("mlx5", "link", re.compile(rf"mlx5_core (?P<bdf>{BDF4}) (?P<netdev>\S+): Link (?P<state>up|down)\b")),
    ("mlx5", "module", re.compile(
        rf"(?:mlx5_core (?P<bdf>{BDF4}): )?(?:mlx5_port_module_event:\d+:\(pid \d+\): )?Port module "
        r"event(?:\[(?P<lvl>error|warning)\])?: module (?P<module>\d+), (?P<status>[^,]+)(?:, (?P<err>.+))?")),
    ("mlx5", "pcie_power", re.compile(
        rf"mlx5_core (?P<bdf>{BDF4}): mlx5_pcie_event:\d+:\(pid \d+\): (?P<msg>Detected insufficient power|PCIe slot advertised sufficient power)")),
    ("mlx5", "temperature", re.compile(r"High temperature on sensors with bit set")),
    ("mlx5", "health", re.compile(rf"mlx5_core (?P<bdf>{BDF4}): .*(?:health compromised|fatal error|syndrome|firmware (?:fatal|error))", re.I)),
    ("netdev_carrier", "carrier", re.compile(r"(?P<netdev>\S+): (?P<state>(?i:lost|gained) carrier)")),
    # --- thermal / power ---
    ("cpu_thermal", "throttle", re.compile(
        r"CPU(?P<cpu>\d+): (?P<scope>Core|Package) temperature (?:is )?above threshold, cpu clock (?:is )?"
        r"throttled \(total events = (?P<n>\d+)\)")),
    ("cpu_thermal", "normal", re.compile(r"CPU(?P<cpu>\d+): (?P<scope>Core|Package) temperature/speed normal")),
    ("cpu_thermal", "power_limit", re.compile(r"CPU(?P<cpu>\d+): (?P<scope>Core|Package) power limit notification \(total events = (?P<n>\d+)\)")),
    # --- host memory ---
    ("edac", "error", re.compile(
        r"EDAC (?:\w+ )?MC(?P<mc>\d+): (?P<count>\d+) (?P<ekind>CE|UE) (?P<what2>.*?)on (?P<dimm>\S+) \((?P<detail>.*)\)")),
    ("edac", "mce_handling", re.compile(r"EDAC (?:\w+ )?MC(?P<mc>\d+): HANDLING MCE MEMORY ERROR")),
    ("mce", "logged", re.compile(r"mce: \[Hardware Error\]: Machine check events logged")),
    ("mce", "hardware_error", re.compile(r"mce: \[Hardware Error\]: (?P<msg>.*)")),
    # --- OOM ---
    ("oom", "invoked", re.compile(r"(?P<comm>\S+) invoked oom-killer: gfp_mask=(?P<gfp>0x[0-9a-f]+)")),
    ("oom", "killed", re.compile(
        r"(?:Memory cgroup )?[Oo]ut of memory(?: \([^)]*\))?: Kill(?:ed)? process (?P<pid>\d+) \((?P<comm>[^)]+)\)"
        r"(?:.*?anon-rss:(?P<anon_rss_kb>\d+)kB)?")),
    ("oom", "context", re.compile(r"oom-kill:constraint=(?P<constraint>\w+),.*?task=(?P<comm>[^,]+),pid=(?P<pid>\d+),uid=(?P<uid>\d+)")),
    ("oom", "reaped", re.compile(r"oom_reaper: reaped process (?P<pid>\d+) \((?P<comm>[^)]+)\)")),
    # --- hangs ---
    ("hung_task", "hung_task", re.compile(r"INFO: task (?P<comm>.+?):(?P<pid>\d+) blocked for more than (?P<secs>\d+) seconds\.")),
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
    ("context", "rpc_history", re.compile(r"NVRM: (?:GPU\d+ (?:RPC (?:event )?history|GSP RPC buffer)|\s+(?:entry|-?\d+)\s+\d*)")),
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
    ("fs_error", "fs_error", re.compile(r"(?P<fs>EXT4-fs|EXT3-fs) \((?P<dev>[^)]+)\): (?P<what2>.*I/O error.*)"), "I/O error"),
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
    ("rcu_stall", "rcu_stall", re.compile(r"rcu: INFO: (?P<flavor>\w+) (?:self-)?detected stalls? on CPUs?"), "rcu: INFO"),
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


class _Rec:
    """The record being assembled; flushed into column lists."""

    __slots__ = ("line", "host", "time_text", "time_format", "mono_ns", "wall_ns", "wall_source",
                 "facility", "level", "message", "year_less", "delta_ns")

    def __init__(self) -> None:
        self.line = 0
        self.host: str | None = None
        self.time_text: str | None = None
        self.time_format = "none"
        self.mono_ns: int | None = None
        self.wall_ns: int | None = None
        self.wall_source: str | None = None
        self.facility: str | None = None
        self.level: str | None = None
        self.message = ""
        # (month, day, hms, frac) of a year-less stamp, resolved once the year is known
        self.year_less: tuple[int, int, str, str | None] | None = None
        self.delta_ns = 0  # dmesg -H: cumulative delta since the last absolute line


_LEVELS = ["emerg", "alert", "crit", "err", "warn", "notice", "info", "debug"]
_FACILITIES = ["kern", "user", "mail", "daemon", "auth", "syslog", "lpr", "news"]


# Each peeler matches one wrapper or timestamp prefix at the start of the text, fills the record and returns
# how many characters it consumed (None: not this prefix). Order matters: _peel tries them in this order.
_Peeler = Callable[[str, "_Rec", dict[str, Any]], "int | None"]


def _peel_grep(rest: str, rec: _Rec, state: dict[str, Any]) -> int | None:
    m = _P_GREP.match(rest)
    return m.end() if m else None


def _peel_alert(rest: str, rec: _Rec, state: dict[str, Any]) -> int | None:
    m = _P_ALERT.match(rest)
    if not m:
        return None
    rec.host = m.group("host").strip()
    return m.end()


def _peel_talos(rest: str, rec: _Rec, state: dict[str, Any]) -> int | None:
    m = _P_TALOS.match(rest)
    if not m:
        return None
    rec.host = m.group("host")
    rec.facility = "kernel" if m.group("facility") == "kern" else m.group("facility")
    rec.level = m.group("level")
    rec.time_text, rec.time_format = m.group("iso"), "talos"
    rec.wall_ns, rec.wall_source = iso_ns(m.group("iso")), "stamp"
    return m.end()


def _peel_pdsh(rest: str, rec: _Rec, state: dict[str, Any]) -> int | None:
    m = _P_PDSH.match(rest)
    if not m:
        return None
    rec.host = m.group("host")
    return m.end()


def _peel_kmsg(rest: str, rec: _Rec, state: dict[str, Any]) -> int | None:
    m = _P_KMSG.match(rest)
    if not m:
        return None
    prio = int(m.group("prio"))
    rec.level = _LEVELS[prio & 7]
    fac = prio >> 3
    rec.facility = "kernel" if fac == 0 else (_FACILITIES[fac] if fac < len(_FACILITIES) else str(fac))
    rec.time_text, rec.time_format = m.group("usec"), "kmsg"
    rec.mono_ns = int(m.group("usec")) * 1000
    return m.end()


def _peel_prio(rest: str, rec: _Rec, state: dict[str, Any]) -> int | None:
    m = _P_PRIO.match(rest)
    if not m:
        return None
    rec.level = _LEVELS[int(m.group("prio")) & 7]
    return m.end()


def _peel_decode(rest: str, rec: _Rec, state: dict[str, Any]) -> int | None:
    m = _P_DECODE.match(rest)
    if not m:
        return None
    rec.facility = "kernel" if m.group("facility") == "kern" else m.group("facility")
    rec.level = m.group("level")
    return m.end()


def _peel_iso(rest: str, rec: _Rec, state: dict[str, Any]) -> int | None:
    m = _P_ISO.match(rest)
    if not m:
        return None
    rec.time_text, rec.time_format = m.group("iso"), "iso"
    rec.wall_ns, rec.wall_source = iso_ns(m.group("iso")), "stamp"
    if m.group("host"):
        rec.host = m.group("host")
    if m.group("ident"):
        rec.facility = m.group("ident")
    return m.end()


def _peel_short_full(rest: str, rec: _Rec, state: dict[str, Any]) -> int | None:
    m = _P_SHORT_FULL.match(rest)
    if not m:
        return None
    rec.time_text, rec.time_format = " ".join(m.group(0).split()[:4]), "syslog"
    off = 0
    tz = m.group("tz")
    if tz[0] in "+-":
        z = tz.replace(":", "")
        off = (1 if z[0] == "+" else -1) * (int(z[1:3]) * 3600 + int(z[3:5]) * 60)
    y, mo, d = (int(x) for x in m.group("date").split("-"))
    hms, _, frac = m.group("hms").partition(".")
    rec.wall_ns, rec.wall_source = epoch_ns(y, mo, d, hms, frac or None, off), "stamp"
    if m.group("host"):
        rec.host = m.group("host")
    rec.facility = m.group("ident")
    return m.end()


def _peel_syslog(rest: str, rec: _Rec, state: dict[str, Any]) -> int | None:
    m = _P_SYSLOG.match(rest)
    if not m:
        return None
    rec.time_text = f"{m.group('mon')} {m.group('day')} {m.group('hms')}{m.group('frac') or ''}"
    rec.time_format = "syslog"
    rec.year_less = (MONTHS[m.group("mon")], int(m.group("day")), m.group("hms"), m.group("frac"))
    if m.group("host"):
        rec.host = m.group("host")
    rec.facility = m.group("ident")
    return m.end()


def _peel_wall_kernel(rest: str, rec: _Rec, state: dict[str, Any]) -> int | None:
    """`kernel:` after a `wall` header line: the header gave host and time."""
    m = _P_WALL_KERNEL.match(rest)
    if not (m and state.get("wall_header")):
        return None
    host, stamp = state.pop("wall_header")
    rec.host = host
    rec.time_text, rec.time_format, rec.year_less = stamp[0], "syslog", stamp[1]
    rec.facility = "kernel"
    return m.end()


def _peel_bare_kernel(rest: str, rec: _Rec, state: dict[str, Any]) -> int | None:
    m = _P_BARE_KERNEL.match(rest) or _P_WALL_KERNEL.match(rest)
    if not m:
        return None
    rec.facility = "kernel"
    return m.end()


def _peel_fm(rest: str, rec: _Rec, state: dict[str, Any]) -> int | None:
    m = _P_FM.match(rest)
    if not m:
        return None
    rec.time_text, rec.time_format = m.group("fmts"), "fabricmanager"
    mon, day, year, hms = m.group("fmts").split()
    rec.wall_ns, rec.wall_source = epoch_ns(int(year), MONTHS[mon], int(day), hms), "stamp"
    rec.facility, rec.level = "fabricmanager", m.group("level").lower()
    return m.end()


def _peel_ctime(rest: str, rec: _Rec, state: dict[str, Any]) -> int | None:
    m = _P_CTIME.match(rest)
    if not m or (ns := ctime_ns(m.group("ctime"))) is None:
        return None
    rec.time_text, rec.time_format = m.group("ctime"), "ctime"
    rec.wall_ns, rec.wall_source = ns, "stamp"
    return m.end()


def _peel_human_abs(rest: str, rec: _Rec, state: dict[str, Any]) -> int | None:
    m = _P_HUMAN_ABS.match(rest)
    if not m:
        return None
    rec.time_text, rec.time_format = m.group(0).strip(" []"), "human"
    hms = m.group("hm") + ":" + (m.group("s") or "00")
    rec.year_less = (MONTHS[m.group("mon")], int(m.group("day")), hms, None)
    state["human_base"] = rec.year_less
    state["human_delta_ns"] = 0
    return m.end()


def _peel_human_rel(rest: str, rec: _Rec, state: dict[str, Any]) -> int | None:
    """`dmesg -H` relative lines: a delta from the last absolute line."""
    m = _P_HUMAN_REL.match(rest)
    if not (m and state.get("human_base")):
        return None
    delta = int(round(float(m.group("delta")) * 1e9))
    state["human_delta_ns"] += delta
    rec.time_text, rec.time_format = "+" + m.group("delta"), "human"
    rec.year_less = state["human_base"]
    rec.delta_ns = state["human_delta_ns"]
    return m.end()


def _peel_mono(rest: str, rec: _Rec, state: dict[str, Any]) -> int | None:
    m = _P_MONO.match(rest)
    if not m:
        return None
    if rec.time_format in ("none", "syslog"):
        if rec.time_format == "none":
            rec.time_text, rec.time_format = m.group("mono"), "monotonic"
        else:
            rec.time_text = f"{rec.time_text} [{m.group('mono')}]"
    rec.mono_ns = int(round(float(m.group("mono")) * 1e9))
    end = m.end()
    if rec.host is None or rec.facility is None:
        m2 = _P_AFTER_MONO_HOST.match(rest[end:])  # the pattern is anchored with ^: slice, not pos
        if m2:
            rec.host = rec.host or m2.group("host")
            rec.facility = m2.group("ident")
            end += m2.end()
    return end


# Every prefix peeler, in the order they are tried, with the characters its pattern can start with (none
# matches an empty text): a line is offered only to the peelers its first character allows, in this order.
# Most lines start with `[` or a letter, so 1-5 peelers are tried instead of 17 (the calls, not the regexes,
# were the cost).
_PEELER_STARTS: tuple[tuple[_Peeler, str], ...] = (
    (_peel_grep, "/"), (_peel_alert, "X"), (_peel_talos, r"[\w.:-]"), (_peel_pdsh, "[A-Za-z0-9]"),
    (_peel_kmsg, r"\d"), (_peel_prio, "<"), (_peel_decode, "[kumdasln]"), (_peel_iso, r"\d"),
    (_peel_short_full, "[MTWFS]"), (_peel_syslog, "[JFMASOND]"), (_peel_wall_kernel, r"[\sk]"),
    (_peel_bare_kernel, r"[\sk]"), (_peel_fm, r"\["), (_peel_ctime, r"\["), (_peel_human_abs, r"\["),
    (_peel_human_rel, r"\["), (_peel_mono, r"\["),
)
_PEELERS: tuple[_Peeler, ...] = tuple(p for p, _ in _PEELER_STARTS)


@functools.cache
def _peelers_for(c: str) -> tuple[_Peeler, ...]:
    """The peelers a text starting with the character ``c`` can match, in order (one tuple per character)."""
    return tuple(p for p, first in _PEELER_STARTS if re.match(first, c))


def _peel(line: str, rec: _Rec, state: dict[str, Any]) -> str:
    """Strip every wrapper and timestamp prefix, filling ``rec``; returns the message text."""
    rest = line
    for _ in range(8):
        if not rest:
            break
        for peeler in _peelers_for(rest[0]):
            end = peeler(rest, rec, state)
            if end is not None:
                rest = rest[end:]
                break
        else:
            break
    return rest


_INT_KEYS = frozenset({"cpu", "n", "count", "mc", "pid", "secs", "port", "rec", "bit", "module", "gpuidx", "uid",
                       "anon_rss_kb", "peer", "width", "phys", "fid", "tid", "sw", "device_minor"})


def _classify(msg: str) -> tuple[str, dict[str, Any]]:
    """(kind, fields) for one message."""
    m = _XID.search(msg)
    if m:
        return "xid", _xid_fields(m)
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


def _xid_fields(m: re.Match[str]) -> dict[str, Any]:
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


def _column_values(kind: str, f: dict[str, Any]) -> tuple[str | None, int | None, int | None, str | None]:
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


class KernelLogBatch:
    """Several kernel logs parsed as one: each file's lines are collected on their own (``add``), one
    frame is built for all of them, boots and bus ids worked out per file (``finish``), so many
    small logs (one a node) pay Polars' fixed costs once."""

    def __init__(self) -> None:
        self.files: list[_File] = []

    def add(self, path: Path, ctx: ParseContext) -> ParseResult | None:
        """Read one log: a failed result when it cannot be read, else None (its result comes from ``finish``)."""
        long = LongLines()
        try:
            with open_bounded(path, ctx.max_decompressed_bytes) as fh:
                raw = read_capped(fh, long)
        except (OSError, EOFError, zlib.error) as exc:
            return ParseResult.failed(f"{ctx.rel_path}: unreadable: {exc}")
        except Exception as exc:  # DecompressionLimitExceeded and friends
            return ParseResult.failed(f"{ctx.rel_path}: {exc}")
        text = raw.decode("utf-8", errors="replace")
        bad_bytes = text.count("\ufffd")
        try:
            mtime_ns: int | None = path.stat().st_mtime_ns
        except OSError:
            mtime_ns = None
        self.add_text(text, ctx.rel_path, mtime_ns, bad_bytes, long.note(ctx.rel_path))
        return None

    def add_text(self, text: str, source: str, mtime_ns: int | None = None, bad_bytes: int = 0,
                 long_note: str | None = None) -> None:
        """One log's text (see ``parse_text``); ``long_note`` says which over-long lines were skipped."""
        c = _Collector()
        for lineno, line in enumerate(text.splitlines(), start=1):
            c.feed(lineno, line)
        c.flush()
        c.resolve_year_less(mtime_ns)
        self.files.append(_File(source, c.cols, bad_bytes, long_note))

    def __len__(self) -> int:
        return len(self.files)

    def finish(self) -> tuple[list[ParseResult], dict[str, pl.DataFrame]]:
        """The result of every file ``add`` took (in order) and the frame of them all."""
        return [_file_result(f) for f in self.files], {"kernel_events": _frame(self.files)}


def parse(path: Path, ctx: ParseContext) -> ParseResult:
    """One kernel log (a batch of one)."""
    batch = KernelLogBatch()
    early = batch.add(path, ctx)
    return early if early is not None else _only(batch)


def parse_text(text: str, source: str, mtime_ns: int | None = None, bad_bytes: int = 0) -> ParseResult:
    """Parse kernel-log text; ``mtime_ns`` (the file's mtime) supplies the year of year-less stamps
    when the text has no absolute stamp of its own."""
    batch = KernelLogBatch()
    batch.add_text(text, source, mtime_ns, bad_bytes)
    return _only(batch)


def _only(batch: KernelLogBatch) -> ParseResult:
    results, frames = batch.finish()
    results[0].frames = frames
    return results[0]


@dataclass
class _File:
    """One log's collected records, column by column."""

    source: str
    cols: dict[str, list[Any]]
    bad_bytes: int
    long_note: str | None  # over-long lines skipped (LongLines.note)


_COLUMNS = ("host", "line", "time_text", "time_format", "mono_ns", "wall_ns", "wall_source", "facility",
            "level", "kind", "pci_bus_id", "xid", "pid", "process", "message", "fields", "segment")


class _Collector:
    """The records of one kernel-log text, column by column, built line by line."""

    def __init__(self) -> None:
        self.cols: dict[str, list[Any]] = {k: [] for k in _COLUMNS}
        self.year_less: list[tuple[int, tuple[int, int, str, str | None], int]] = []  # (row, stamp, extra delta ns)
        self.state: dict[str, Any] = {}
        self.cur: _Rec | None = None
        self.file_host: str | None = None
        self.segment = 0  # `==> file <==` headers (tail/head over several files) start a new segment
        self.years: list[int] = []

    def flush(self) -> None:
        cur = self.cur
        if cur is None:
            return
        kind, f = _classify(cur.message)
        if kind == "unknown" and cur.facility == "fabricmanager" and cur.level in ("error", "warning", "fatal"):
            kind, f = "fabric_manager", {"what": "error"}
        if kind == "unknown" and cur.facility and cur.facility != "kernel" and cur.facility != "fabricmanager":
            kind, f = "benign", {"what": "not_kernel"}  # systemd[1] & co. interleaved in a journal
        bdf, xid, pid, proc = _column_values(kind, f)
        cols = self.cols
        if cur.year_less is not None:
            self.year_less.append((len(cols["line"]), cur.year_less, cur.delta_ns))
        if cur.wall_ns is not None and cur.wall_source == "stamp":
            self.years.append(dt.datetime.fromtimestamp(cur.wall_ns / 1e9, dt.timezone.utc).year)
        for k, v in (("host", cur.host or self.file_host), ("line", cur.line), ("time_text", cur.time_text),
                     ("time_format", cur.time_format), ("mono_ns", cur.mono_ns), ("wall_ns", cur.wall_ns),
                     ("wall_source", cur.wall_source), ("facility", cur.facility), ("level", cur.level),
                     ("kind", kind), ("pci_bus_id", bdf), ("xid", xid), ("pid", pid), ("process", proc),
                     ("message", cur.message), ("fields", orjson.dumps(f).decode() if f else "{}"),
                     ("segment", self.segment)):
            cols[k].append(v)
        self.cur = None

    def feed(self, lineno: int, line: str) -> None:
        cur = self.cur
        if not line.strip():
            return
        if cur is not None and (_KMSG_DICT.match(line) and cur.time_format == "kmsg"):
            return  # /dev/kmsg dictionary (" SUBSYSTEM=pci") belongs to the record; not message text
        if cur is not None and _CONTINUATION.match(line) and not _STAMP_START.match(line):
            piece = line.strip()
            piece = piece[6:] if piece.startswith("NVRM: ") and cur.message.lstrip().startswith("NVRM:") else piece
            cur.message = f"{cur.message.rstrip()} {piece}"
            return
        if _FILE_HEADER.match(line):
            self.flush()
            self.segment += 1
            self.file_host = None
            self.state.clear()
            return
        m = _WALL_HEADER.match(line)
        if m:
            self.flush()
            ts = f"{m.group('mon')} {m.group('day')} {m.group('hms')}"
            self.state["wall_header"] = (m.group("host"),
                                         (ts, (MONTHS[m.group("mon")], int(m.group("day")), m.group("hms"), None)))
            return
        self.flush()
        cur = self.cur = _Rec()
        cur.line = lineno
        cur.message = _peel(line, cur, self.state)
        if cur.facility is None and cur.time_format in ("monotonic", "ctime", "human", "kmsg", "iso", "none"):
            cur.facility = "kernel" if cur.time_format != "none" or cur.message.startswith("NVRM") else None

    def resolve_year_less(self, mtime_ns: int | None) -> None:
        """Year-less stamps: the year of the file's own absolute stamps, else the file's mtime year;
        a date after the reference moment (Dec -> Jan rollover) belongs to the previous year."""
        years = self.years
        mtime_year = dt.datetime.fromtimestamp(mtime_ns / 1e9, dt.timezone.utc).year if mtime_ns else None
        ref_year = max(years) if years else mtime_year
        if ref_year is None:
            return
        for row, (mo, d, hms, frac), delta in self.year_less:
            ns = epoch_ns(ref_year, mo, d, hms, frac)
            # a log is written before its file's mtime: a later date means last year (Dec -> Jan)
            if ns is not None and not years and mtime_ns is not None and ns > mtime_ns + 86_400 * 10**9:
                ns = epoch_ns(ref_year - 1, mo, d, hms, frac)
            if ns is not None and self.cols["wall_ns"][row] is None:
                self.cols["wall_ns"][row] = ns + delta
                self.cols["wall_source"][row] = "stamp_year_from_file"


def _frame(files: list[_File]) -> pl.DataFrame:
    """The kernel_events rows of every file, in file then line order; ``_f`` (the file's index) keys
    every window, so each file is worked out as if parsed alone."""
    cols: dict[str, list[Any]] = {k: [] for k in (*_COLUMNS, "_f", "source")}
    for i, f in enumerate(files):
        n = len(f.cols["line"])
        for k in _COLUMNS:
            cols[k].extend(f.cols[k])
        cols["_f"].extend([i] * n)
        cols["source"].extend([f.source] * n)
    if not cols["line"]:
        return fr.empty("kernel_events")
    df = pl.DataFrame(cols, schema_overrides={
        "mono_ns": pl.Int64, "wall_ns": pl.Int64, "xid": pl.Int32, "pid": pl.Int64, "line": pl.Int64, "_f": pl.Int64,
    }, strict=False)
    df = _assign_boots_and_place(_carry_gpu_bus_ids(df)).drop("segment", "_f")
    return fr.conform("kernel_events", df)


def _file_result(f: _File) -> ParseResult:
    """Status, message and host of one file (counted from its collected columns: no queries); ties
    by name, so the message is the same bytes on every run."""
    cols, n = f.cols, len(f.cols["line"])
    if n == 0:
        result = ParseResult(status="ok", message="no kernel-log records")
    else:
        counts = Counter(cols["kind"])
        summary = ", ".join(f"{k}={v}" for k, v in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))
        hosts = list({h for h in cols["host"] if h is not None})
        msg = f"{n} records ({summary}); {counts['unknown']} unknown"
        status = "ok"
        if f.bad_bytes:
            status = "partial"
            msg += f"; {f.bad_bytes} undecodable byte(s) replaced"
        result = ParseResult(status=status, message=msg, host=hosts[0] if len(hosts) == 1 else None)
    if f.long_note:
        result.status = "partial"
        result.message = f"{result.message}; {f.long_note}"
    return result


def _carry_gpu_bus_ids(df: pl.DataFrame) -> pl.DataFrame:
    """A driver message printed as several stamped records ("The NVIDIA GPU <bdf>", "(PCI ID: ...) installed
    in this system has", "fallen off the bus ...") names its GPU only in the first: a fallen-off-the-bus or
    init-failure record without a bus id takes the one named at most 3 lines before it (same host, file)."""
    if df.height == 0:
        return df
    key = [pl.col("_f"), pl.col("host").fill_null(""), pl.col("segment")]
    named = (pl.col("kind") == "nvrm_other") & pl.col("pci_bus_id").is_not_null()
    bus = pl.when(named).then(pl.col("pci_bus_id")).forward_fill().over(*key, order_by="line")
    at = pl.when(named).then(pl.col("line")).forward_fill().over(*key, order_by="line")
    fill = (pl.col("kind").is_in(["fallen_off_bus", "gpu_init_failed"]) & pl.col("pci_bus_id").is_null()
            & ((pl.col("line") - at) <= 3)).fill_null(False)
    return df.with_columns(pl.when(fill).then(bus).otherwise(pl.col("pci_bus_id")).alias("pci_bus_id"))


def _assign_boots_and_place(df: pl.DataFrame) -> pl.DataFrame:
    """Number boots per host and derive wall time for monotonic-only records where a boot time is known."""
    if df.height == 0:
        return df.with_columns(pl.lit(None, pl.Int32).alias("boot"))
    hkey = [pl.col("_f"), pl.col("host").fill_null(""), pl.col("segment")]
    mono = pl.col("mono_ns")
    prev = mono.forward_fill().shift(1).over(*hkey, order_by="line")
    new_boot = (
        (pl.col("kind") == "boot")
        | (mono.is_not_null() & prev.is_not_null() & ((prev - mono) > 10_000_000_000))
    ).fill_null(False)
    df = df.with_columns(new_boot.cast(pl.Int32).cum_sum().over(*hkey, order_by="line").alias("boot"))
    # boot time = wall - mono on lines carrying both (syslog with an embedded dmesg stamp, dmesg -T
    # is itself boot+mono). Median per (file, host, boot); only whole-second precision is claimed.
    both = (pl.col("wall_ns") - mono)
    boot_ns = both.median().over(*hkey, "boot")
    return df.with_columns(
        pl.when(pl.col("wall_ns").is_null() & mono.is_not_null() & boot_ns.is_not_null())
        .then(boot_ns.cast(pl.Int64) + mono)
        .otherwise(pl.col("wall_ns")).alias("wall_ns"),
        pl.when(pl.col("wall_ns").is_null() & mono.is_not_null() & boot_ns.is_not_null())
        .then(pl.lit("boot_time")).otherwise(pl.col("wall_source")).alias("wall_source"),
    )
