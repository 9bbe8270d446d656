"""slow_link: the host (and NIC) common to every slow communicator, named once; innocent partners never."""

from __future__ import annotations

import pytest

from forensics.base.frames import JobFrames
from forensics.detectors.slow_link import _localised_words, _SlowLinks, _Suspect, _unlocalised_words
from tests.detectors.slow_link_jobs import GPUS, hsdp_groups, hsdp_job
from tests.frame_builders import dp_job, link_job


def _groups_through(slow_nics: set[tuple[int, int]]) -> set[str]:
    """The communicators whose traffic crosses a slow NIC (the builder's own rule, restated)."""
    return {name for name, _, members in hsdp_groups() if any((m // GPUS, m % GPUS) in slow_nics for m in members)}


def test_triggers_on_a_slow_node_of_a_4_node_hsdp_job_naming_only_that_node(run_detector):
    # Every NIC of node 1 slow: its shard group (nodes 0+1) and its replicate groups (node 1 with node 3)
    # are slow. Node 0 and node 3 are each in some slow groups, node 1 in all of them.
    node = 1
    slow_nics = {(node, g) for g in range(GPUS)}
    found, skipped = run_detector(hsdp_job(slow_nics=slow_nics))
    assert skipped == []
    assert [(f.hosts, f.ranks, f.severity.value) for f in found] == [
        ((f"node{node}",), tuple(range(8 * node, 8 * node + 8)), "warning")]
    f = found[0]
    expected = _groups_through(slow_nics)
    assert expected == {"shard0"} | {f"rep{i}" for i in range(8, 16)}
    assert {e["pg"].split("|")[0] for e in f.evidence} == expected
    assert f.metrics["slow_groups"] == len(expected) and f.metrics["level"] == "host"
    # A rank's traffic goes through its own rail, and the rails differ between slow groups: no single NIC.
    assert f.metrics["nic"] is None
    # Every slow group moves data 3x slower than the fast one of its kind (the builder's factor).
    assert [e["ratio"] for e in f.evidence] == [pytest.approx(3.0, rel=0.01)] * len(expected)


@pytest.mark.parametrize("node,local", [(1, 3), (2, 6)])
def test_triggers_on_one_slow_nic_naming_its_host_rank_and_nic(run_detector, node, local):
    found, _ = run_detector(hsdp_job(slow_nics={(node, local)}))
    rank = 8 * node + local
    assert [(f.hosts, f.ranks, f.metrics["nic"], f.metrics["level"]) for f in found] == [
        ((f"node{node}",), (rank,), f"mlx5_{local}:1", "rank")]
    assert {e["pg"].split("|")[0] for e in found[0].evidence} == _groups_through({(node, local)})
    assert f"mlx5_{local}:1" in found[0].title and f"node{node}" in found[0].title


def test_triggers_on_one_slow_nic_without_nccl_logs_naming_host_and_rank_only(run_detector):
    found, _ = run_detector(hsdp_job(slow_nics={(1, 3)}, nccl_logs=False))
    assert [(f.hosts, f.ranks, f.metrics["nic"]) for f in found] == [(("node1",), (11,), None)]


def test_triggers_info_without_naming_a_host_when_slow_groups_share_none(run_detector):
    # Two unrelated slow replicate groups: rep3 = {3, 19} (nodes 0, 2) and rep12 = {12, 28} (nodes 1, 3).
    found, _ = run_detector(hsdp_job(slow_groups={"rep3", "rep12"}))
    assert [(f.severity.value, f.hosts, f.ranks, f.metrics["level"]) for f in found] == [("info", (), (), "none")]
    assert {e["pg"].split("|")[0] for e in found[0].evidence} == {"rep3", "rep12"}


def test_triggers_on_the_link_job_naming_the_node_common_to_all_slow_groups(run_detector):
    found, _ = run_detector(link_job(slow_node=2, factor=3.0))
    assert [(f.hosts, f.ranks) for f in found] == [(("node2",), tuple(range(16, 24)))]
    # 16 of the 32 groups contain a node-2 rank; their transfers take 3 ms instead of 1 ms.
    assert found[0].metrics["slow_groups"] == 16 and found[0].metrics["max_transfer_ratio"] == 3.0


def test_clean_hsdp_and_link_jobs_have_no_slow_link(run_detector):
    assert run_detector(hsdp_job()) == ([], [])
    assert run_detector(link_job(slow_node=None)) == ([], [])


def test_clean_a_slow_group_below_the_ratio_is_not_slow(run_detector):
    # 20% slower is under the default 1.3x.
    assert run_detector(hsdp_job(slow_nics={(1, g) for g in range(GPUS)}, factor=1.2)) == ([], [])


def test_skipped_without_kernels_or_on_one_host(run_detector):
    _, skipped = run_detector(JobFrames({}))
    assert [s.detector for s in skipped] == ["slow_link"] and "kernels" in skipped[0].reason
    one_host, _ = dp_job(n_ranks=8, steps=2)
    _, skipped = run_detector(one_host)
    assert "one host" in skipped[0].reason
    # 16 ranks on two hosts in one DP group: nothing comparable to it.
    two_hosts, _ = dp_job(n_ranks=16, steps=2)
    _, skipped = run_detector(two_hosts)
    assert "comparable" in skipped[0].reason


def _links(suspect):
    return _SlowLinks(slow_groups=3, normal_groups=5, max_ratio=2.345, saving_ns=4e6, frac=0.04, gpu_ns=1e9,
                      evidence=(), suspect=suspect)


def test_words_are_read_from_the_record_alone():
    # The slow communicators share ranks on the host (one rail): those ranks and their NIC are named.
    rail = _Suspect("node3", (25, 26), rank_level=True, nics=("mlx5_1:1",), normal_through=1)
    title, summary = _localised_words(_links(rail), rail)
    assert title == "Slow network on NIC mlx5_1:1 on host node3: every slow communicator goes through it"
    assert summary.startswith("3 communicator(s) move data up to 2.35x slower than comparable ones; NIC mlx5_1:1 on "
                              "host node3 (rank(s) 25, 26) is the one host in all of them, and in 1 of the 5 normal")
    assert summary.endswith("about 4.0% of the step.")
    # Only the host is shared and no NIC is known: the host and how many of its ranks.
    host = _Suspect("node3", (24, 25, 26), rank_level=False, nics=(), normal_through=0)
    title, summary = _localised_words(_links(host), host)
    assert title.startswith("Slow network on host node3:") and "(3 rank(s))" in summary
    title, summary = _unlocalised_words(_links(None))
    assert title == "3 slow communicator(s) with no host in common" and "2.35x" in summary and "node" not in summary
