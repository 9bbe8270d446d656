"""Every real kernel-log excerpt in ../shared/sample_data/dmesg parses with exact counts per kind.

The expected counts were computed independently with grep on the raw files, e.g. for 01:
``grep -cE 'pcieport|AER-aware'`` = 10 aer, ``grep -cE '^\\S+ NVRM: GPU at PCI|Board Serial'`` = 2
gpu_identity, ``grep -c 'NVRM: Xid'`` = 1 xid; for 08 the RPC-history rows
``grep -cE 'RPC history|RPC event history|GSP RPC buffer|NVRM: +(entry|-?[0-9]+ )'`` = 21 and the
stack dump ``grep -cE 'CPU: 17|Hardware name|Call Trace|TASK>|\\+0x|WARNING: kernel stack|unwind stack'``
= 13 make the 34 context records. Continuation lines (``grep -c '^ \\+NVRM'``) fold into their
record and are not counted as records.
"""

from __future__ import annotations

import pytest

from tests.kernlog_helpers import events, kind_counts

EXPECTED: dict[str, dict[str, int]] = {
    "01_xid79_after_pcie_aer_surprise_down_tesla.log": {"aer": 10, "gpu_identity": 2, "xid": 1},
    # 18 lines - 2 continuations = 16 records; `ucsi_ccg 1-0008: i2c_transfer failed` is the one unknown
    "03_xid79_pid0_crash_dump_then_aer.log": {
        "gpu_identity": 2, "xid": 1, "fallen_off_bus": 1, "nvrm_other": 2, "device_other": 7, "aer": 2, "unknown": 1,
    },
    "04_fallen_off_bus_at_probe_no_xid.log": {"fallen_off_bus": 1, "nvrm_other": 1, "driver_load": 1},
    "06_xid63_xid64_row_remap_aws_alert_prefix.log": {"xid": 2},
    "06b_xid63_row_remapper_a100_stas00.log": {"xid": 1},
    "07_xid119_gsp_rpc_timeout_old_format_dmesgT.log": {"xid": 7},
    "08_xid119_gsp_timeout_h100_xe9680_dmesgT.log": {"gpu_identity": 2, "xid": 5, "context": 34, "benign": 1, "gsp": 1},
    "09_gsp_heartbeat_timeout_gh100_no_xid.log": {"driver_load": 1, "benign": 1, "gsp": 8},
    "11_xid13_xid109_peermem_dmesg_ctime.log": {"benign": 1, "xid": 4},
    "13_xid31_then_xid62_pmu_halt_then_xid45_cascade.log": {"gpu_identity": 1, "xid": 10, "benign": 1},
    "14_xid31_unrecognized_client_dmesgT.log": {"xid": 1},
    "17_xid145_xid137_b200_pci_elided.log": {"nvrm_other": 1, "xid": 2},
    "19_xid62_xid154_rtx5080_no_timestamp.log": {"xid": 2, "gsp": 1},
    "20b_imbue_docstring_xid64_xid94_sxid_examples.log": {"xid": 2, "sxid": 1},
    "21_fabricmanager_log_error_examples.log": {"fabric_manager": 3},
    "23_pcie_aer_correctable_data_link_syslog.log": {"aer": 10},
    "24_edac_host_dram_ue_and_apei_pcie_error.log": {"edac": 2, "ghes": 11, "mce": 1},
    "26_cpu_thermal_throttle_mce_prefix.log": {"cpu_thermal": 13},
    "28_cpu_thermal_throttle_grep_syslog_with_filename.log": {"cpu_thermal": 5},
    "30_oom_killer_dmesg_time_format_iso.log": {"oom": 4, "context": 2},
    # 5 systemd[1] lines + workqueue + EXT4 are benign
    "32_mlx5_ib_port_link_init_active_journal_hostname.log": {"benign": 7, "ib_port": 2},
    "42_xid13_old_format_no_pid_syslog_hostname.log": {"xid": 8},
    "44_nvlink_postrx_detect_failed_gh100_journal.log": {"nvlink": 1},
    "45_xid31_legacy_format_no_pci_prefix_pastebin.log": {"xid": 1},
    "46_legacy_gpu_fallen_off_bus_xid3_pastebin.log": {"fallen_off_bus": 1, "xid": 1, "nvrm_other": 8},
    "49_nvlink5_xid145_xid149_gb200_production_lines_gpud.log": {"xid": 19},
    # 9 wall-broadcast headers carry host and time and are not records
    "51_soft_and_hard_lockup_syslogd_wall_broadcast.log": {"soft_lockup": 6, "hard_lockup": 3},
}


def test_every_log_sample_is_listed():
    from tests.conftest import shared_path

    folder = shared_path("dmesg")
    logs = sorted(p.name for p in folder.glob("*.log"))
    assert logs == sorted(EXPECTED)
    from forensics.parsers.discovery import classify

    assert {classify(folder / n, n).kind for n in logs} == {"dmesg"}  # recognised by content


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_exact_counts_per_kind(name):
    df = events(name)
    assert kind_counts(df) == EXPECTED[name]
    assert df["source"].unique().to_list() == [name]
    # every record keeps its line number, in file order
    assert df["line"].is_sorted() and df["line"].min() >= 1
