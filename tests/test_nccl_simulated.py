"""The NCCL detectors on the simulator's scenarios (forensics simulate): each injected NCCL fault is
found with the ranks and hosts truth.json names, and clean baselines raise none of them.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from forensics.parsers.discovery import discover_and_parse

from forensics.detectors import run_detectors
from forensics.facts.context import JobContext
from forensics.pipeline import collect_frames
from forensics.simulate import simulate

NCCL = ["nccl_transport", "nccl_algorithm", "nccl_timeout"]


def _simulate(tmp_path_factory, scenario: str, traces: bool = False, **kw) -> tuple[dict, list, Path]:
    """Simulate ``scenario`` and run the NCCL detectors on its logs (and traces when asked: slower)."""
    out = tmp_path_factory.mktemp(scenario) / "run"
    truth = simulate(scenario, out, steps=1, compresslevel=1, **kw)
    logs = out / "logs"
    assert logs.is_dir() and any(logs.iterdir()), f"the simulator wrote no NCCL logs for {scenario}"
    parsed = discover_and_parse(out if traces else logs)
    _, frames = collect_frames(parsed)
    findings, _ = run_detectors(JobContext(frames), only=NCCL)
    _LAST["frames"] = frames
    return truth, findings, out


_LAST: dict = {}


def _keys(findings) -> set[tuple[str, str]]:
    return {(f.detector, f.key.split(":")[0]) for f in findings}


def _truth_hosts(truth: dict) -> set[str]:
    return {h["host"] for h in truth["hosts"]}


@pytest.mark.parametrize("scenario", ["ddp_clean", "pp_clean", "ddp_straggler", "benign_kernel_log"])
def test_clean_baselines_raise_no_nccl_finding(tmp_path_factory, scenario):
    # ddp_straggler / benign_kernel_log inject nothing NCCL-related: these detectors must stay quiet too
    _, findings, _ = _simulate(tmp_path_factory, scenario)
    assert findings == [], [f.title for f in findings]


def test_net_socket_is_found_on_every_host(tmp_path_factory):
    truth, findings, _ = _simulate(tmp_path_factory, "net_socket")
    (f,) = [f for f in findings if f.key == "socket"]
    assert set(f.hosts) == _truth_hosts(truth)
    assert set(f.ranks) == {r["rank"] for r in truth["ranks"]}
    # the same GPUs (PCI bus ids) the simulator put behind those ranks
    assert set(f.gpus) == {r["pci_bus_id"] for r in truth["ranks"]}


def test_gdr_off_is_found(tmp_path_factory):
    truth, findings, _ = _simulate(tmp_path_factory, "gdr_off")
    (f,) = [f for f in findings if f.key == "no_gdr"]
    assert set(f.hosts) == _truth_hosts(truth)
    assert ("nccl_transport", "socket") not in _keys(findings)


def test_forced_algorithm_is_found_and_quantified(tmp_path_factory):
    truth, findings, _ = _simulate(tmp_path_factory, "algo_forced", traces=True)
    (f,) = [f for f in findings if f.key == "forced"]
    assert f.metrics["predicted_lost_us_per_step"] > 0 and f.fraction_of_step is not None
    algo = truth["faults"][0].get("algo") or truth["faults"][0]["params"].get("algo", "Tree")
    assert f"NCCL_ALGO={algo}" in f.summary
    assert set(f.hosts) == _truth_hosts(truth)
    # log processes and trace ranks are the same ranks on the same GPUs
    from forensics.facts.identity import identities

    ids = identities(_LAST["frames"])
    assert ids.height == len(truth["ranks"])
    assert (ids["rank"] == ids["trace_rank"]).all()
    want = {(r["host"], r["pid"], r["rank"], r["pci_bus_id"]) for r in truth["ranks"]}
    assert set(ids.select("host", "pid", "rank", "bus_id").iter_rows()) == want


def test_forced_protocol_is_found(tmp_path_factory):
    truth, findings, _ = _simulate(tmp_path_factory, "proto_forced")
    (f,) = [f for f in findings if f.key == "forced"]
    assert "NCCL_PROTO=" in f.summary


def test_p2p_disabled_is_found(tmp_path_factory):
    truth, findings, _ = _simulate(tmp_path_factory, "p2p_disabled")
    assert ("nccl_transport", "intra_node") in _keys(findings)


@pytest.mark.parametrize(
    ("scenario", "kw"),
    [("collective_timeout", {}), ("collective_timeout", {"ranks": 16, "params": {"rank": "11"}}), ("xid79", {})],
    ids=["8r", "16r-rank11", "xid79"],
)
def test_collective_timeout_names_the_culprit_rank_host_and_gpu(tmp_path_factory, scenario, kw):
    truth, findings, _ = _simulate(tmp_path_factory, scenario, **kw)
    fault = next(f for f in truth["faults"] if f["kind"] == "collective_timeout")
    (f,) = [f for f in findings if f.detector == "nccl_timeout" and f.key.startswith("timeout")]
    assert list(f.ranks) == fault["ranks"]
    assert list(f.hosts) == fault["hosts"] and list(f.gpus) == fault["gpus"]
    assert f.metrics["seq"] == fault["expected"]["seq"]
