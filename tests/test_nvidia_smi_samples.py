"""nvidia-smi -q and dcgmi samples: parsed values and the FLAG / OK facts of SOURCES.md.

Expected values were read off the files by hand (e.g. `grep -n "Uncorrectable\\|Pending" 35_*`).
"""

from __future__ import annotations

import pytest
from forensics.parsers.nvidia_smi import parse_text

from forensics.base.findings import Severity
from tests.conftest import shared_path
from tests.kernlog_helpers import parse_sample, sample_findings

TXT = [
    "34_nvidia_smi_q_sram_uncorrectable.txt",
    "35_nvidia_smi_q_a10_row_remap_pending.txt",
    "37_nvidia_smi_q_a100x8_healthy_control.txt",
    "38_nvidia_smi_q_v100_hw_power_brake_active.txt",
    "39_dcgmi_diag_failures_stas00.txt",
    "53_nvidia_smi_q_gh200_r550_format_dram_ue_row_remapped.txt",
]


def test_every_txt_sample_is_listed_and_recognised_as_nvidia_smi():
    from forensics.parsers.discovery import classify

    folder = shared_path("dmesg")
    assert sorted(p.name for p in folder.glob("*.txt")) == TXT
    assert {classify(folder / n, n).kind for n in TXT} == {"nvidia_smi"}


def _gpu(name: str, i: int = 0) -> dict:
    return parse_sample(name).frames["gpu_health"].row(i, named=True)


def test_34_sram_uncorrectable_is_high_rma_candidate():
    g = _gpu("34_nvidia_smi_q_sram_uncorrectable.txt")
    assert (g["ecc_volatile_sram_ue"], g["ecc_aggregate_sram_ue"], g["ecc_aggregate_dram_ue"]) == (1, 5, 0)
    assert g["pci_bus_id"] is None and g["gpu_index"] is None
    (x,) = sample_findings("34_nvidia_smi_q_sram_uncorrectable.txt")
    assert x.metrics["severity_level"] == "HIGH" and {"RMA_CANDIDATE", "RESET_GPU"} <= set(x.metrics["actions"].split(";"))


def test_35_row_remap_pending_needs_reset():
    g = _gpu("35_nvidia_smi_q_a10_row_remap_pending.txt")
    assert g["pci_bus_id"] == "0000:07:00.0" and g["driver_version"] == "535.129.03"
    assert (g["remapped_rows_ue"], g["remap_pending"], g["remap_failure"]) == (4, True, False)
    assert g["reset_required"] is False and g["ecc_aggregate_dram_ue"] == 0
    assert g["clock_reasons_active"] == ["Idle"]  # only Idle: no throttle
    (x,) = sample_findings("35_nvidia_smi_q_a10_row_remap_pending.txt")
    assert x.severity is Severity.CRITICAL and x.metrics["severity_level"] == "HIGH"
    assert x.gpus == ("0000:07:00.0",) and x.metrics["actions"] == "DRAIN_NODE;RESET_GPU"


def test_37_healthy_control_makes_no_finding():
    gh = parse_sample("37_nvidia_smi_q_a100x8_healthy_control.txt").frames["gpu_health"]
    assert gh.height == 8 and gh["gpu_index"].to_list() == list(range(8))
    assert gh["remap_pending"].to_list() == [False] * 8 and gh["ecc_volatile_dram_ue"].sum() == 0
    note = gh.filter(gh["pci_bus_id"] == "0000:8b:00.0").row(0, named=True)
    assert (note["ecc_aggregate_dram_ce"], note["remapped_rows_ce"]) == (21, 1)
    assert all(r == [] for r in gh["clock_reasons_active"].to_list())
    assert sample_findings("37_nvidia_smi_q_a100x8_healthy_control.txt") == []


def test_38_hw_power_brake_is_high_check_power():
    g = _gpu("38_nvidia_smi_q_v100_hw_power_brake_active.txt")
    assert g["clock_reasons_active"] == ["HW Slowdown", "HW Power Brake Slowdown"] and g["sm_clock_mhz"] == 382
    (x,) = sample_findings("38_nvidia_smi_q_v100_hw_power_brake_active.txt")
    assert x.metrics["severity_level"] == "HIGH" and x.metrics["actions"] == "CHECK_POWER"
    assert x.metrics["reason"] == "hw power brake slowdown"


def test_39_dcgmi_diag_pending_remaps_memory_fail_and_thermal_warning():
    diag = parse_sample("39_dcgmi_diag_failures_stas00.txt").frames["gpu_diag"]
    err = diag.filter(diag["result"] == "error").row(0, named=True)
    assert err["gpu_index"] == 3 and err["message"] == "GPU 3 has uncorrectable memory errors and row remappings are pending"
    fail = diag.filter(diag["result"] == "fail").row(0, named=True)
    assert (fail["test"], fail["gpu_index"]) == ("GPU Memory", 0)
    assert sorted(diag.filter(diag["result"] == "pass")["gpu_index"].to_list()) == [1, 2, 3, 4, 5, 6, 7]
    warn = diag.filter(diag["result"] == "warning").row(0, named=True)
    assert warn["message"].startswith("GPU 0 Thermal violations totaling 13.3 seconds started at 9.7 seconds")
    found = sample_findings("39_dcgmi_diag_failures_stas00.txt")
    levels = sorted((f.metrics["severity_level"], f.metrics["dcgm_gpu_index"]) for f in found)
    assert levels == [("CRITICAL", 0), ("HIGH", 3), ("WARNING", 0)]
    thermal = next(f for f in found if f.severity is Severity.WARNING)
    assert thermal.metrics["thermal_violation_s"] == 13.3 and thermal.metrics["actions"] == "CHECK_COOLING"


def test_53_r550_layout_completed_remap_is_info_only():
    g = _gpu("53_nvidia_smi_q_gh200_r550_format_dram_ue_row_remapped.txt")
    assert g["pci_bus_id"] == "0000:dd:00.0" and g["product"] == "NVIDIA GH200 480GB"
    assert (g["ecc_aggregate_dram_ue"], g["remapped_rows_ue"], g["remap_pending"], g["remap_failure"]) == (1, 1, False, False)
    assert g["sram_threshold_exceeded"] is False and g["ecc_aggregate_sram_ue"] == 0
    assert g["reset_required"] is False and g["clock_reasons_active"] == ["Idle"]
    assert sample_findings("53_nvidia_smi_q_gh200_r550_format_dram_ue_row_remapped.txt") == []


def test_node_level_power_brake_on_every_gpu_is_one_finding():
    blocks = []
    for bus in ("07", "0B", "48", "4C"):
        blocks.append(
            f"GPU 00000000:{bus}:00.0\n    Clocks Event Reasons\n        Idle                  : Not Active\n"
            "        HW Slowdown           : Active\n            HW Power Brake Slowdown : Active\n"
            "    Clocks\n        SM                    : 400 MHz\n"
        )
    text = "==============NVSMI LOG==============\n\nTimestamp : Sat Mar  4 04:55:00 2023\n\n" + "".join(blocks)
    res = parse_text(text, "node1/nvidia-smi.txt")
    from tests.kernlog_helpers import detect

    (x,) = detect(res.frames)
    assert x.metrics["node_level"] is True and x.metrics["gpus_affected"] == 4
    assert x.gpus == ("0000:07:00.0", "0000:0b:00.0", "0000:48:00.0", "0000:4c:00.0")
    assert "node-level" in x.title and x.metrics["actions"] == "CHECK_POWER"


@pytest.mark.parametrize("text", ["", "hello\nworld\n", "| only | a pipe |\n"])
def test_garbage_does_not_raise(text):
    res = parse_text(text, "x.txt")
    assert res.status in ("ok", "failed")
