"""node_health on simulated runs: the OOM kill of one rank and the NIC link flap of the slow-NIC node,
checked against the truth the simulator wrote from what it injected (not from the detectors)."""

from __future__ import annotations

from pathlib import Path

import pytest

from forensics.base.findings import Severity
from forensics.pipeline import analyze
from forensics.simulate import simulate


def _run(tmp_path: Path, scenario: str, ranks: int, params: dict[str, str] | None = None):
    out = tmp_path / scenario
    truth = simulate(scenario, out, ranks=ranks, params={"layers": "2", **(params or {})})
    return truth, analyze(out, only=["node_health", "gpu_hw_error"])


@pytest.mark.parametrize(("world", "rank"), [(8, 5), (32, 28)], ids=["monotonic-dmesg", "iso-dmesg"])
def test_triggers_oom_kill_of_a_rank_names_its_host_rank_and_pid(tmp_path: Path, world: int, rank: int):
    truth, analysis = _run(tmp_path, "oom_kill", world, {"rank": str(rank)})
    fault = next(f for f in truth["faults"] if f["kind"] == "oom_kill")
    (x,) = analysis.findings  # node_health only: an OOM kill is no GPU fault
    assert x.detector == "node_health" and x.severity is Severity.CRITICAL and x.metrics["category"] == "oom"
    assert list(x.hosts) == fault["hosts"] and list(x.ranks) == fault["ranks"] == [rank] and x.gpus == ()
    assert x.metrics["pid"] == fault["expected"]["victim_pid"] and x.metrics["training_process"] is True
    assert x.metrics["anon_rss_gb"] == round(fault["expected"]["anon_rss_kb"] / 1024**2, 1)
    injected = [i for i in truth["kernel_log"]["injected"] if i["kind"] == "oom"]
    assert {(i["file"], i["line"]) for i in injected} == {(e["source"], e["line"]) for e in x.evidence}
    style = next(h["kernel_log_style"] for h in truth["hosts"] if h["host"] == fault["hosts"][0])
    if style == "monotonic":  # dmesg without a boot time: not on the wall clock
        assert x.metrics["time_placed"] is False and x.metrics["first_mono_s"] is not None
    else:  # ISO stamps carry microseconds
        assert style == "iso" and x.metrics["fault_wall_ns"] == injected[0]["time_ns"] // 1000 * 1000


def test_triggers_slow_nic_link_flap_names_the_node_and_its_ranks(tmp_path: Path):
    truth, analysis = _run(tmp_path, "slow_nic", 32)
    fault = next(f for f in truth["faults"] if f["kind"] == "slow_nic")
    flap = next(f for f in analysis.findings if f.detector == "node_health")
    assert flap.metrics["category"] == "nic_link" and flap.severity is Severity.WARNING
    assert list(flap.hosts) == fault["hosts"] and flap.ranks == ()  # no process, so no culprit rank...
    assert flap.metrics["ranks_on_host"] == ",".join(map(str, fault["ranks"]))  # ...but the exposed ranks
    injected = [i for i in truth["kernel_log"]["injected"] if i["kind"] == "nic_link"]
    assert flap.metrics["flaps"] == 1 and flap.metrics["last_state"] == "ACTIVE"  # DOWN, INIT, ACTIVE again
    assert flap.metrics["fault_wall_ns"] == injected[0]["time_ns"] // 10**9 * 10**9  # the node's dmesg -T stamp


def test_clean_benign_only_simulated_kernel_logs(tmp_path: Path):
    truth, analysis = _run(tmp_path, "benign_kernel_log", 16)
    assert truth["faults"] == [] and analysis.findings == [] and not analysis.skipped


def test_clean_simulated_nic_replug_is_no_finding(tmp_path: Path):
    """#28 item 4: module plugged, slot power sufficient and the port ACTIVE again on every NIC give nothing."""
    truth, analysis = _run(tmp_path, "nic_replug", 8)
    assert truth["faults"] == [] and analysis.findings == []
    text = "".join(p.read_text() for p in (tmp_path / "nic_replug" / "kernel").rglob("*.log"))
    assert text.count("Cable plugged") == text.count("advertised sufficient power") > 0  # the lines are there
