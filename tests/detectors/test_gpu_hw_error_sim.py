"""gpu_hw_error on simulated runs: one finding per injected incident naming the host, GPU and rank that
truth.json names; benign-only kernel logs produce none. Covers every kernel-log style the simulator
writes (node 0 monotonic, 1 dmesg -T, 2 syslog, 3 ISO), via the culprit rank's node. (The skip case
is in test_gpu_hw_error.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from forensics.analyze import analyze
from forensics.findings import Severity
from forensics.simulate import simulate

CASES = [
    # (scenario, world size, culprit rank (node = rank // 8), expected root Xid, severity)
    ("xid79", 16, 4, 79, Severity.CRITICAL),   # node 0: monotonic dmesg
    ("xid63", 16, 12, 63, Severity.WARNING),   # node 1: dmesg -T
    ("xid48", 24, 20, 48, Severity.CRITICAL),  # node 2: syslog with embedded monotonic stamps
    ("xid94", 32, 28, 94, Severity.CRITICAL),  # node 3: dmesg --time-format iso
    ("xid149", 16, 9, 149, Severity.CRITICAL),  # node 1: NVLink5 fault and the Xid 45s it caused: one finding
]


def _run(tmp_path: Path, scenario: str, ranks: int, params: dict[str, str] | None = None):
    out = tmp_path / scenario
    # small model, one step: the kernel logs are the same, the traces are cheap to parse
    truth = simulate(scenario, out, ranks=ranks, steps=1, params={"layers": "2", **(params or {})})
    return truth, analyze(out, only=["gpu_hw_error"])


@pytest.mark.parametrize(("scenario", "world", "rank", "xid", "severity"), CASES, ids=lambda v: str(v))
def test_triggers_one_finding_per_simulated_xid_incident(tmp_path: Path, scenario, world, rank, xid, severity):
    truth, analysis = _run(tmp_path, scenario, world, {"rank": str(rank)})
    fault = next(f for f in truth["faults"] if f["kind"] == "xid")
    (f,) = analysis.findings
    assert f.detector == "gpu_hw_error" and f.severity is severity
    assert f.metrics["root_xid"] == xid == fault["expected"]["xid"]
    assert list(f.hosts) == fault["hosts"] and list(f.gpus) == fault["gpus"] and list(f.ranks) == fault["ranks"]
    injected = {(i["file"], i["line"]) for i in truth["kernel_log"]["injected"] if i["kind"] != "xid_continuation"}
    assert injected <= {(e["source"], e["line"]) for e in f.evidence}
    style = next(h["kernel_log_style"] for h in truth["hosts"] if h["host"] == fault["hosts"][0])
    # monotonic dmesg without a boot time stays unplaced; every other style lands in the profile
    assert f.metrics["time_placed"] is (style != "monotonic")
    assert f.metrics["in_profiled_window"] is (None if style == "monotonic" else True)


def test_xid149_chain_is_one_nvlink5_finding_rooted_in_the_link_fault(tmp_path: Path):
    truth, analysis = _run(tmp_path, "xid149", 16, {"rank": "9"})
    (f,) = analysis.findings  # not one per Xid 45: the channels died of the link fault
    injected = [i for i in truth["kernel_log"]["injected"] if i["kind"] == "xid"]
    assert len(injected) == 3  # the 149 and two 45s "caused by previous Xid 149"
    assert f.metrics["category"] == "nvlink5" and f.metrics["root_xid"] == 149 and f.metrics["events"] == 3
    assert not f.title.startswith("Application-level")


def test_triggers_xid79_pcie_root_cause_and_timeout_rank(tmp_path: Path):
    truth, analysis = _run(tmp_path, "xid79", 16, {"rank": "9"})
    (f,) = analysis.findings
    missing = next(x for x in truth["faults"] if x["kind"] == "collective_timeout")["expected"]["missing_ranks"]
    assert list(f.ranks) == missing  # the faulty GPU's rank is the one that never arrived
    assert "PCIe link loss" in f.metrics["root_cause"] and f.metrics["events"] >= 4


def test_clean_benign_only_simulated_kernel_logs(tmp_path: Path):
    truth, analysis = _run(tmp_path, "benign_kernel_log", 16)
    assert truth["faults"] == [] and analysis.findings == []
    assert not analysis.skipped  # the detector ran: it had kernel logs and found nothing


def test_triggers_slow_nic_degraded_pcie_link_but_leaves_the_link_flap_to_node_health(tmp_path: Path):
    truth, analysis = _run(tmp_path, "slow_nic", 32)
    fault = next(f for f in truth["faults"] if f["kind"] == "slow_nic")
    (pcie,) = analysis.findings  # the NIC's link flap is node_health's (test_node_health_sim.py)
    assert pcie.metrics["category"] == "pcie_link" and list(pcie.hosts) == fault["hosts"]
    assert pcie.metrics["ranks_on_host"] == ",".join(map(str, fault["ranks"]))
