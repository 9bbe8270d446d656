"""#28 item 2: NCCL's immediate errors give one communication-failure finding (not a watchdog timeout) with the
reporting rank, the peer, the communicator and operation, anchored on the first error in time; real text first."""

from __future__ import annotations

import shutil
from datetime import datetime, timezone
from pathlib import Path

from forensics.detectors import run_detectors
from forensics.facts.context import JobContext
from forensics.pipeline import analyze
from tests import field_excerpts as fx
from tests.conftest import shared_path
from tests.detectors.nccl_fixtures import HEALTHY, frames_from


def _run(frames):
    return run_detectors(JobContext(frames), only=["nccl_comm_failure"])


def _shared(tmp_path: Path, name: str):
    run = tmp_path / "run"
    run.mkdir()
    path = shared_path("nccl_logs", name)
    shutil.copy(path, run / path.name)
    return analyze(run, workers=1)


def test_triggers_on_ofi_unresponsive_receiver_real_text(tmp_path):
    findings, _ = _run(frames_from(tmp_path, fx.OFI_UNRESPONSIVE))
    (f,) = findings
    m = f.metrics
    assert f.detector == "nccl_comm_failure" and f.severity.value == "critical"
    assert m["first_kind"] == "ofi_error" and m["reporting_rank"] == 0 and m["reporting_host"] == "llama-3-8b-node-0-0"
    assert m["peer"] == "fi_addr_efa://[fe80::454:14ff:fedd:d5b3]:0:825957744"  # `Peer host id: N/A` is no peer
    # `[2026-01-01 12:08:32]` in front of the envelope, read as UTC
    assert m["time_ns"] == int(datetime(2026, 1, 1, 12, 8, 32, tzinfo=timezone.utc).timestamp()) * 10**9
    assert m["nccl_result"] == "ncclRemoteError"  # the `-> 6` trail
    assert m["events"] == 2  # the OFI WARN line + the PyTorch C++ `NCCL error in:` line
    assert "security group" in f.remediation


def test_triggers_on_socket_closed_and_proxy_connect_failure_shared_04(tmp_path):
    a = _shared(tmp_path, "04_v2.18_2node_16rank_no_ib_net_socket_connection_closed.log")
    (f,) = [f for f in a.findings if f.detector == "nccl_comm_failure"]
    m = f.metrics
    # line 31 (`[Service thread] Error encountered progressing operation=Connect, res=2`) comes first in the file
    assert m["first_kind"] == "proxy_error" and m["operation"] == "Connect" and m["events"] == 3
    assert m["reporting_host"] == "<cluster_name>" and "ncclSystemError" in str(m["nccl_result"])  # the `-> 2` trail
    assert not [g for g in a.findings if g.detector == "nccl_timeout"]  # not a watchdog timeout


def test_ib_completion_errors_on_three_hosts_shared_02(tmp_path):
    a = _shared(tmp_path, "02_v2.18_h100_multinode_ib_wc_error4_vendor81_algo_ring.log")
    (f,) = [f for f in a.findings if f.detector == "nccl_comm_failure"]
    assert f.metrics["reporting_host"] == "H100-2"  # line 1: the first of the three in the file
    assert f.metrics["peer"] == "fe80::966d:ae03:8b:df78%ib0<53249>" and f.metrics["operation"] == "Send"
    assert "status 4 = local protection error" in f.summary
    assert set(f.hosts) == {"H100-1", "H100-2", "H100-5"} and f.metrics["events"] == 3


def test_first_error_in_time_from_launcher_timestamps_shared_18(tmp_path):
    a = _shared(tmp_path, "18_v2.4.2_mpirun_tagged_ib_local_catastrophic_error.log")
    (f,) = [f for f in a.findings if f.detector == "nccl_comm_failure"]
    # rank 12's async event is stamped 16:13:44.884Z, ranks 13 and 14 at .888Z; the verbs call failures follow
    assert f.metrics["reporting_rank"] == 12 and f.metrics["first_kind"] == "ib_async"
    assert f.metrics["time_ns"] == int(datetime(2019, 6, 2, 16, 13, 44, tzinfo=timezone.utc).timestamp()) * 10**9 \
        + 884_000_000
    assert f.ranks == (12, 13, 14)


def test_reset_by_a_peer_placed_by_the_net_connections_shared_19(tmp_path):
    a = _shared(tmp_path, "19_v2.10.3_2node_ib_gdrdma_socket_reset_cuda_illegal_memory_access.log")
    (f,) = [f for f in a.findings if f.detector == "nccl_comm_failure"]
    (cuda,) = [g for g in a.findings if g.detector == "nccl_timeout" and g.key == "cuda_failure"]
    assert f.metrics["first_kind"] == "net_recv_failed" and f.metrics["peer"] == "11.127.49.2<36048>"
    assert f.metrics["reporting_host"] == "A03-R28-I49-3-9000018"
    # the excerpt prints no address of either host, but the reporting host's only NET channel lines are
    # `4[a2000] -> 12[a2000] [receive] via NET/IB/2/GDRDMA` and their like: rank 4 is on A03-R28-I49-2-6000166
    # (its own P2P lines `5[a7000] -> 4[a2000]` are logged there), so the peer is that host, whose illegal
    # memory access killed it; one incident rooted at the CUDA failure (#28 item 2)
    assert f.metrics["peer_host"] == "A03-R28-I49-2-6000166" and f.metrics["peer_placed_by"] == "net"
    assert cuda.hosts == ("A03-R28-I49-2-6000166",)
    (inc,) = a.incidents
    assert inc.root_cause == cuda.id and set(inc.findings) == {cuda.id, f.id} and f.caused_by == (cuda.id,)


def test_a_peer_is_not_placed_when_the_net_connections_reach_several_hosts(tmp_path):
    lines = "".join(f"h{h}:1:2 [0] NCCL INFO Channel 00/0 : {src}[0] -> {dst}[0] [{d}] via NET/IB/0/GDRDMA\n"
                    for h, src, dst, d in ((1, 0, 8, "send"), (1, 16, 0, "receive"), (2, 8, 16, "send"),
                                           (3, 16, 0, "send")))
    text = lines + ("h1:1:3 [0] include/socket.h:428 NCCL WARN Net : Call to recv from 10.0.0.9<36048> failed : "
                    "Connection reset by peer\n")
    (f,), _ = _run(frames_from(tmp_path, text))
    assert f.metrics["first_kind"] == "net_recv_failed" and f.metrics["peer_host"] is None


def test_skipped_on_a_healthy_job(tmp_path):
    text = HEALTHY + ("nodeA:100:110 [0] NCCL INFO 2 coll channels, 0 nvls channels, 2 p2p channels, 2 p2p channels "
                      "per peer\n")
    findings, skipped = _run(frames_from(tmp_path, text))
    assert findings == [] and [s.detector for s in skipped] == ["nccl_comm_failure"]
    assert "no NCCL communication error" in skipped[0].reason


def test_clean_watchdog_timeouts_are_not_failures(tmp_path):
    a = _shared(tmp_path, "24_pytorch_blocking_wait_timeout_allreduce_h200.log")
    assert not [g for g in a.findings if g.detector == "nccl_comm_failure"]


def test_simulated_peer_exit_is_a_comm_failure_under_the_oom_kill(tmp_path):
    from forensics.simulate import simulate

    truth = simulate("peer_exit", tmp_path / "job", ranks=8, params={"layers": "2"})
    a = analyze(tmp_path / "job", workers=1)
    (f,) = [f for f in a.findings if f.detector == "nccl_comm_failure"]
    (oom,) = [f for f in a.findings if f.detector == "node_health"]
    (fault,) = [x for x in truth["faults"] if x["kind"] == "oom_kill"]
    assert not [g for g in a.findings if g.detector == "nccl_timeout"]  # no watchdog fired
    assert f.metrics["first_kind"] == "socket_closed" and f.metrics["reporting_rank"] != fault["ranks"][0]
    assert f.metrics["peer_host"] == fault["hosts"][0]  # the closed connection's address is the dead rank's node
    assert f.caused_by == (oom.id,) and truth["incidents"][0]["consequences"] == ["nccl_comm_failure"]


def test_the_failure_names_its_communicator_as_its_process_group(tmp_path):
    """The failing process's communicator (its commId from the init lines) is the finding's typed process group."""
    text = HEALTHY + ("nodeB:201:211 [1] misc/socket.cc:49 NCCL WARN socketProgress: Connection closed by remote peer "
                      "x<1>\n")
    (f,) = _run(frames_from(tmp_path, text))[0]
    assert f.process_group == "0xabc" and f.metrics["communicator"] == "0xabc (4 ranks)"
    assert f.to_json()["process_group"] == "0xabc"
    (g,) = _run(frames_from(tmp_path, "h:13:1 [3] misc/socket.cc:49 NCCL WARN socketProgress: Connection closed by "
                                      "remote peer x<1>\n"))[0]
    assert g.process_group is None  # no init line names its communicator


def test_job_log_17_the_logged_remote_error_and_the_error_rank_3_raised_for_it_are_one_incident(tmp_path):
    """Job log 17: NCCL's remote error (its `Last error:` NET/OFI line) and the DistBackendError rank 3 raised for it
    describe one failure; nothing in the file is earlier, so the communication failure is the root. Neither line
    carries a time, so the link is by place (rank 3) only, at low confidence, and says so."""
    name = "17_ddp_init_ncclRemoteError_net_ofi_undeliverable_rank3_then_rank2_traceback_nccl2.28.8.log"
    text = shared_path("job_logs", name).read_text()
    assert "[rank3]: torch.distributed.DistBackendError" in text and "remote process exited" in text
    run = tmp_path / "run"
    run.mkdir()
    shutil.copy(shared_path("job_logs", name), run / name)
    a = analyze(run, workers=1)
    by = {f.detector: f for f in a.findings}
    assert set(by) == {"nccl_comm_failure", "last_words"} and by["last_words"].kind == "nccl_raised"
    (inc,) = a.incidents
    assert inc.root_cause == by["nccl_comm_failure"].id and inc.ranks == (3,)
    (link,) = inc.links
    assert (link.rule, link.consequence, link.confidence) == ("comm_failure_raised_to_python", by["last_words"].id,
                                                              "low")
    assert link.basis.startswith("place only (rank)")


def test_pytorch_24_watchdog_wording_and_ncclgetlasterror_text_shared_job_log_18(tmp_path):
    # PyTorch 2.4+ says `Process group watchdog thread terminated with exception: NCCL error: remote process exited
    # or there was a network error, NCCL version 2.21.5` and prints NCCL's last error without its envelope
    # (`socketProgressOpt: Call to recv from 10.119.24.53<49901> failed : Broken pipe`); before #28 neither was
    # read and the real log gave no finding at all
    run = tmp_path / "run"
    run.mkdir()
    p = shared_path("job_logs", "18_k8s_worker_pod_rank5_ncclRemoteError_socket_broken_pipe_watchdog_nccl2.21.5.log")
    shutil.copy(p, run / p.name)
    (f,) = [f for f in analyze(run, workers=1).findings if f.detector == "nccl_comm_failure"]
    assert f.metrics["first_kind"] == "net_recv_failed" and f.metrics["peer"] == "10.119.24.53<49901>"
    assert f.metrics["nccl_result"] == "ncclRemoteError" and f.metrics["events"] == 2  # the socket + PyTorch's line
    assert f.ranks == (5,)
    # the bare socket line names no process: its reporter is the one rank of the failure's lines (PyTorch's
    # `[rank5]` exception it is printed under), placed on its host by NCCL's `comm ... rank 5 ... cudaDev 1` line
    assert (f.metrics["reporting_rank"], f.metrics["reporting_host"]) == (5, "pt-gbcg65vy-worker-0")
    assert f.hosts == ("pt-gbcg65vy-worker-0",)
    assert f.summary.startswith("First error: rank 5 on pt-gbcg65vy-worker-0, ") and "1 host(s)" in f.summary


def test_every_socket_wording_is_a_failure_with_its_peer(tmp_path):
    # NCCL <= 2.18 (`Net : Connect to` / `Call to recv from`, real: nccl#963) and 2.19+ (`socketStartConnect:`,
    # real: nccl-tests#166; `socketProgressOpt: Call to send to`, the wording of misc/socket.cc since 2.19)
    cases = [(fx.SOCKET_NET_218, "connect_failed", "172.17.0.2<40537>", 2),
             (fx.SOCKET_CONNECT_219, "connect_failed", "10.0.0.2<45763>", 1),
             ("h:1:2 [0] misc/socket.cc:46 NCCL WARN socketProgressOpt: Call to send to 10.0.0.3<52905> failed : "
              "Connection reset by peer\n", "net_recv_failed", "10.0.0.3<52905>", 1)]
    for i, (text, kind, peer, events) in enumerate(cases):
        (tmp_path / str(i)).mkdir()
        (f,), _ = _run(frames_from(tmp_path / str(i), text))
        assert (f.metrics["first_kind"], f.metrics["peer"], f.metrics["events"]) == (kind, peer, events), text
