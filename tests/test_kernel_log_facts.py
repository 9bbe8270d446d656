"""One test per kernel-log sample: the FLAG / OK facts its SOURCES.md entry lists."""

from __future__ import annotations

import calendar

import polars as pl

from forensics.base.findings import Severity
from tests.conftest import shared_path
from tests.kernlog_helpers import detect, events, fields, host_findings, parse_sample, sample_findings


def _utc(y: int, mo: int, d: int, h: int, mi: int, s: int) -> int:
    return calendar.timegm((y, mo, d, h, mi, s, 0, 0, 0)) * 10**9


def _only(findings, **match):
    hits = [f for f in findings if all(getattr(f, k) == v for k, v in match.items())]
    assert len(hits) == 1, [(f.title, f.gpus, f.hosts) for f in findings]
    return hits[0]


def test_01_aer_surprise_down_then_xid79_is_one_pcie_incident():
    df = events("01_xid79_after_pcie_aer_surprise_down_tesla.log")
    f = fields(df)
    assert f[10]["uuid"] == "GPU-660d987e-5b28-3bf6-2a2d-1d5ecae7f6df" and f[11]["serial"] == "0322716036227"
    fatal_bit = f[7]
    assert (fatal_bit["bit"], fatal_bit["name"], fatal_bit["first"]) == (5, "Surprise Down Error", "(First)")
    assert f[0]["sev"] == "Corrected" and f[4]["sev"] == "Uncorrected (Fatal)"
    # monotonic only: no boot time in the excerpt, so nothing is placed on the wall clock
    assert df["wall_ns"].null_count() == df.height
    (x,) = sample_findings("01_xid79_after_pcie_aer_surprise_down_tesla.log")
    assert x.severity is Severity.CRITICAL and x.gpus == ("0000:02:00.0",)
    assert x.metrics["root_xid"] == 79 and "0000:00:02.0" in x.metrics["root_cause"]
    assert x.metrics["precursor_corrected_aer"] == 1
    assert {"REBOOT_NODE", "INSPECT_PCIE", "DRAIN_NODE"} <= set(x.metrics["actions"].split(";"))
    assert {e["line"] for e in x.evidence} >= {1, 5, 8, 10, 13}
    assert x.metrics["time_placed"] is False and x.metrics["first_mono_s"] == 74785.660366


def test_03_xid79_with_sympathetic_usb_functions_and_crash_dump():
    df = events("03_xid79_pid0_crash_dump_then_aer.log")
    dump = df.filter(pl.col("line") == 6)["message"][0]
    assert "nvidia-bug-report.sh as root" in dump and dump.endswith("the NVIDIA kernel module is unloaded.")
    assert df.filter(pl.col("xid") == 79)["pid"].to_list() == [0]
    (x,) = sample_findings("03_xid79_pid0_crash_dump_then_aer.log")
    assert x.severity is Severity.CRITICAL and x.gpus == ("0000:09:00.0",)
    # the xhci / nvidia-gpu functions of the same board are evidence, not separate root causes
    assert {9, 10, 15} <= {e["line"] for e in x.evidence}
    # the lone corrected AER 34 min later is below the rate: counted, no finding
    assert x.metrics["benign_events"] == 2


def test_04_fallen_off_bus_at_probe_counts_as_xid79():
    df = events("04_fallen_off_bus_at_probe_no_xid.log")
    msg = df.filter(pl.col("kind") == "fallen_off_bus")["message"][0]
    assert "(PCI ID: 10de:26b5)" in msg and "not responding to commands" in msg
    assert fields(df.filter(pl.col("kind") == "driver_load"))[0]["version"] == "570.158.01"
    (x,) = sample_findings("04_fallen_off_bus_at_probe_no_xid.log")
    assert x.severity is Severity.CRITICAL and x.gpus == ("0000:b3:00.0",)
    assert {"REBOOT_NODE", "INSPECT_PCIE"} <= set(x.metrics["actions"].split(";"))


def test_06_alert_prefix_two_hosts_xid63_warning_xid64_critical():
    df = events("06_xid63_xid64_row_remap_aws_alert_prefix.log")
    assert df["host"].to_list() == ["ip-26-0-146-100", "ip-26-0-147-135"]
    assert df["mono_ns"].to_list() == [680111646286000, 257087812628000]
    assert fields(df)[1]["text"] == "..."  # truncated message body accepted
    found = sample_findings("06_xid63_xid64_row_remap_aws_alert_prefix.log")
    x63 = _only(found, hosts=("ip-26-0-146-100",))
    assert x63.severity is Severity.WARNING and x63.gpus == ("0000:10:1c.0",) and x63.metrics["root_xid"] == 63
    assert "RESET_GPU" in x63.metrics["actions"]
    x64 = _only(found, hosts=("ip-26-0-147-135",))
    assert x64.severity is Severity.CRITICAL and x64.gpus == ("0000:90:1c.0",)
    assert "RMA_CANDIDATE" in x64.metrics["actions"]
    # the checkers disagree on 63: strict (Azure NHC/imbue) fails it, lenient (catalog IGNORE) does not report it
    strict = sample_findings("06_xid63_xid64_row_remap_aws_alert_prefix.log", policy="strict")
    assert _only(strict, hosts=("ip-26-0-146-100",)).severity is Severity.CRITICAL
    lenient = sample_findings("06_xid63_xid64_row_remap_aws_alert_prefix.log", policy="lenient")
    assert [f.hosts for f in lenient] == [("ip-26-0-147-135",)]


def test_06b_xid63_no_prefix():
    df = events("06b_xid63_row_remapper_a100_stas00.log")
    assert df["pid"].to_list() == [1896] and df["time_format"].to_list() == ["none"]
    (x,) = sample_findings("06b_xid63_row_remapper_a100_stas00.log")
    assert x.severity is Severity.WARNING and x.gpus == ("0000:10:1c.0",)


def test_07_seven_xid119_are_one_incident_and_nvidia_smi_is_not_the_culprit():
    df = events("07_xid119_gsp_rpc_timeout_old_format_dmesgT.log")
    assert df["wall_ns"].to_list()[0] == _utc(2023, 3, 3, 4, 44, 24)
    assert df["wall_ns"].to_list()[-1] == _utc(2023, 3, 3, 4, 48, 54)
    assert [f["rpc_function"] for f in fields(df)] == [76, 103, 103, 103, 76, 76, 76]
    res = parse_sample("07_xid119_gsp_rpc_timeout_old_format_dmesgT.log")
    ranks = pl.DataFrame({"rank": [3], "host": ["n1"], "pid": [1365232], "device": [0]},
                         schema_overrides={"rank": pl.Int32, "device": pl.Int32})
    (x,) = detect({**res.frames, "ranks": ranks})
    assert x.severity is Severity.CRITICAL and x.gpus == ("0000:61:00.0",) and x.metrics["events"] == 7
    assert x.ranks == ()  # pid= on a 119 is the caller whose RPC timed out, not a culprit
    assert "INVESTIGATE_SW" in x.metrics["actions"]


def test_08_gsp_timeout_context_is_not_separate_findings():
    df = events("08_xid119_gsp_timeout_h100_xe9680_dmesgT.log")
    xid_fields = [f for f in fields(df) if f.get("xid") == 119]
    assert {f["gpu_instance"] for f in xid_fields} == {4} and xid_fields[0]["timeout_s"] == 6
    (x,) = sample_findings("08_xid119_gsp_timeout_h100_xe9680_dmesgT.log")
    assert x.severity is Severity.CRITICAL and x.gpus == ("0000:9b:00.0",)
    assert x.metrics["events"] == 6  # 5 Xid 119 + the rate-limit line
    assert x.metrics["first_wall_ns"] == _utc(2025, 2, 23, 16, 24, 18)


def test_09_gsp_heartbeat_without_xid_is_critical_with_unknown_gpu():
    (x,) = sample_findings("09_gsp_heartbeat_timeout_gh100_no_xid.log")
    assert x.severity is Severity.CRITICAL and x.gpus == () and x.metrics["gpu_instance"] == 6
    assert x.metrics["events"] == 8 and x.metrics["benign_events"] == 1  # the workqueue line
    assert x.metrics["first_mono_s"] == 24.302465


def test_11_xid13_burst_then_xid109_one_application_incident():
    df = events("11_xid13_xid109_peermem_dmesg_ctime.log")
    f13 = fields(df)[1]
    assert (f13["gpc"], f13["tpc"], f13["sm"]) == (7, 7, 0) and f13["pid"] is None
    (x,) = sample_findings("11_xid13_xid109_peermem_dmesg_ctime.log")
    assert x.gpus == ("0000:cb:00.0",) and x.metrics["root_xid"] == 13 and x.metrics["xids"] == "13,109"
    assert x.severity is Severity.CRITICAL and x.metrics["severity_level"] == "HIGH"
    assert x.metrics["actions"] == "RESTART_APP;RESET_GPU" and x.metrics["benign_events"] == 1
    (lenient,) = sample_findings("11_xid13_xid109_peermem_dmesg_ctime.log", policy="lenient")
    assert lenient.severity is Severity.WARNING


def test_13_xid31_app_fault_then_xid62_with_eight_sympathetic_xid45():
    found = sample_findings("13_xid31_then_xid62_pmu_halt_then_xid45_cascade.log")
    assert len(found) == 2
    app = _only(found, severity=Severity.WARNING)
    assert app.metrics["root_xid"] == 31 and app.gpus == ("0000:0a:00.0",)
    hw = _only(found, severity=Severity.CRITICAL)
    assert hw.metrics["root_xid"] == 62 and hw.metrics["events"] == 9 and "RESET_GPU" in hw.metrics["actions"]
    f31 = fields(events("13_xid31_then_xid62_pmu_halt_then_xid45_cascade.log"))[1]
    assert f31["mmu_engine"] == "CE2 HUBCLIENT_CE0" and f31["fault_type"] == "FAULT_PRIV_VIOLATION"


def test_14_xid31_dmesg_T():
    df = events("14_xid31_unrecognized_client_dmesgT.log")
    assert df["wall_ns"][0] == _utc(2026, 6, 24, 15, 44, 42) and df["process"][0] == "python3"
    (x,) = sample_findings("14_xid31_unrecognized_client_dmesgT.log")
    assert x.severity is Severity.WARNING and x.gpus == ("0000:70:00.0",) and x.metrics["actions"] == "RESTART_APP"


def test_17_redacted_pci_keeps_gpu_unknown():
    df = events("17_xid145_xid137_b200_pci_elided.log")
    assert df["pci_bus_id"].null_count() == 3
    f145 = fields(df)[1]
    assert (f145["nvlink_unit"], f145["fatal"], f145["link"]) == ("RLW_RXPIPE", False, 11)
    found = sample_findings("17_xid145_xid137_b200_pci_elided.log")
    assert sorted(f.metrics["root_xid"] for f in found) == [137, 145]
    assert all(f.severity is Severity.WARNING and f.gpus == () for f in found)


def test_19_xid62_then_xid154_gpu_reset_required():
    (x,) = sample_findings("19_xid62_xid154_rtx5080_no_timestamp.log")
    assert x.severity is Severity.CRITICAL and x.gpus == ("0000:01:00.0",)
    assert x.metrics["recovery_action"] == "GPU Reset Required" and x.metrics["events"] == 3
    assert x.metrics["actions"] == "RESET_GPU"


def test_20b_xid64_and_xid94_one_memory_incident_sxid_separate():
    df = events("20b_imbue_docstring_xid64_xid94_sxid_examples.log")
    assert df["boot"].to_list() == [0, 0, 1]  # 186965 s after 2397166 s: another boot
    found = sample_findings("20b_imbue_docstring_xid64_xid94_sxid_examples.log")
    mem = _only(found, severity=Severity.CRITICAL)
    assert mem.gpus == ("0000:0f:00.0",) and mem.metrics["xids"] == "64,94"
    assert {"DRAIN_NODE", "RESET_GPU", "RMA_CANDIDATE", "RESTART_APP"} <= set(mem.metrics["actions"].split(";"))
    sx = _only(found, severity=Severity.WARNING)
    assert sx.metrics["switch"] == "0000:85:00.0" and "SXid 12028" in sx.title


def test_21_fabric_manager_fatal_nonfatal_and_multicast():
    found = sample_findings("21_fabricmanager_log_error_examples.log")
    fatal = _only(found, severity=Severity.CRITICAL)
    assert "20034" in fatal.title and fatal.metrics["switch"] == "0000:86:00.0"
    assert fatal.metrics["first_wall_ns"] == _utc(2024, 7, 23, 7, 53, 55)
    warn = [f for f in found if f.severity is Severity.WARNING]
    assert len(warn) == 2 and any("12028" in f.title for f in warn)
    assert any(f.metrics["actions"] == "INVESTIGATE_SW" and f.metrics["category"] == "fabric_manager" for f in warn)


def test_23_corrected_aer_burst_on_root_port_not_attributed_to_a_gpu():
    df = events("23_pcie_aer_correctable_data_link_syslog.log")
    assert set(df["host"]) == {"bubz"} and df["wall_source"].unique().to_list() == ["stamp_year_from_file"]
    (x,) = sample_findings("23_pcie_aer_correctable_data_link_syslog.log")
    assert x.severity is Severity.WARNING and x.gpus == () and x.hosts == ("bubz",)
    assert x.metrics["aer_port"] == "0000:00:03.1" and x.metrics["corrected_errors"] == 3
    assert x.metrics["aer_errors"] == "BadTLP, Timeout"
    # below the rate it is benign: counted, not a finding
    assert sample_findings("23_pcie_aer_correctable_data_link_syslog.log", corrected_aer_min_count="4") == []


def test_24_host_dram_ue_is_node_health_critical_and_ghes_stays_a_gpu_hw_warning():
    # the UE is host memory: node_health's, at critical, naming the DIMM; not a GPU finding
    (edac,) = host_findings("24_edac_host_dram_ue_and_apei_pcie_error.log")
    assert edac.severity is Severity.CRITICAL and edac.gpus == () and "not a GPU" in edac.title
    assert edac.metrics["dimm"] == "CPU_SrcID#1_MC#1_Chan#2_DIMM#0" and edac.metrics["memory_controller"] == 3
    assert (edac.metrics["ue_count"], edac.metrics["ce_count"]) == (1, 0)
    assert edac.metrics["actions"] == "DRAIN_NODE;RMA_CANDIDATE" and edac.metrics["first_mono_s"] == 11189.970968
    assert edac.metrics["time_placed"] is False and [e["line"] for e in edac.evidence] == [1]
    (ghes,) = sample_findings("24_edac_host_dram_ue_and_apei_pcie_error.log")
    assert ghes.severity is Severity.WARNING and ghes.metrics["category"] == "ghes"
    assert ghes.metrics["device"] == "0000:5e:00.0" and ghes.metrics["vendor_device"] == "0x144d:0xa808"
    assert ghes.metrics["ghes_severity"] == "recoverable"


def test_26_cpu_thermal_throttle_mce_prefix():
    assert sample_findings("26_cpu_thermal_throttle_mce_prefix.log") == []  # not a GPU fault
    (x,) = host_findings("26_cpu_thermal_throttle_mce_prefix.log")
    assert x.severity is Severity.WARNING and x.metrics["actions"] == "CHECK_COOLING"
    assert x.metrics["cpus"] == "0,1,2,3,4,5,6,7" and x.metrics["max_total_events"] == 3654
    assert x.metrics["events"] == 13  # 8 CPUs x core/package throttle + "normal" lines, one episode


def test_28_grep_filename_prefix_chronic_cpu_throttle():
    df = events("28_cpu_thermal_throttle_grep_syslog_with_filename.log")
    assert set(df["host"]) == {"jogelin-XPS-15-9570"}
    assert sample_findings("28_cpu_thermal_throttle_grep_syslog_with_filename.log") == []
    (x,) = host_findings("28_cpu_thermal_throttle_grep_syslog_with_filename.log")
    assert x.metrics["cpus"] == "0,1,5,7,11" and x.metrics["max_total_events"] == 678246
    assert x.hosts == ("jogelin-XPS-15-9570",) and x.severity is Severity.WARNING


def test_30_oom_iso_time_with_offset_and_rank_attribution():
    df = events("30_oom_killer_dmesg_time_format_iso.log")
    # 14:55:41,678628+02:00 = 12:55:41.678628 UTC
    assert df["wall_ns"][0] == _utc(2024, 4, 29, 12, 55, 41) + 678_628_000
    assert sample_findings("30_oom_killer_dmesg_time_format_iso.log") == []
    (x,) = host_findings("30_oom_killer_dmesg_time_format_iso.log")
    # perl is not a training process: the host ran out of memory, a warning
    assert x.severity is Severity.WARNING and x.metrics["pid"] == 1440763 and x.metrics["process"] == "perl"
    assert x.metrics["anon_rss_gb"] == round(60356340 / 1024**2, 1) and x.metrics["invoked_by"] == "pool"
    assert x.metrics["constraint"] == "CONSTRAINT_NONE" and x.metrics["training_process"] is False
    # one episode from "pool invoked oom-killer" to the reaper, 5.27 s later
    assert x.metrics["first_wall_ns"] == _utc(2024, 4, 29, 12, 55, 41) + 678_628_000
    assert x.metrics["last_wall_ns"] == _utc(2024, 4, 29, 12, 55, 46) + 947_445_000
    assert x.metrics["events"] == 4 and x.ranks == ()
    # the same pid as a rank's: the trainer was killed, critical, naming the rank
    ranks = pl.DataFrame({"rank": [5], "host": ["node7"], "pid": [1440763]}, schema_overrides={"rank": pl.Int32})
    (r,) = detect({**parse_sample("30_oom_killer_dmesg_time_format_iso.log").frames, "ranks": ranks}, "node_health")
    assert r.ranks == (5,) and r.severity is Severity.CRITICAL and r.metrics["training_process"] is True


def test_32_ib_port_init_to_active_at_boot_is_not_a_flap():
    df = events("32_mlx5_ib_port_link_init_active_journal_hostname.log")
    ib = df.filter(pl.col("kind") == "ib_port")
    assert [f["state"] for f in fields(ib)] == ["INIT", "ACTIVE"] and ib["pci_bus_id"].to_list() == ["0000:ab:00.0"] * 2
    assert set(df["host"]) == {"000-000-00000-1-gpu-1"}
    assert sample_findings("32_mlx5_ib_port_link_init_active_journal_hostname.log") == []
    assert host_findings("32_mlx5_ib_port_link_init_active_journal_hostname.log") == []


def test_42_old_format_xid13_burst_one_finding():
    df = events("42_xid13_old_format_no_pid_syslog_hostname.log")
    assert df["pid"].null_count() == 8 and fields(df)[1]["gpc"] == 1
    (x,) = sample_findings("42_xid13_old_format_no_pid_syslog_hostname.log")
    assert x.severity is Severity.WARNING and x.hosts == ("Gipfeli",) and x.gpus == ("0000:41:00.0",)
    assert x.metrics["events"] == 8 and x.metrics["actions"] == "RESTART_APP"


def test_44_nvlink_postrx_failure_high_gpu_unknown():
    (x,) = sample_findings("44_nvlink_postrx_detect_failed_gh100_journal.log")
    assert x.metrics["severity_level"] == "HIGH" and x.hosts == ("pool0-0082",) and x.gpus == ()
    assert "INSPECT_LINK" in x.metrics["actions"]


def test_45_legacy_xid_without_pci_prefix():
    (x,) = sample_findings("45_xid31_legacy_format_no_pci_prefix_pastebin.log")
    assert x.severity is Severity.WARNING and x.gpus == ("0000:01:00.0",) and x.metrics["root_xid"] == 31


def test_46_legacy_fallen_off_bus_with_sympathetic_xid3():
    (x,) = sample_findings("46_legacy_gpu_fallen_off_bus_xid3_pastebin.log")
    assert x.severity is Severity.CRITICAL and x.gpus == ("0000:01:00.0",) and x.hosts == ("localhost",)
    assert x.metrics["events"] == 2 and "REBOOT_NODE" in x.metrics["actions"]


def test_49_nvlink5_decode():
    df = events("49_nvlink5_xid145_xid149_gb200_production_lines_gpud.log")
    f = fields(df)
    assert f[1]["process"] == "ray::WorkerDict" and f[1]["error_status"] == "0x00000008"
    assert f[11]["nvlink_unit"] == "NETIR_LINK_EVT" and f[11]["subcode"] == 4 and f[11]["fatal"] is True
    assert f[5]["link"] == -1 and f[0]["subcode"] == 0
    found = sample_findings("49_nvlink5_xid145_xid149_gb200_production_lines_gpud.log")
    by_gpu = {}
    for x in found:
        by_gpu.setdefault(x.gpus[0], []).append(x.metrics["severity_level"])
    assert set(by_gpu) == {"0008:01:00.0", "0018:01:00.0", "0019:01:00.0"}
    assert "CRITICAL" in by_gpu["0008:01:00.0"] and "CRITICAL" in by_gpu["0018:01:00.0"]
    assert max(by_gpu["0019:01:00.0"]) == "HIGH"  # NETIR Fatal Link -1 only ("Link Fatal")


def test_51_wall_broadcast_lockups_one_host_incident():
    df = events("51_soft_and_hard_lockup_syslogd_wall_broadcast.log")
    assert set(df["host"]) == {"zyr"} and "SCTP timer" in df["process"].to_list()
    assert sample_findings("51_soft_and_hard_lockup_syslogd_wall_broadcast.log") == []  # not a GPU fault
    (x,) = host_findings("51_soft_and_hard_lockup_syslogd_wall_broadcast.log")
    assert x.severity is Severity.CRITICAL and x.metrics["soft_lockup"] == 6 and x.metrics["hard_lockup"] == 3
    assert x.metrics["cpus"] == "0,1,3,8,9,10,20,21,23" and x.gpus == () and x.hosts == ("zyr",)
    assert x.metrics["max_stuck_s"] == 37 and "REBOOT_NODE" in x.metrics["actions"]


HOST_SAMPLES = {"24_edac_host_dram_ue_and_apei_pcie_error.log": ["critical"],
                "26_cpu_thermal_throttle_mce_prefix.log": ["warning"],
                "28_cpu_thermal_throttle_grep_syslog_with_filename.log": ["warning"],
                "30_oom_killer_dmesg_time_format_iso.log": ["warning"],
                "51_soft_and_hard_lockup_syslogd_wall_broadcast.log": ["critical"]}


def test_node_health_flags_exactly_the_host_fault_samples():
    # every other kernel log of the sample set is a GPU fault or a healthy boot (SOURCES.md): no host finding
    names = sorted(p.name for p in shared_path("dmesg").iterdir() if p.name.endswith(".log"))
    assert len(names) == 27, names
    got = {n: [f.severity.value for f in host_findings(n)] for n in names}
    assert {n: s for n, s in got.items() if s} == HOST_SAMPLES
