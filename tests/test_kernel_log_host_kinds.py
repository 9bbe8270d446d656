"""Host-side kernel-log kinds (node_health's input): filesystem / block-device errors, network-storage
servers, NIC links of any driver, RCU stalls. Each line is one the kernel (or the filesystem client) prints;
the expected fields are read off the line by hand."""

from __future__ import annotations

import orjson
import pytest
from forensics.parsers.kernel_log import parse_text

CASES = [
    ("EXT4-fs error (device sda1): ext4_find_entry:1455: inode #2: comm python3: reading directory lblock 0",
     "fs_error", {"what": "fs_error", "fs": "EXT4-fs", "dev": "sda1", "comm": "python3"}, "python3"),
    ("EXT4-fs (sda1): Remounting filesystem read-only", "fs_error", {"what": "readonly", "dev": "sda1"}, None),
    ('XFS (dm-3): metadata I/O error in "xfs_trans_read_buf_map" at daddr 0x1 len 8 error 5',
     "fs_error", {"what": "fs_error", "fs": "XFS", "dev": "dm-3"}, None),
    ("XFS (sdb): Filesystem has been shut down due to log error (0x2).", "fs_error",
     {"what": "readonly", "fs": "XFS", "dev": "sdb"}, None),
    ("BTRFS error (device sda1): bdev /dev/sda1 errs: wr 1, rd 0, flush 0, corrupt 0, gen 0", "fs_error",
     {"what": "fs_error", "fs": "BTRFS", "dev": "sda1"}, None),
    ("blk_update_request: I/O error, dev sda, sector 12345 op 0x1:(WRITE) flags 0x800 phys_seg 1 prio class 0",
     "fs_error", {"what": "io_error", "dev": "sda", "sector": "12345", "detail": "I/O error"}, None),
    ("I/O error, dev nvme0n1, sector 8 op 0x0:(READ) flags 0x80700 phys_seg 1 prio class 2", "fs_error",
     {"what": "io_error", "dev": "nvme0n1"}, None),
    ("Buffer I/O error on dev sda1, logical block 0, async page read", "fs_error", {"what": "io_error", "dev": "sda1"},
     None),
    ("nvme nvme0: I/O 123 QID 4 timeout, aborting", "fs_error", {"what": "io_timeout", "dev": "nvme0"}, None),
    ("nfs: server fileserver01 not responding, still trying", "storage_client",
     {"what": "nfs_down", "server": "fileserver01"}, None),
    ("nfs: server fileserver01 OK", "storage_client", {"what": "nfs_ok", "server": "fileserver01"}, None),
    ("Lustre: scratch-OST0003-osc-ffff8803b4f6d000: Connection to scratch-OST0003 (at 10.0.0.5@o2ib) was lost; "
     "in progress operations using this service will wait for recovery to complete", "storage_client",
     {"what": "lustre_lost", "server": "scratch-OST0003", "nid": "10.0.0.5@o2ib"}, None),
    ("Lustre: scratch-OST0003-osc-ffff8803b4f6d000: Connection restored to scratch-OST0003 (at 10.0.0.5@o2ib)",
     "storage_client", {"what": "lustre_ok", "server": "scratch-OST0003"}, None),
    ("ixgbe 0000:01:00.0 eth0: NIC Link is Down", "netdev_link",
     {"what": "link", "drv": "ixgbe", "netdev": "eth0", "state": "Down"}, None),
    ("e1000e: eth1 NIC Link is Up 1000 Mbps Full Duplex, Flow Control: None", "netdev_link",
     {"netdev": "eth1", "state": "Up"}, None),
    ("bnxt_en 0000:3b:00.0 ens1f0np0: NIC Link is Up, 100000 Mbps full duplex", "netdev_link",
     {"netdev": "ens1f0np0", "state": "Up", "drv": "bnxt_en"}, None),
    ("rcu: INFO: rcu_sched self-detected stall on CPU", "rcu_stall", {"flavor": "rcu_sched"}, None),
    ("rcu: INFO: rcu_preempt detected stalls on CPUs/tasks:", "rcu_stall", {"flavor": "rcu_preempt"}, None),
]


@pytest.mark.parametrize(("message", "kind", "expected", "process"), CASES, ids=[c[0][:40] for c in CASES])
def test_host_kind_and_fields(message: str, kind: str, expected: dict, process: str | None):
    df = parse_text(f"[  100.000001] {message}\n", "k.log").frames["kernel_events"]
    assert df["kind"].to_list() == [kind]
    fields = orjson.loads(df["fields"][0])
    assert {k: fields.get(k) for k in expected} == expected
    assert df["process"][0] == process


def test_nic_bus_id_is_normalised_and_mount_noise_stays_benign():
    text = ("[ 1.0] ixgbe 0000:01:00.0 eth0: NIC Link is Down\n"
            "[ 2.0] EXT4-fs (nvme0n1p2): mounted filesystem with ordered data mode. Opts: (null)\n")
    df = parse_text(text, "k.log").frames["kernel_events"]
    assert df["kind"].to_list() == ["netdev_link", "benign"] and df["pci_bus_id"].to_list() == ["0000:01:00.0", None]
