from __future__ import annotations

import shutil

from forensics.base.frames import JobFrames
from forensics.detectors import run_detectors
from forensics.facts.context import JobContext
from forensics.pipeline import analyze
from tests.conftest import shared_path
from tests.detectors.nccl_fixtures import HEALTHY, frames_from


def test_triggers_on_sockets_between_nodes_without_gdr_and_shm(run_detector, tmp_path):
    text = (HEALTHY.replace("[send] via NET/IB/1/GDRDMA", "[send] via NET/Socket/0")
            .replace("[receive] via NET/IB/1/GDRDMA", "[receive] via NET/Socket/0")
            .replace("[send] via NET/IB/0/GDRDMA", "[send] via NET/IB/0")
            .replace("2[0] -> 3[1] via P2P/CUMEM/read", "2[0] -> 3[1] via SHM/direct/direct"))
    findings, _ = run_detector(frames_from(tmp_path, text))
    by = {f.key: f for f in findings}
    assert set(by) == {"socket", "no_gdr", "intra_node"}
    # the socket connection 1 -> 2 is logged by rank 1 (sender, nodeA) and rank 2 (receiver, nodeB)
    assert by["socket"].ranks == (1, 2) and by["socket"].hosts == ("nodeA", "nodeB")
    assert by["socket"].gpus == ("0000:18:00.0", "0000:2a:00.0")
    assert by["no_gdr"].ranks == (3,) and by["no_gdr"].gpus == ("0000:2a:00.0",)
    assert by["intra_node"].ranks == (2,) and by["intra_node"].hosts == ("nodeB",)


def test_triggers_on_ib_retry_exceeded_with_meaning(run_detector, tmp_path):
    text = HEALTHY + (
        "\nnodeB:201:299 [1] transport/net_ib.cc:2121 NCCL WARN NET/IB : Got completion from peer 10.0.0.1<4242> "
        "with status=12 opcode=1 len=0 vendor err 129 (Send) localGid ::ffff:10.0.0.2 remoteGids ::ffff:10.0.0.1\n"
    )
    findings, _ = run_detectors(JobContext(frames_from(tmp_path, text)), only=["nccl_comm_failure"])
    (f,) = findings  # fabric errors are the communication-failure detector's (#28), no longer a transport finding
    assert f.ranks == (3,) and "retry counter exceeded" in f.summary
    assert f.metrics["peer_host"] == "nodeA" and f.hosts == ("nodeA", "nodeB")  # 10.0.0.1 is nodeA's OOB address
    assert not [g for g in run_detector(frames_from(tmp_path, text))[0] if g.key.startswith("fail_")]


def test_clean_healthy_two_node_job(run_detector, tmp_path):
    findings, skipped = run_detector(frames_from(tmp_path, HEALTHY))
    assert findings == [] and skipped == []


def test_skipped_without_nccl_logs(run_detector):
    findings, skipped = run_detector(JobFrames({}))
    assert findings == [] and "nccl_channels" in skipped[0].reason


def test_skipped_when_logs_have_no_transport_lines(run_detector, tmp_path):
    text = ("h:1:1 [0] NCCL INFO cudaDriverVersion 12040\nh:1:1 [0] NCCL INFO Init timings - ncclCommInitRank: rank 0 "
            "nranks 2 total 1.00 (kernels 0.1)\n")
    findings, skipped = run_detector(frames_from(tmp_path, text))
    assert findings == [] and "no transport" in skipped[0].reason


def test_clean_gdr0_on_a_socket_network_is_not_flagged_as_missing_gdr(run_detector, tmp_path):
    text = (
        "h:1:1 [0] NCCL INFO Using network Socket\n"
        "h:1:1 [0] NCCL INFO Connected all rings, use ring PXN 0 GDR 0\n"
    )
    findings, _ = run_detector(frames_from(tmp_path, text))
    assert not [f for f in findings if f.key == "no_gdr"]
    findings, _ = run_detector(frames_from(tmp_path, text.replace("Socket", "IB"), "ib.log"))
    assert [f.key for f in findings] == ["no_gdr"]


def test_triggers_on_nvls_off_single_nic_mixed_links_and_docker_bridge(run_detector, tmp_path):
    text = "".join(
        f"#  Rank {d} Group  0 Pid    100 on      gpu01 device  {d} [0x{0x18 + d:02x}] NVIDIA H100 80GB HBM3\n"
        for d in range(8)
    ) + (
        "gpu01:100:100 [0] NCCL INFO Bootstrap : Using docker0:172.17.0.1<0>\n"
        "gpu01:100:100 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/RoCE ; OOB docker0:172.17.0.1<0>\n"
        "gpu01:100:100 [0] NCCL INFO + NVL[480.0] - NVS/0\n"
        "gpu01:100:101 [0] NCCL INFO 16 coll channels, 16 collnet channels, 0 nvls channels, 16 p2p channels, 2 p2p "
        "channels per peer\n"
        "gpu02:200:200 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB ; OOB eth0:10.0.0.2<0>\n"
    )
    frames = frames_from(tmp_path, text)
    findings, _ = run_detector(frames)
    by = {f.key: f for f in findings}
    assert {"nvls_off", "iface", "mixed_link"} <= set(by)
    assert by["nvls_off"].hosts == ("gpu01",) and by["nvls_off"].gpus == ("0000:18:00.0",)
    assert "docker0" in by["iface"].summary
    assert "single_nic" not in by  # gpu01 has 2 NICs, gpu02 shows one GPU only


def test_clean_nvls_off_is_not_flagged_without_an_nvswitch(run_detector, tmp_path):
    text = ("#  Rank 0 Group  0 Pid    100 on      gpu01 device  0 [0x18] NVIDIA H100 PCIe\n"
            "gpu01:100:101 [0] NCCL INFO 2 coll channels, 2 collnet channels, 0 nvls channels, 2 p2p channels, 2 p2p "
            "channels per peer\n")
    findings, skipped = run_detector(frames_from(tmp_path, text))
    assert findings == [] and skipped == []


def test_triggers_on_efa_without_gdr(run_detector, tmp_path):
    from tests.test_nccl_log import EFA_227

    findings, _ = run_detector(frames_from(tmp_path, EFA_227))
    (f,) = [x for x in findings if x.key == "no_gdr"]
    assert f.ranks == (0,) and f.gpus == ("0000:38:00.0",) and f.hosts == ("n0",)


def _sample_findings(tmp_path, name):
    """nccl_transport's findings on one shared sample log, by key."""
    path = shared_path("nccl_logs", name)
    run = tmp_path / "run"
    run.mkdir(exist_ok=True)
    shutil.copy(path, run / path.name)
    return path, {f.key: f for f in analyze(run, only=["nccl_transport"], workers=1).findings}


def test_evidence_is_the_first_lines_in_file_order_every_time(tmp_path):
    # 12 intra-node NET connections on one node: the evidence (10 rows) must not depend on hashing
    name = "46_v2.7.6_single_node_a100_p2p_shm_disabled_intranode_over_ib_gdrdma.log"
    path, by = _sample_findings(tmp_path, name)
    net_lines = [n for n, line in enumerate(path.read_text().splitlines(), 1) if " via NET/" in line]
    assert len(net_lines) == 12
    for _ in range(3):
        _, by = _sample_findings(tmp_path, name)
        assert [e["line"] for e in by["intra_node"].evidence] == net_lines[:10]


def test_interface_sets_are_listed_by_host(tmp_path):
    _, by = _sample_findings(tmp_path, "08_v2.4_4node_32gpu_ib_single_hca_socket_virbr0_ring_p2p_ipc.log")
    summary = by["iface"].summary
    listed = summary.split("interface sets differ between hosts: ", 1)[1].rstrip(".").split("; ")
    assert [item.split("=")[0] for item in listed] == sorted(item.split("=")[0] for item in listed)
    assert len(listed) >= 2


def test_transport_switch_without_effect_is_reported_by_the_transport_detector_at_info(run_detector, tmp_path):
    # SHM off, but every intra-node pair of this job uses P2P: the switch changed nothing
    text = HEALTHY + "nodeA:100:110 [0] NCCL INFO NCCL_SHM_DISABLE set by environment to 1.\n"
    findings, _ = run_detector(frames_from(tmp_path, text))
    (f,) = findings
    assert f.key == "transport_env" and f.severity.value == "info"
    assert "NCCL_SHM_DISABLE=1" in f.summary and f.metrics["NCCL_SHM_DISABLE"] == "1"
    algo, _ = run_detectors(JobContext(frames_from(tmp_path, text, "b.log")), only=["nccl_algorithm"])
    assert algo == []  # not an algorithm choice


def test_transport_switch_with_its_effect_is_named_by_the_effect_once(run_detector, tmp_path):
    # P2P off on a node whose pair then goes through host memory: one finding names effect and cause
    text = (HEALTHY.replace("2[0] -> 3[1] via P2P/CUMEM/read", "2[0] -> 3[1] via SHM/direct/direct")
            .replace("0[0] -> 1[1] via P2P/CUMEM/read", "0[0] -> 1[1] via SHM/direct/direct")
            + "nodeA:100:110 [0] NCCL INFO NCCL_P2P_DISABLE set by environment to 1.\n")
    findings, _ = run_detector(frames_from(tmp_path, text))
    (f,) = findings
    assert f.key == "intra_node" and "NCCL_P2P_DISABLE=1" in f.summary
    assert f.summary.startswith("2 connection(s) via host shared memory")


def test_ib_switched_off_on_a_multi_node_job_warns_even_without_connection_lines(run_detector, tmp_path):
    text = "\n".join(line for line in HEALTHY.splitlines() if "Channel" not in line) + \
        "\nnodeA:100:110 [0] NCCL INFO NCCL_IB_DISABLE set by environment to 1.\n"
    findings, _ = run_detector(frames_from(tmp_path, text))
    env = next(f for f in findings if f.key == "transport_env")
    assert env.severity.value == "warning" and "NCCL_IB_DISABLE=1" in env.summary and "TCP sockets" in env.summary
