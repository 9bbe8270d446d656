"""FLAG and OK facts of ../shared/sample_data/nccl_logs/SOURCES.md, one test per file.

Each test parses one real excerpt, runs the three NCCL detectors and checks that what SOURCES.md marks
FLAG is raised (with the hosts/ranks it names) and what it marks OK is not.
"""

from __future__ import annotations

import re

import pytest
from forensics.parsers.nccl_log import parse
from forensics.parsers.result import ParseContext

from forensics.base.frames import JobFrames
from forensics.detectors import run_detectors
from forensics.facts.context import JobContext
from tests.conftest import shared_path

NCCL = ["nccl_transport", "nccl_algorithm", "nccl_timeout", "nccl_comm_failure"]


def run(prefix: str):
    folder = shared_path("nccl_logs")
    path = next(folder.glob(prefix + "_*.log"))
    res = parse(path, ParseContext(folder, path.name))
    findings, skipped = run_detectors(JobContext(JobFrames(res.frames)), only=NCCL)
    return {(f.detector, f.key.split(":")[0]): f for f in findings}, skipped


def test_02_ib_completion_error_4_on_three_hosts():
    f, _ = run("02")
    ib = f[("nccl_comm_failure", "comm_failure")]  # #28: fabric errors are a communication failure
    assert ib.hosts == ("H100-1", "H100-2", "H100-5") and ib.metrics["first_kind"] == "ib_completion"
    assert "status 4 = local protection" in ib.summary


def test_04_socket_between_nodes_and_connect_failure_of_rank_11():
    f, _ = run("04")
    assert ("nccl_transport", "socket") in f
    fail = f[("nccl_comm_failure", "comm_failure")]
    assert 11 in fail.ranks and fail.metrics["first_kind"] == "proxy_error" and fail.metrics["events"] == 3
    # OK: intra-node P2P/IPC/read is healthy
    assert ("nccl_transport", "intra_node") not in f


def test_05_single_roce_nic_for_8_gpus_gdr_ok():
    f, _ = run("05")
    nic = f[("nccl_transport", "single_nic")]
    assert set(nic.hosts) == {"nodea", "nodeb"}
    assert nic.metrics["max_gpus_per_nic"] == 8  # 16 ranks (threadThresholds 128/8) on 2 nodes
    assert ("nccl_transport", "no_gdr") not in f


def test_07_gdrdma_shared_not_flagged():
    f, _ = run("07")
    assert not any(k[0] == "nccl_transport" for k in f)


def test_08_virbr0_inconsistent_interfaces_and_single_hca():
    f, _ = run("08")
    iface = f[("nccl_transport", "iface")]
    assert "virbr0" in iface.summary and iface.metrics["inconsistent_across_hosts"] is True
    assert "server3" in f[("nccl_transport", "single_nic")].hosts


def test_09_no_intranode_p2p():
    f, _ = run("09")
    assert f[("nccl_transport", "intra_node")].hosts == ("deepseek",)


def test_10_p2p_direct_pointer_gdr1_ok():
    f, _ = run("10")
    assert f == {}


def test_11_measured_38x_prediction_and_busbw_cliff_gdr_ok():
    f, _ = run("11")
    gap = f[("nccl_algorithm", "model_gap")]
    assert gap.metrics["worst_bytes"] == 8589934592
    assert gap.metrics["worst_ratio"] == pytest.approx(3300068 / 86069.968750, rel=0.01)
    # NCCL's model assumed 2*23/24 x 8 GiB / 86 070 us = 191.4 GB/s bus bandwidth (nranks 24 from the init line)
    assert gap.metrics["predicted_busbw_gbps"] == pytest.approx(2 * 23 / 24 * 8589934592 / 86069.968750e3, abs=0.1)
    cliff = f[("nccl_algorithm", "busbw_cliff")]
    assert (cliff.metrics["from_gbps"], cliff.metrics["to_gbps"], cliff.metrics["at_bytes"]) == (29.50, 5.27, 67108864)
    assert ("nccl_transport", "no_gdr") not in f and ("nccl_algorithm", "forced") not in f


def test_13_libibverbs_missing_and_tunnel_interface():
    f, _ = run("13")
    # #28 item 1: one node (ranks 0 and 1 of a 2-rank ring in one process): the network carries nothing, so
    # neither the missing libibverbs nor the tunnel interface in the socket list is a finding
    assert ("nccl_transport", "no_libibverbs") not in f and ("nccl_transport", "iface") not in f
    assert ("nccl_transport", "socket") not in f


def test_15_forced_tree_socket_shm_accept_failed():
    f, _ = run("15")
    # #28 item 1: the communicator never came up (Accept failed), so no collective ran under NCCL_ALGO=Tree: said,
    # at information, not a cause
    algo = f[("nccl_algorithm", "forced")]
    assert "NCCL_ALGO=Tree" in algo.summary and algo.severity.value == "info" and algo.kind == "algorithm_setting"
    assert ("nccl_transport", "socket") in f
    assert ("nccl_transport", "intra_node") in f
    assert "Accept failed" in str(f[("nccl_comm_failure", "comm_failure")].evidence)


def test_16_forced_ring_and_mixed_gpus():
    f, _ = run("16")
    # the nccl-tests table has no row: no collective is known to have run under NCCL_ALGO=RING (#28 item 1)
    algo = f[("nccl_algorithm", "forced")]
    assert "NCCL_ALGO=RING" in algo.summary and algo.severity.value == "info" and algo.kind == "algorithm_setting"
    mixed = f[("nccl_algorithm", "mixed_gpus")]
    assert set(mixed.hosts) == {"manolinux", "manolinux1"}


def test_18_local_catastrophic_error_on_one_host_ranks_12_to_14():
    f, _ = run("18")
    ev = f[("nccl_comm_failure", "comm_failure")]
    assert ev.ranks == (12, 13, 14) and len(ev.hosts) == 1 and ev.metrics["first_kind"] == "ib_async"
    assert "local catastrophic error" in str(ev.evidence)


def test_19_cuda_failure_is_the_cause_socket_reset_secondary_gdr_ok():
    f, _ = run("19")
    cuda = f[("nccl_timeout", "cuda_failure")]
    assert cuda.hosts == ("A03-R28-I49-2-6000166",) and cuda.ranks == (1,)
    # the reporting host and the peer its NET connections lead to (#28: the peer placed, so the incident joins)
    assert f[("nccl_comm_failure", "comm_failure")].hosts == ("A03-R28-I49-2-6000166", "A03-R28-I49-3-9000018")
    assert ("nccl_transport", "no_gdr") not in f and ("nccl_transport", "intra_node") not in f


def test_20_desync_broadcast_vs_allreduce():
    f, _ = run("20")
    d = f[("nccl_timeout", "desync")]
    assert "BROADCAST" in d.summary and "ALLREDUCE" in d.summary and set(d.ranks) <= {3, 7}


def test_22_hung_seven_hours():
    f, _ = run("22")
    t = f[("nccl_timeout", "timeout")]
    assert t.metrics["ran_over_timeout"] == pytest.approx(25625613 / 1800000, rel=0.01)
    assert set(t.ranks) == {0, 7}


def test_24_four_ranks_time_out_on_seq_2521():
    f, _ = run("24")
    t = f[("nccl_timeout", "timeout")]
    assert t.ranks == (1, 3, 5, 7) and t.metrics["seq"] == 2521


def test_25_27_coll_lines_raise_nothing():
    for prefix in ("25", "27"):
        f, _ = run(prefix)
        assert f == {}


def test_28_socket_over_tunnel_and_veth():
    f, _ = run("28")
    assert ("nccl_transport", "socket") in f  # 2 hosts in the nccl-tests device list
    s = f[("nccl_transport", "iface")].summary
    assert "ip6tnl0" in s and "veth0" in s


def test_33_forced_ll128_data_corruption():
    f, _ = run("33")
    w = f[("nccl_algorithm", "wrong_results")]
    assert "NCCL_PROTO=LL128" in w.summary and "2 FAILED" in w.summary
    # a transport switch is the transport's business: two nodes with IB off talk over TCP sockets
    forced = f[("nccl_algorithm", "forced")]
    assert "NCCL_IB_DISABLE" not in forced.summary
    # the 8 MiB all-reduce rows ran under NCCL_PROTO=LL128: a forced choice of this run (#28 item 1)
    assert forced.kind == "forced_algorithm" and forced.severity.value == "warning"
    assert "collectives ran under it (AllReduce; nccl-tests rows)" in forced.summary
    env = f[("nccl_transport", "transport_env")]
    assert "NCCL_IB_DISABLE=1" in env.summary and env.severity.value == "warning"
    assert "NCCL_PROTO" not in env.summary


def test_36_roce_gdrdma_ok():
    f, _ = run("36")
    assert f == {}


def test_37_single_node_table_raises_no_nccl_flag():
    f, _ = run("37")
    assert not any(k[0] == "nccl_transport" for k in f)


def test_39_rank_118_timeout_despite_ras_ok():
    f, _ = run("39")
    t = f[("nccl_timeout", "timeout")]
    assert t.ranks == (118,) and "RAS reported every communicator OK" in t.summary
    assert ("nccl_timeout", "ras") not in f


def test_40_ras_incomplete_outlier_node():
    f, _ = run("40")
    r = f[("nccl_timeout", "ras")]
    assert r.hosts == ("10.4.109.13",) and "INCOMPLETE" in r.summary


def test_42_pg_status_rank_5():
    f, _ = run("42")
    t = f[("nccl_timeout", "timeout")]
    assert t.ranks == (5,) and "stuck inside" in t.summary


def test_44_single_roce_vf_shared_by_the_pod():
    f, _ = run("44")
    assert ("nccl_transport", "single_nic") in f


def test_46_p2p_shm_disabled_traffic_through_ib():
    f, _ = run("46")
    intra = f[("nccl_transport", "intra_node")]
    assert intra.ranks == (0, 1, 2, 3) and intra.metrics["intra_node_net_connections"] == 12
    assert "NCCL_P2P_DISABLE=1" in intra.summary and "NCCL_SHM_DISABLE=1" in intra.summary
    assert ("nccl_algorithm", "forced") not in f  # transport switches are not algorithm choices
    assert ("nccl_transport", "no_gdr") not in f
    # NCCL_NET_GDR_LEVEL=4 (legacy SYS, the widest) restricts nothing; P2P/SHM off are intra_node's cause
    assert ("nccl_transport", "transport_env") not in f


def test_13_p2p_disabled_by_environment_is_a_transport_fact():
    f, _ = run("13")
    env = f[("nccl_transport", "transport_env")]
    # SOURCES: INFO; single node, no connection lines to show what it cost
    assert env.severity.value == "info" and "NCCL_P2P_DISABLE=1" in env.summary and "NCCL_P2P_LEVEL=LOC" in env.summary
    assert ("nccl_algorithm", "forced") not in f


@pytest.mark.parametrize("prefix", ["04", "09", "13", "15", "28", "33", "46"])
def test_no_message_counts_zero_of_what_it_reports(prefix):
    # "0 inter-node connection(s) use NET/Socket" at critical contradicts itself
    f, _ = run(prefix)
    assert [det for det, _ in f if det in ("nccl_transport", "nccl_algorithm")]
    for (det, _key), x in f.items():
        if det in ("nccl_transport", "nccl_algorithm"):
            assert not re.search(r"(?<![\d.])0 [\w/ -]*?(connection|HCA|pair|ring)", x.summary), x.summary


def test_47_gdr_disabled_on_socket_nics_is_normal():
    f, _ = run("47")
    assert f == {}


@pytest.mark.parametrize("prefix", ["30"])
def test_30_old_tuning_table_is_parsed_not_flagged(prefix):
    f, skipped = run(prefix)
    assert f == {}


def test_11_busbw_far_below_a_user_supplied_hardware_peak():
    from forensics.detectors import run_detectors as rd

    folder = shared_path("nccl_logs")
    path = next(folder.glob("11_*.log"))
    res = parse(path, ParseContext(folder, path.name))
    findings, _ = rd(JobContext(JobFrames(res.frames)), {"nccl_algorithm": {"expected_busbw_gbps": "190"}},
                     only=["nccl_algorithm"])
    (f,) = [x for x in findings if x.key == "busbw_peak"]
    # #28: judged at the sizes that reach bus bandwidth (>= 128 MiB): the 512 MiB in-place row, not the 29.50
    # GB/s of the 32 MiB row before the collapse
    assert f.metrics["peak_busbw_gbps"] == 5.33
