"""The simulator's deaths (forensics/simulate/lastwords.py) against their truth: the first failure is the root
with the time torchrun recorded, the application's Xid joins its CUDA error, a time limit costs the work since
the checkpoint and nothing after it is a fault."""

from __future__ import annotations

from forensics.pipeline import analyze
from forensics.simulate import simulate


def _root(a):
    by_id = {f.id: f for f in a.findings}
    return a.incidents[0], by_id[a.incidents[0].root_cause], by_id


def test_cuda_oom_root_has_the_launchers_time_host_and_the_numbers(tmp_path):
    truth = simulate("cuda_oom", tmp_path / "r", seed=0)
    inc, root, by_id = _root(analyze(tmp_path / "r", workers=1))
    lw = truth["last_words"]
    assert (root.detector, root.ranks, root.hosts) == ("last_words", (lw["rank"],), (lw["host"],))
    assert root.metrics["fault_wall_ns"] == lw["wall_ns"] and root.metrics["time_from"] == "launcher"
    assert root.metrics["oom_requested_bytes"] == 4 * 2**30 and "expandable_segments" in root.remediation
    timeouts = [by_id[f] for f in inc.findings if by_id[f].detector == "nccl_timeout"]
    assert timeouts and all(root.id in t.caused_by for t in timeouts)
    assert inc.verdict.startswith("Job died at ") and f"(rank {lw['rank']})" in inc.verdict


def test_illegal_address_and_its_xid_31_are_one_incident_rooted_in_the_code(tmp_path):
    truth = simulate("illegal_address", tmp_path / "r", seed=0)
    inc, root, by_id = _root(analyze(tmp_path / "r", workers=1))
    xids = [by_id[f] for f in inc.findings if by_id[f].detector == "gpu_hw_error"]
    assert [x.metrics.get("root_xid") for x in xids] == [31]
    assert root.metrics["cls"] == "illegal_address" and root.ranks == (truth["last_words"]["rank"],)
    assert "Fix the code" in root.remediation and "drain" not in inc.verdict.split("Do:")[1].split(".")[0]
    assert "/job/kernels/fused_rope.py:41 in apply_rope" in root.remediation


def test_time_limit_costs_the_work_since_the_checkpoint(tmp_path):
    truth = simulate("time_limit", tmp_path / "r", seed=0)
    a = analyze(tmp_path / "r", workers=1)
    inc, root, _ = _root(a)
    lw = truth["last_words"]
    gpus = truth["job"]["world_size"]
    assert root.key == "scheduler:time_limit" and root.metrics["time_ns"] == lw["wall_ns"]
    assert inc.gpu_hours_lost == round(gpus * (lw["wall_ns"] - lw["checkpoint_wall_ns"]) / 1e9 / 3600, 6)
    assert not [f for f in a.findings if f.detector in ("nccl_timeout", "gpu_hw_error", "node_health")]


def test_dataloader_hang_names_the_rank_in_its_data_loader(tmp_path):
    truth = simulate("dataloader_hang", tmp_path / "r", seed=0)
    inc, root, by_id = _root(analyze(tmp_path / "r", workers=1))
    assert root.key == "stacks" and root.ranks == (truth["last_words"]["rank"],) and root.metrics["where"] == "data_loader"
    assert any(by_id[f].detector == "nccl_timeout" for f in inc.findings)
