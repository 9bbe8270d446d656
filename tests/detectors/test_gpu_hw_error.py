"""gpu_hw_error: triggers (one finding per incident, joined to ranks and the profiled window),
clean logs (benign only: nothing), and skips."""

from __future__ import annotations

import shutil
from pathlib import Path

import polars as pl
import pytest
from forensics.parsers.nvidia_smi import parse_text as smi_text
from forensics.reports import json_report

from forensics.base.errors import UsageError
from forensics.base.findings import Severity
from forensics.base.frames import JobFrames
from forensics.detectors import run_detectors
from forensics.facts.context import JobContext
from forensics.pipeline import analyze
from tests.conftest import assert_valid_findings, shared_path
from tests.detectors.nccl_fixtures import frames_from
from tests.kernlog_helpers import T0, detect, kernel_frame
from tests.kernlog_helpers import journal as _log


def _kernel(text: str, source: str = "logs/dmesg.log") -> pl.DataFrame:
    return kernel_frame(text, source)


def _ranks(rows: list[tuple[int, str, int, int]]) -> pl.DataFrame:
    return pl.DataFrame(
        [{"rank": r, "host": h, "device": d, "pid": p} for r, h, d, p in rows],
        schema_overrides={"rank": pl.Int32, "device": pl.Int32},
    )


def _steps(host: str, start_s: float, end_s: float, rank: int) -> pl.DataFrame:
    return pl.DataFrame({"rank": [rank], "host": [host], "step": [1], "start_ns": [T0 + int(start_s * 1e9)],
                         "end_ns": [T0 + int(end_s * 1e9)]}, schema_overrides={"rank": pl.Int32})


SMI_NODE02 = (
    "==============NVSMI LOG==============\n\nTimestamp : Sat Mar  1 09:00:00 2025\n\n"
    "GPU 00000000:1B:00.0\n    Product Name : NVIDIA H100\n"
    "GPU 00000000:3B:00.0\n    Product Name : NVIDIA H100\n"
)


def test_triggers_aer_fatal_then_xid79_is_one_incident_with_host_gpu_rank_and_window():
    text = _log([
        ("node01", 5.0,
         "NVRM: Xid (PCI:0000:1b:00): 13, pid=4001, name=python, Graphics SM Warp Exception on (GPC 0, TPC 1, SM 0): "
         "Illegal Instruction Encoding"),
        ("node02", 30.0, "pcieport 0000:3a:01.0: AER: Corrected error received: 0000:3a:01.0"),
        ("node02", 99.900, "pcieport 0000:3a:01.0: AER: Uncorrected (Fatal) error received: 0000:3a:01.0"),
        ("node02", 99.901,
         "pcieport 0000:3a:01.0: PCIe Bus Error: severity=Uncorrected (Fatal), type=Transaction Layer, (Receiver ID)"),
        ("node02", 99.902, "pcieport 0000:3a:01.0:    [ 5] Surprise Down Error    (First)"),
        ("node02", 100.0, "NVRM: Xid (PCI:0000:3b:00): 79, pid=5002, name=python, GPU has fallen off the bus."),
        ("node02", 100.1, "NVRM: Xid (PCI:0000:3b:00): 45, pid=5002, name=python, Ch 00000010"),
    ])
    smi = smi_text(SMI_NODE02, "node02/nvidia-smi-q.txt").frames["gpu_health"]
    frames = {
        "kernel_events": _kernel(text),
        "gpu_health": smi,
        "ranks": _ranks([(0, "node01", 0, 4001), (1, "node01", 1, 4002), (2, "node02.cluster", 0, 5001),
                         (3, "node02.cluster", 1, 5002)]),
        "steps": pl.concat([_steps("node01", 0, 200, 0), _steps("node02.cluster", 0, 90, 3)]),
    }
    found = detect(frames)
    assert len(found) == 2
    hw = next(f for f in found if f.severity is Severity.CRITICAL)
    # host from the log, GPU 0000:3b:00.0 = index 1 on node02 (nvidia-smi order) = rank 3 (ranks.device)
    assert hw.hosts == ("node02",) and hw.gpus == ("0000:3b:00.0",) and hw.ranks == (3,)
    assert hw.metrics["root_xid"] == 79 and hw.metrics["aer_port"] == "0000:3a:01.0"
    assert hw.metrics["precursor_corrected_aer"] == 1 and hw.metrics["events"] == 6  # all 6 node02 lines
    assert hw.metrics["first_wall_ns"] == T0 + 30 * 10**9
    # the profile of node02 ended at +90 s: the fault is outside it, and we say so
    assert hw.metrics["fault_wall_ns"] == T0 + 100 * 10**9
    assert hw.metrics["in_profiled_window"] is False and hw.metrics["seconds_from_profile_end"] == 10.0
    app = next(f for f in found if f.severity is Severity.WARNING)
    assert app.hosts == ("node01",) and app.ranks == (0,) and app.metrics["in_profiled_window"] is True
    assert "inside the profiled window" in app.summary
    assert hw.id != app.id and len({f.id for f in detect(frames)} & {hw.id, app.id}) == 2  # stable ids


def test_triggers_xid45_caused_by_nvlink5_on_several_gpus_is_one_node_incident():
    text = _log([
        ("gb1", 1.0,
         "NVRM: Xid (PCI:0008:01:00): 149, NETIR_LINK_EVT Fatal XC0 i0 Link 08 (0x004505c6 0x00000000 0x00000000 "
         "0x00000000 0x00000000 0x00000000)"),
        ("gb1", 1.2, "NVRM: Xid (PCI:0008:01:00): 45, pid=10, name=python, Ch 00000008 caused by previous Xid 149"),
        ("gb1", 1.3, "NVRM: Xid (PCI:0018:01:00): 45, pid=11, name=python, Ch 00000008 caused by previous Xid 149"),
        ("gb1", 1.4, "NVRM: Xid (PCI:0019:01:00): 45, pid=12, name=python, Ch 00000008 caused by previous Xid 149"),
    ])
    (x,) = detect({"kernel_events": _kernel(text),
                   "ranks": _ranks([(0, "gb1", 0, 10), (1, "gb1", 1, 11), (2, "gb1", 2, 12)])})
    assert x.severity is Severity.CRITICAL and x.metrics["caused_by_xid"] == 149
    assert x.metrics["events"] == 4 and x.ranks == (0, 1, 2)  # ranks from the Xid pids


def test_triggers_memory_incident_xid48_then_xid63_and_policy_switch():
    text = _log([
        ("n1", 1.0,
         "NVRM: Xid (PCI:0000:3b:00): 48, pid=7, name=python, An uncorrectable double bit error (DBE) has been "
         "detected on GPU in the framebuffer at physAddr 0x1f3c partition 2, subpartition 1."),
        ("n1", 1.5,
         "NVRM: Xid (PCI:0000:3b:00): 63, pid='<unknown>', name=<unknown>, Row Remapper: New row (0x00000000deadbeef) "
         "marked for remapping, reset gpu to activate."),
    ])
    (x,) = detect({"kernel_events": _kernel(text)})
    assert x.metrics["xids"] == "48,63" and x.metrics["root_xid"] == 48 and x.severity is Severity.CRITICAL
    assert {"DRAIN_NODE", "RESET_GPU", "RMA_CANDIDATE"} <= set(x.metrics["actions"].split(";"))


def test_triggers_rank_from_nccl_init_bus_id(tmp_path):
    text = _log([("n7", 1.0, "NVRM: Xid (PCI:0000:5e:00): 94, pid=99, name=python, Ch 00000008")])
    nccl = frames_from(tmp_path, (
        "n7:1:1 [0] NCCL INFO ncclCommInitRank comm 0x1 rank 12 nranks 16 cudaDev 0 busId 3b000 commId 0xa - Init "
        "COMPLETE\n"
        "n7:2:2 [1] NCCL INFO ncclCommInitRank comm 0x2 rank 13 nranks 16 cudaDev 1 busId 5e000 commId 0xa - Init "
        "COMPLETE\n"
        # a sub-communicator's rank (1 of 2) is not a global rank
        "n7:2:2 [1] NCCL INFO ncclCommSplit comm 0x3 rank 1 nranks 2 cudaDev 1 busId 5e000 commId 0xb - Init COMPLETE\n"
    ))
    (x,) = detect({"kernel_events": _kernel(text), "nccl_comms": nccl["nccl_comms"]})
    assert x.ranks == (13,) and x.gpus == ("0000:5e:00.0",)


def test_triggers_host_from_file_path_when_the_log_has_none():
    frames = {"kernel_events": _kernel("[ 10.0] NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.\n",
                                       "node02/dmesg.txt"),
              "ranks": _ranks([(0, "node01", 1, 1), (1, "node02", 0, 2)]),
              "gpu_health": smi_text(SMI_NODE02, "node02/nvidia-smi.txt").frames["gpu_health"]}
    (x,) = detect(frames)
    assert x.hosts == ("node02",) and x.ranks == ()  # 3b is index 1 on node02; no rank uses it
    assert x.metrics["time_placed"] is False and "not placed on the job timeline" in x.summary


def test_clean_benign_only_log_makes_no_finding():
    text = _log([
        ("n1", 0.0, "Linux version 6.5.0 (build@host) #1 SMP"),
        ("n1", 1.0, "NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  570.158.01  Release Build"),
        ("n1", 2.0, "mlx5_core 0000:ab:00.0 mlx5_5: Port: 1 Link INIT"),
        ("n1", 3.0, "mlx5_core 0000:ab:00.0 mlx5_5: Port: 1 Link ACTIVE"),
        ("n1", 4.0,
         "workqueue: ib_cache_event_task [ib_core] hogged CPU for >10000us 4 times, consider switching to WQ_UNBOUND"),
        ("n1", 5.0, "pcieport 0000:00:03.1: AER: Correctable error message received from 0000:00:00.0"),
        ("n1", 5.0,
         "pcieport 0000:00:03.1: PCIe Bus Error: severity=Correctable, type=Data Link Layer, (Transmitter ID)"),
        ("n1", 6.0,
         "NVRM: Xid (PCI:0018:01:00): 149, NETIR_BER_EVENT Nonfatal XC0 i0 Link 03 (0x00086226 0x00000001 0x00000000 "
         "0x00000000 0x00000000 0x00000000)"),
        ("n1", 7.0, "ls[4242]: segfault at 0 ip 00007f sp 00007ffc error 4 in libc.so.6[7f0000+1000]"),
        ("n1", 8.0, "nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 11012, Non-fatal, Link 1 single-bit ECC (First)"),
    ])
    assert detect({"kernel_events": _kernel(text), "ranks": _ranks([(0, "n1", 0, 1000)])}) == []


def test_clean_healthy_nvidia_smi_makes_no_finding():
    path = shared_path("dmesg", "37_nvidia_smi_q_a100x8_healthy_control.txt")
    frames = smi_text(path.read_text(), "gpu.query.all.txt").frames
    assert detect(frames) == []


def test_skipped_without_kernel_logs_or_nvidia_smi():
    findings, skipped = run_detectors(JobContext(JobFrames({})), only=["gpu_hw_error"])
    assert findings == [] and len(skipped) == 1
    assert "kernel_events" in skipped[0].reason and "gpu_health" in skipped[0].reason


def test_unknown_policy_is_a_usage_error_naming_the_choices():
    job = JobContext(JobFrames({"kernel_events": _kernel("[ 1.0] NVRM: Xid (PCI:0000:3b:00): 79, x\n")}))
    with pytest.raises(UsageError, match=r"gpu_hw_error\.policy.*one of default, strict, lenient"):
        run_detectors(job, overrides={"gpu_hw_error": {"policy": "paranoid"}}, only=["gpu_hw_error"])


def test_analyze_real_samples_end_to_end_validates_against_the_schema(tmp_path: Path, findings_validator):
    run = tmp_path / "run"
    run.mkdir()
    for name in ("01_xid79_after_pcie_aer_surprise_down_tesla.log", "35_nvidia_smi_q_a10_row_remap_pending.txt",
                 "32_mlx5_ib_port_link_init_active_journal_hostname.log"):
        shutil.copy(shared_path("dmesg", name), run / name)
    analysis = analyze(run, only=["gpu_hw_error"])
    doc = assert_valid_findings(findings_validator, json_report.build(analysis))
    got = sorted((f["severity"], tuple(f["gpus"])) for f in doc["findings"])
    assert got == [("critical", ("0000:02:00.0",)), ("critical", ("0000:07:00.0",))]
    kinds = dict(zip(analysis.sources["path"], analysis.sources["kind"]))
    assert kinds["35_nvidia_smi_q_a10_row_remap_pending.txt"] == "nvidia_smi"


def test_triggers_dcgm_index_mapped_to_bus_id_and_rank_through_nvidia_smi():
    diag = "| GPU Memory                | Pass - GPUs: 0                                 |\n" \
           "|                           | Fail - GPU: 1                                  |\n"
    frames = {**smi_text(diag, "node02/dcgmi-diag.txt").frames,
              "gpu_health": smi_text(SMI_NODE02, "node02/nvidia-smi.txt").frames["gpu_health"],
              "ranks": _ranks([(6, "node02", 1, 77), (7, "node01", 1, 78)])}
    (x,) = detect(frames)
    assert x.gpus == ("0000:3b:00.0",) and x.ranks == (6,) and x.hosts == ("node02",)
    assert x.metrics["severity_level"] == "CRITICAL" and x.metrics["actions"] == "DRAIN_NODE;RMA_CANDIDATE"


def test_triggers_xid74_register_decode_and_leaves_the_gpfs_hung_task_to_node_health():
    text = (
        "[ 100.0] NVRM: Xid (PCI:0000:3b:00): 74, pid=1, name=python, NVLink: fatal error detected on link 3"
        "(0x00200000, 0x0, 0x0, 0x0, 0x0, 0x0, 0x0)\n"           # reg 1 bit 21: marginal signal integrity
        "[ 900.0] NVRM: Xid (PCI:0000:5e:00): 74, pid=1, name=python, NVLink: fatal error detected on link 4"
        "(0x0, 0x0, 0x0, 0x0, 0x00100000, 0x0, 0x0)\n"           # reg 5 bit 20: ECC threshold, no UE
        "[2000.0] INFO: task python:4242 blocked for more than 120 seconds.\n"
        "[2000.1] Call Trace:\n"
        "[2000.1]  cxiWaitEventWait+0x1f0/0x2d0 [mmfslinux]\n"
        "[2000.1]  _ZN6ThCond12internalWaitEP16KernelSynchStatejPv+0x5a/0x2a0 [mmfs26]\n"
    )
    found = detect({"kernel_events": _kernel(text)})
    si = next(f for f in found if f.gpus == ("0000:3b:00.0",))
    assert si.metrics["severity_level"] == "HIGH" and "marginal_si" in si.metrics["catalog_bucket"]
    assert "INSPECT_LINK" in si.metrics["actions"]
    thr = next(f for f in found if f.gpus == ("0000:5e:00.0",))
    assert thr.severity is Severity.WARNING and "ecc_threshold" in thr.metrics["catalog_bucket"]
    assert len(found) == 2  # the hung task is a host fault: node_health reports it (test_node_health.py)


def test_triggers_same_gsp_xid_on_three_hosts_is_flagged_as_a_fleet_pattern():
    text = _log([(h, float(i), "NVRM: Xid (PCI:0000:3b:00): 62, pid='<unknown>', name=<unknown>, 2023b230 20238a3a")
                 for i, h in enumerate(("a1", "a2", "a3"))])
    found = detect({"kernel_events": _kernel(text)})
    assert len(found) == 3 and all("3 hosts" in f.metrics["fleet_pattern"] for f in found)
    assert all("INVESTIGATE_SW" in f.metrics["actions"] for f in found)
    assert all("fleet_pattern" not in f.metrics for f in detect({"kernel_events": _kernel(text)}, fleet_min_hosts="4"))


def test_triggers_xid45_caused_by_previous_xid_joins_its_root_beyond_the_sympathetic_window():
    text = _log([
        ("n1", 0.0,
         "NVRM: Xid (PCI:0000:3b:00): 48, pid=7, name=python, An uncorrectable double bit error (DBE) has been "
         "detected on GPU"),
        ("n1", 60.0, "NVRM: Xid (PCI:0000:3b:00): 45, pid=8, name=python, Ch 00000009 caused by previous Xid 48"),
        ("n1", 200.0, "NVRM: Xid (PCI:0000:3b:00): 45, pid=9, name=python, Ch 0000000a"),  # solo: its own finding
    ])
    found = detect({"kernel_events": _kernel(text)})
    root = next(f for f in found if f.metrics.get("root_xid") == 48)
    assert root.metrics["events"] == 2 and root.metrics["caused_by_xid"] == 48
    solo = next(f for f in found if f is not root)
    assert solo.severity is Severity.WARNING and solo.metrics["root_xid"] == 45


def test_triggers_pcie_link_downtrained():
    text = _log([("n1", 1.0,
                  "mlx5_core 0000:1a:00.0: 63.008 Gb/s available PCIe bandwidth, limited by 2.5 GT/s PCIe x16 "
                             "link at 0000:17:00.0 (capable of 252.048 Gb/s with 16.0 GT/s PCIe x16 link)"),
                 ("n1", 2.0,
                  "mlx5_core 0000:1a:00.0: 252.048 Gb/s available PCIe bandwidth (16.0 GT/s PCIe x16 link)")])
    (x,) = detect({"kernel_events": _kernel(text)})
    assert x.severity is Severity.WARNING and x.metrics["device"] == "0000:1a:00.0" and "2.5 GT/s" in x.title


def test_triggers_monotonic_dmesg_placed_by_the_same_hosts_syslog_copy():
    xid = "NVRM: Xid (PCI:0000:3b:00): 79, pid=5, name=python, GPU has fallen off the bus."
    # rsyslog RFC 3339 with the kernel's own stamp embedded
    syslog = ("2025-03-01T10:00:00.000000+00:00 n1 kernel: [  500.000000] nvidia-peermem nv_get_p2p_free_callback:127 "
              "ERROR detected invalid context\n")
    dmesg = "[  500.000000] nvidia-peermem nv_get_p2p_free_callback:127 ERROR detected invalid context\n" \
            f"[  560.250000] {xid}\n"
    ke = pl.concat([_kernel(syslog, "n1/kern.log"), _kernel(dmesg, "n1/dmesg.log")])
    (x,) = detect({"kernel_events": ke})
    # boot = 10:00:00 - 500 s (from the line both files hold), so the Xid at 560.25 s is 10:01:00.25
    assert x.metrics["time_placed"] is True and x.metrics["fault_wall_ns"] == T0 + 60_250_000_000
    # without the syslog copy the same dmesg stays unplaced
    (y,) = detect({"kernel_events": _kernel(dmesg, "n1/dmesg.log")})
    assert y.metrics["time_placed"] is False


def test_an_application_xid_finding_carries_its_xid_numbers_as_typed_fields():
    """Incidents match the application Xids (13, 31, 43, 45) on ``Finding.xids``, never on metrics."""
    text = _log([("n1", 1.0, "NVRM: Xid (PCI:0000:3b:00): 13, pid=4001, name=python, Graphics SM Warp Exception on "
                              "(GPC 0, TPC 1, SM 0): Out Of Range Address")])
    (x,) = detect({"kernel_events": _kernel(text)})
    assert x.kind == "gpu_event" and x.xids == (13,), (x.kind, x.xids)
