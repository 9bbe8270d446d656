"""gpu_hw_error on simulated runs: one finding per injected incident naming the host, GPU and rank that
truth.json names; benign-only kernel logs produce none. Covers every kernel-log style the simulator
writes (node 0 monotonic, 1 dmesg -T, 2 syslog, 3 ISO), via the culprit rank's node. (The skip case
is in test_gpu_hw_error.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from forensics.base.findings import Severity
from forensics.pipeline import analyze
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


# --- real-log shapes as scenarios (issue 15 item 9): a fatal AER on the GPU's audio function, and
# RmInitAdapter failed on a node's second GPU. The expectations come from the rank layout (rank r runs on
# node r // 8, local GPU r % 8) and the kernel's own enumeration lines, not from what gpu_hw_error says.

def _lines(run: Path, rel: str) -> list[str]:
    return (run / rel).read_text().splitlines()


def _enumerated_gpus(lines: list[str]) -> list[str]:
    """The NVIDIA 3D controllers (class 0x0302) the kernel enumerated at boot, in bus order."""
    import re
    return [m.group(1) for ln in lines if (m := re.search(r"\bpci (\S+): \[10de:[0-9a-f]{4}\] type 00 class 0x0302", ln))]


def test_fatal_aer_on_the_audio_function_is_one_critical_finding_on_the_gpu_at_function_0(tmp_path: Path):
    import re
    rank = 10  # node 1 (dmesg -T), local GPU 2
    truth, analysis = _run(tmp_path, "aer_fatal_audio", 16, {"rank": str(rank)})
    run = tmp_path / "aer_fatal_audio"
    host = next(h["host"] for h in truth["hosts"] if h["node"] == rank // 8)
    klog = next(h["kernel_log"] for h in truth["hosts"] if h["host"] == host)
    gpu = _enumerated_gpus(_lines(run, klog))[rank % 8]  # the GPU of rank 10: the node's third
    audio = gpu[:-1] + "1"
    fault = next(f for f in truth["faults"] if f["kind"] == "aer_fatal")
    assert (fault["ranks"], fault["hosts"], fault["gpus"]) == ([rank], [host], [gpu])
    assert fault["expected"]["aer_device"] == audio and fault["expected"]["severity"] == "critical"
    # the lines as the kernel writes them: the port receives the error from .1, the audio driver prints
    # the details, each driver says it cannot recover, the port gives up
    injected = [i for i in truth["kernel_log"]["injected"] if i["kind"] == "aer_fatal"]
    text = [_lines(run, klog)[i["line"] - 1] for i in injected]
    assert all(i["host"] == host and i["gpu"] == gpu and i["rank"] == rank for i in injected)
    assert re.search(rf"pcieport (0000:[0-9a-f]{{2}}:01\.0): AER: Uncorrected \(Fatal\) error received: {audio}$", text[0])
    assert re.search(rf"snd_hda_intel {audio}: PCIe Bus Error: severity=Uncorrected \(Fatal\), type=Transaction Layer, "
                     r"\(Requester ID\)$", text[1])
    assert any(t.endswith(f"nvidia {gpu}: AER: can't recover (no error_detected callback)") for t in text)
    assert text[-1].endswith("AER: device recovery failed")
    (f,) = analysis.findings
    assert f.severity is Severity.CRITICAL and f.metrics["category"] == "aer"
    assert (f.gpus, f.hosts, f.ranks) == ((gpu,), (host,), (rank,))  # .0, never the audio function
    assert f.metrics["aer_device"] == f"{audio} (snd_hda_intel)"
    assert {(i["file"], i["line"]) for i in injected} <= {(e["source"], e["line"]) for e in f.evidence}
    # the GPU's rank stopped there: it is the rank the watchdog timeout misses
    missing = next(x for x in truth["faults"] if x["kind"] == "collective_timeout")["expected"]["missing_ranks"]
    assert missing == [rank]


def test_rm_init_adapter_failed_on_a_nodes_second_gpu_names_that_gpu_and_no_rank(tmp_path: Path):
    # 9 ranks: node 1 runs rank 8 on its first GPU; its second GPU failed to initialize, the job never used it
    truth, analysis = _run(tmp_path, "rm_init_failed", 9)
    run = tmp_path / "rm_init_failed"
    host = next(h["host"] for h in truth["hosts"] if h["node"] == 1)
    klog = next(h["kernel_log"] for h in truth["hosts"] if h["host"] == host)
    gpu = _enumerated_gpus(_lines(run, klog))[1]
    assert gpu not in {r["pci_bus_id"] for r in truth["ranks"] if r["host"] == host}
    fault = next(f for f in truth["faults"] if f["kind"] == "gpu_init_failed")
    assert (fault["ranks"], fault["hosts"], fault["gpus"]) == ([], [host], [gpu])
    assert fault["expected"]["device_minor"] == 1 and fault["expected"]["severity"] == "critical"
    injected = [i for i in truth["kernel_log"]["injected"] if i["kind"] == "gpu_init_failed"]
    text = [_lines(run, klog)[i["line"] - 1] for i in injected]
    assert len(injected) >= 2 and len(injected) % 2 == 0  # the pair repeats at each open of the device
    status = fault["expected"]["init_status"]
    for a, b in zip(text[::2], text[1::2]):
        assert a.endswith(f"NVRM: GPU {gpu}: RmInitAdapter failed! ({status})")
        assert b.endswith(f"NVRM: GPU {gpu}: rm_init_adapter failed, device minor number 1")
    (f,) = analysis.findings  # one GPU, one finding however often the driver retried
    assert f.severity is Severity.CRITICAL and f.metrics["category"] == "gpu_init_failed"
    assert (f.gpus, f.hosts, f.ranks) == ((gpu,), (host,), ())  # no rank ran on it: none is blamed
    assert f.metrics["device_minor"] == 1 and f.metrics["init_status"] == status
    assert {(i["file"], i["line"]) for i in injected} <= {(e["source"], e["line"]) for e in f.evidence}


@pytest.mark.parametrize(("ranks", "params", "message"), [
    (16, {}, "not a multiple of 8"),  # both nodes full: no GPU left free to fail
    (9, {"gpu": "0"}, "outside the valid range 1..7"),  # GPU 0 of the last node runs rank 8
])
def test_rm_init_failed_refuses_a_gpu_the_job_uses(ranks, params, message):
    from forensics.simulate import ScenarioError, check_run_args

    with pytest.raises(ScenarioError) as err:
        check_run_args("rm_init_failed", ranks=ranks, params=params)
    assert message in str(err.value)
