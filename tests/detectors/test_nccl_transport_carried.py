"""#28 item 1: transport findings judged on the connections that carried traffic. A single-node job never gets a
network finding, whatever NCCL printed about its NICs at init; NIC facts count only for the NICs NET channels use."""

from __future__ import annotations

import shutil
from pathlib import Path

from forensics.detectors import run_detectors
from forensics.facts.context import JobContext
from forensics.pipeline import analyze
from tests.conftest import shared_path
from tests.detectors.nccl_fixtures import HEALTHY, frames_from

NETWORK_KEYS = {"socket", "no_gdr", "single_nic", "iface", "no_libibverbs", "mixed_link"}


def _shared(tmp_path: Path, name: str):
    run = tmp_path / "run"
    run.mkdir(parents=True)
    path = shared_path("nccl_logs", name)
    shutil.copy(path, run / path.name)
    return analyze(run, workers=1)


def _keys(findings) -> set[str]:
    return {f.key for f in findings if f.detector == "nccl_transport"}


def test_single_node_jobs_in_the_shared_samples_get_no_network_finding(tmp_path):
    # 13_: 2 T4 of one process (ranks 0, 1; ring `0 1`): tunl0 in the socket list, no libibverbs
    a = _shared(tmp_path / "a", "13_v2.8.3_t4_p2p_disabled_level_loc_socket_single_node.log")
    assert not _keys(a.findings) & NETWORK_KEYS and _keys(a.findings) == {"transport_env"}
    # 47_: `NET/Socket : GPU Direct RDMA Disabled for HCA` on lan2-lan5 of a 4-GPU NVSwitch node
    b = _shared(tmp_path / "b", "47_4gpu_socket_gdr_disabled_for_socket_nics_topology_dump_nvswitch.log")
    assert not _keys(b.findings) & NETWORK_KEYS


def test_multi_node_samples_keep_their_nic_findings(tmp_path):
    for i, name in enumerate(("05_v2.10.3_a800_2node_16gpu_roce_single_nic_gdrdma_p2p_direct_read.log",
                              "08_v2.4_4node_32gpu_ib_single_hca_socket_virbr0_ring_p2p_ipc.log",
                              "44_v2.18.1_h100_2x8_single_roce_vf_ibext_unhandled_system_error.log")):
        assert "single_nic" in _keys(_shared(tmp_path / str(i), name).findings), name


# one node, 2 GPUs, healthy: NCCL lists the node's HCAs and says GDR is off for one, every channel is P2P
SINGLE_NODE = """\
node1:100:100 [0] NCCL INFO NCCL version 2.21.5+cuda12.4
node1:100:100 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB [RO]; OOB eth0:10.0.0.1<0>
node1:100:100 [0] NCCL INFO NET/IB : GPU Direct RDMA Disabled for HCA 1 'mlx5_1'
node1:100:100 [0] NCCL INFO Bootstrap : Using docker0:172.17.0.1<0>
node1:100:110 [0] NCCL INFO ncclCommInitRank comm 0x1 rank 0 nranks 2 cudaDev 0 nvmlDev 0 busId 18000 commId 0xabc - Init COMPLETE
node1:101:111 [1] NCCL INFO ncclCommInitRank comm 0x2 rank 1 nranks 2 cudaDev 1 nvmlDev 1 busId 2a000 commId 0xabc - Init COMPLETE
node1:100:110 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read
node1:101:111 [1] NCCL INFO Channel 00/0 : 1[1] -> 0[0] via P2P/CUMEM/read
"""  # noqa: E501 -- verbatim log lines (test data)


def _transport(tmp_path, text):
    return run_detectors(JobContext(frames_from(tmp_path, text)), only=["nccl_transport"])[0]


def test_clean_single_node_job_with_nic_init_lines(tmp_path):
    assert _transport(tmp_path, SINGLE_NODE) == []


def test_gdr_disabled_counts_only_on_the_nic_a_net_channel_uses(tmp_path):
    # HEALTHY's NET channels use NICs 0 and 1 of both nodes with GDRDMA; GDR disabled on NIC 1 of nodeB counts,
    # on an unused NIC 2 it does not
    used = HEALTHY + "nodeB:200:200 [0] NCCL INFO NET/IB : GPU Direct RDMA Disabled for HCA 1 'mlx5_1'\n"
    unused = HEALTHY + "nodeB:200:200 [0] NCCL INFO NET/IB : GPU Direct RDMA Disabled for HCA 2 'mlx5_2'\n"
    (tmp_path / "u").mkdir()
    (f,) = _transport(tmp_path / "u", used)
    assert f.key == "no_gdr" and f.hosts == ("nodeB",) and f.metrics["hca_gdr_disabled"] == 1
    (tmp_path / "n").mkdir()
    assert _transport(tmp_path / "n", unused) == []
