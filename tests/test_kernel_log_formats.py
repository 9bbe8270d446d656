"""Timestamp styles, wrapper prefixes, continuations, boots and damaged input (synthetic lines built
from the formats quoted in docs/gpu_health.md)."""

from __future__ import annotations

import calendar
import gzip

import orjson
import polars as pl
from forensics.parsers.kernel_log import parse, parse_text
from forensics.parsers.result import ParseContext

XID = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus."
MTIME_2025 = calendar.timegm((2025, 12, 31, 0, 0, 0, 0, 0, 0)) * 10**9


def _utc(y: int, mo: int, d: int, h: int, mi: int, s: int) -> int:
    return calendar.timegm((y, mo, d, h, mi, s, 0, 0, 0)) * 10**9


def _df(text: str, mtime_ns: int | None = MTIME_2025) -> pl.DataFrame:
    return parse_text(text, "x.log", mtime_ns=mtime_ns).frames["kernel_events"]


def test_monotonic_with_caller_id():
    df = _df("[   36.764462][  T291] " + XID + "\n")
    r = df.row(0, named=True)
    assert (r["time_format"], r["mono_ns"], r["wall_ns"], r["kind"], r["xid"], r["pid"], r["process"]) == (
        "monotonic", 36_764_462_000, None, "xid", 79, 1234, "python")
    assert r["pci_bus_id"] == "0000:3b:00.0"


def test_ctime_and_localised_ctime():
    df = _df("[Sun Feb 23 16:24:18 2025] " + XID + "\n[四 3月 20 21:01:25 2025] " + XID + "\n")
    assert df["time_format"].to_list() == ["ctime", "ctime"]
    assert df["wall_ns"].to_list() == [_utc(2025, 2, 23, 16, 24, 18), _utc(2025, 3, 20, 21, 1, 25)]


def test_dmesg_human_absolute_then_deltas():
    df = _df("[Feb14 05:03] " + XID + "\n[  +0.500000] " + XID + "\n[  +1.250000] " + XID + "\n")
    base = _utc(2025, 2, 14, 5, 3, 0)
    assert df["wall_ns"].to_list() == [base, base + 500_000_000, base + 1_750_000_000]
    assert set(df["time_format"]) == {"human"} and set(df["wall_source"]) == {"stamp_year_from_file"}


def test_iso_journal_short_iso_and_short_full():
    text = (
        "2024-04-29T14:55:41,678628+02:00 " + XID + "\n"
        "2024-01-08T12:34:56+0000 node3 kernel: " + XID + "\n"
        "Mon 2024-01-08 12:34:57 UTC node3 kernel: " + XID + "\n"
    )
    df = _df(text)
    assert df["wall_ns"].to_list() == [
        _utc(2024, 4, 29, 12, 55, 41) + 678_628_000, _utc(2024, 1, 8, 12, 34, 56), _utc(2024, 1, 8, 12, 34, 57)]
    assert df["host"].to_list() == [None, "node3", "node3"]
    assert df["kind"].to_list() == ["xid"] * 3


def test_syslog_year_from_the_files_own_stamps_and_boot_time_derivation():
    # the ISO line fixes the year (2023); the syslog line carries wall + monotonic and so gives the
    # boot time, which then places the monotonic-only line of the same host and boot
    text = (
        "2023-03-01T00:00:00+00:00 other kernel: Linux version 6.1\n"
        "Mar  2 10:00:00 n1 kernel: [  100.000000] " + XID + "\n"
        "n1: [  160.500000] " + XID + "\n"
    )
    df = _df(text, mtime_ns=None)
    assert df["host"].to_list() == ["other", "n1", "n1"]
    assert df["wall_ns"][1] == _utc(2023, 3, 2, 10, 0, 0)
    assert df["wall_ns"][2] == _utc(2023, 3, 2, 10, 1, 0) + 500_000_000
    assert df["wall_source"].to_list() == ["stamp", "stamp_year_from_file", "boot_time"]


def test_monotonic_without_boot_time_is_left_unplaced():
    df = _df("[  100.0] " + XID + "\n[  200.0] " + XID + "\n")
    assert df["wall_ns"].null_count() == 2 and df["wall_source"].null_count() == 2


def test_syslog_rollover_dec_logs_in_a_january_file():
    jan = calendar.timegm((2026, 1, 5, 0, 0, 0, 0, 0, 0)) * 10**9
    df = _df("Dec 30 23:59:59 n1 kernel: " + XID + "\n", mtime_ns=jan)
    assert df["wall_ns"][0] == _utc(2025, 12, 30, 23, 59, 59)


def test_raw_kmsg_with_dictionary_lines():
    text = "3,339,5140900,-;" + XID + "\n SUBSYSTEM=pci\n DEVICE=+pci:0000:3b:00.0\n6,340,5140901,-;NET: Registered\n"
    df = _df(text)
    assert df.height == 2
    r = df.row(0, named=True)
    assert (r["time_format"], r["mono_ns"], r["level"], r["facility"], r["kind"]) == ("kmsg", 5_140_900_000, "err",
                                                                                      "kernel", "xid")


def test_talos_and_pdsh_prefixes_several_nodes_in_one_file():
    text = (
        "10.20.30.29: kern:     err: [2023-04-02T08:26:23.184031611Z]: " + XID + "\n"
        "node01: [  123.456] " + XID + "\n"
        "node02: [  123.456] " + XID.replace("3b:00", "5e:00") + "\n"
    )
    df = _df(text)
    assert df["host"].to_list() == ["10.20.30.29", "node01", "node02"]
    assert df["wall_ns"][0] == _utc(2023, 4, 2, 8, 26, 23) + 184_031_611
    assert df["pci_bus_id"].to_list() == ["0000:3b:00.0", "0000:3b:00.0", "0000:5e:00.0"]


def test_file_headers_from_tail_reset_the_host_and_boot_counts_per_host():
    text = (
        "==> a.log <==\n[ 9000.0] " + XID + "\n[   10.0] kernel: Linux version 6.1\n[   11.0] " + XID + "\n"
        "==> b.log <==\n[ 5000.0] " + XID + "\n"
    )
    df = _df(text)
    assert df["boot"].to_list() == [0, 1, 1, 0]
    assert df["kind"].to_list() == ["xid", "boot", "xid", "xid"]


def test_continuations_fold_and_unknown_lines_are_kept():
    text = (
        "[ 1843.308145] NVRM: The NVIDIA GPU 0000:b3:00.0\n"
        "               NVRM: (PCI ID: 10de:26b5) installed in this system has\n"
        "               NVRM: fallen off the bus and is not responding to commands.\n"
        "[ 1843.5] something nobody knows\n"
    )
    df = _df(text)
    assert df["kind"].to_list() == ["fallen_off_bus", "unknown"]
    assert df["line"].to_list() == [1, 4]
    assert df["message"][1] == "something nobody knows"


def test_dmesg_decode_prefix_and_xid_variants():
    text = (
        "kern  :err   : [  1.0] NVRM: Xid (PCI:0000:3b:00 GPU-I:02 GPU-CI:01): 94, pid='<unknown>', name=<unknown>, "
        "Contained: SM (0x1). RST: No, D-RST: No\n"
        "[  2.0] NVRM: Xid (PCI:0000:3b:00): 45, pid=7, name=python, Ch 00000008 caused by previous Xid 145\n"
        "[  3.0] NVRM: Xid (PCI:0000:3b:00): 74, pid=7, name=python, NVLink: fatal error detected on link 3"
        "(0x0, 0x0, 0x0, 0x10000, 0x0, 0x0, 0x0)\n"
        "[  4.0] NVRM: Xid (PCI:0000:3b:00): 154, GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot "
        "Required)\n"
    )
    df = _df(text)
    f = [orjson.loads(x) for x in df["fields"]]
    assert df["level"][0] == "err"
    assert (f[0]["gpu_gi"], f[0]["gpu_ci"], f[0]["containment"], f[0]["unit"], f[0]["rst"]) == (2, 1, "Contained", "SM",
                                                                                                False)
    assert f[0]["pid"] is None and f[0]["process"] is None
    assert f[1]["caused_by_xid"] == 145 and f[1]["channel"] == "00000008"
    assert f[2]["link"] == 3 and f[2]["nvlink_regs"][3] == "0x10000"
    assert f[3]["recovery_action"] == "Node Reboot Required"


def test_gzip_input_and_undecodable_bytes(tmp_path):
    p = tmp_path / "dmesg.log.gz"
    p.write_bytes(gzip.compress(("[ 1.0] " + XID + "\n").encode() + b"[ 2.0] bad \xff\xfe bytes\n"))
    res = parse(p, ParseContext(tmp_path, "dmesg.log.gz"))
    assert res.status == "partial" and "undecodable" in res.message
    assert res.frames["kernel_events"].height == 2


def test_truncated_gzip_fails_with_a_reason(tmp_path):
    p = tmp_path / "dmesg.log.gz"
    p.write_bytes(gzip.compress(b"[ 1.0] x\n" * 1000)[:40])
    res = parse(p, ParseContext(tmp_path, "dmesg.log.gz"))
    assert res.status == "failed" and "dmesg.log.gz" in res.message


def test_empty_text():
    res = parse_text("", "e.log")
    assert res.status == "ok" and res.frames["kernel_events"].height == 0
