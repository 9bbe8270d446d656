"""The NCCL log parser on every real excerpt in ../shared/sample_data/nccl_logs/.

Expected figures were counted with grep on the files (see the comment per column), not taken from
the parser's output.
"""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

import polars as pl
import pytest
from forensics.parsers.nccl_log import parse
from forensics.parsers.result import ParseContext

from forensics.base import frames as fr
from tests.conftest import shared_path

# prefix: (wc -l, grep -cE 'host:pid:tid [d] .*NCCL (INFO|WARN)|^\[d\] NCCL' + bare `NCCL version x+cuda` banners,
#          grep -c ' via ', grep -c 'via NET/Socket', grep -c '/GDRDMA', grep -c 'via SHM',
#          grep -cE 'Init (START|COMPLETE)', grep -c 'set by environment', grep -c 'Bytes -> Algo',
#          grep -cE 'NCCL INFO (AllReduce|Send|Recv): opCount')
COUNTS = {
    "02": (12, 10, 0, 0, 0, 0, 0, 0, 0, 0),
    "04": (35, 31, 23, 6, 0, 0, 0, 0, 0, 0),
    "05": (33, 31, 12, 0, 2, 0, 0, 2, 0, 0),
    "07": (10, 10, 10, 0, 10, 0, 0, 0, 0, 0),
    "08": (36, 35, 19, 0, 0, 0, 0, 0, 0, 0),
    "09": (29, 28, 0, 0, 0, 0, 1, 0, 0, 0),
    "10": (15, 14, 9, 0, 0, 0, 0, 0, 0, 0),
    "11": (71, 48, 12, 0, 12, 0, 1, 0, 30, 0),
    "13": (16, 9, 0, 0, 0, 0, 0, 1, 0, 0),
    "15": (36, 34, 15, 8, 0, 7, 0, 1, 0, 0),
    "16": (29, 18, 0, 0, 0, 0, 2, 2, 0, 0),
    "18": (11, 6, 0, 0, 0, 0, 0, 0, 0, 0),
    "19": (32, 25, 12, 0, 2, 0, 0, 0, 0, 0),
    "20": (3, 0, 0, 0, 0, 0, 0, 0, 0, 0),
    "22": (5, 0, 0, 0, 0, 0, 0, 0, 0, 0),
    "24": (7, 0, 0, 0, 0, 0, 0, 0, 0, 0),
    "25": (4, 4, 0, 0, 0, 0, 0, 0, 0, 4),
    "27": (10, 7, 0, 0, 0, 0, 0, 0, 0, 7),
    "28": (10, 5, 0, 0, 0, 0, 0, 0, 0, 0),
    "30": (3, 3, 0, 0, 0, 0, 0, 0, 0, 0),
    "33": (13, 1, 0, 0, 0, 0, 0, 0, 0, 0),
    "36": (18, 17, 7, 0, 6, 0, 1, 0, 0, 0),
    "37": (18, 6, 0, 0, 0, 0, 3, 0, 0, 0),
    "39": (25, 0, 0, 0, 0, 0, 0, 0, 0, 0),
    "40": (38, 0, 0, 0, 0, 0, 0, 0, 0, 0),
    "42": (6, 0, 0, 0, 0, 0, 0, 0, 0, 0),
    "44": (19, 18, 0, 0, 0, 0, 0, 4, 0, 0),
    "46": (14, 12, 12, 0, 12, 0, 0, 0, 0, 0),
    "47": (16, 16, 0, 0, 0, 0, 0, 0, 0, 0),
}


def _file(prefix: str) -> Path:
    folder = shared_path("nccl_logs")
    return next(folder.glob(prefix + "_*.log"))


def _parse(prefix: str):
    path = _file(prefix)
    return parse(path, ParseContext(path.parent, path.name))


def test_every_sample_file_is_listed():
    folder = shared_path("nccl_logs")
    assert sorted(p.name[:2] for p in folder.glob("*.log")) == sorted(COUNTS)


@pytest.mark.parametrize("prefix", sorted(COUNTS))
def test_file_parses_with_every_line_explained(prefix):
    res = _parse(prefix)
    assert res.status == "ok", res.message
    f = res.frames["nccl_files"].row(0, named=True)
    lines, nccl, via, sock, gdr, shm, init, env, tuning, coll = COUNTS[prefix]
    assert f["nccl_unknown"] == 0, f["unknown_sample"]
    assert f["lines"] == lines
    assert f["nccl_lines"] == nccl
    assert f["nccl_lines"] + f["nccl_tests_lines"] + f["pytorch_lines"] + f["ras_lines"] + f["other_lines"] == lines
    ch = res.frames["nccl_channels"]
    assert ch.height == via
    assert ch.filter(pl.col("net") == "Socket").height == sock
    assert ch.filter(pl.col("gdr").fill_null(False)).height == gdr
    assert ch.filter(pl.col("transport") == "SHM").height == shm
    assert res.frames["nccl_comms"].filter(pl.col("origin") == "init").height == init
    assert res.frames["nccl_env"].filter(pl.col("origin") == "nccl").height == env
    calls = res.frames["nccl_calls"]
    assert calls.filter(pl.col("kind") == "tuning").height == tuning
    assert calls.filter(pl.col("kind") == "coll").height == coll
    for name, df in res.frames.items():
        assert df.schema == fr.schema(name), name
    assert "0 not understood" in res.message


def test_versions_from_banners():
    # banner lines: 2.10.3 (05_), 2.8.3 (13_), 2.19.3 (16_), 2.5.6 (28_), RAS 2.26.2 (39_), 2.27.3 (40_)
    for prefix, ver in (("05", "2.10.3"), ("13", "2.8.3"), ("16", "2.19.3"), ("28", "2.5.6"), ("39", "2.26.2"),
                        ("40", "2.27.3")):
        assert _parse(prefix).frames["nccl_files"]["nccl_version"][0] == ver


def test_init_line_2_22_fields():
    # 11_: ncclCommInitRank comm 0x561097745b80 rank 0 nranks 24 cudaDev 0 nvmlDev 0 busId a4000 commId
    # 0x1d39176440db4936
    row = _parse("11").frames["nccl_comms"].row(0, named=True)
    assert (row["rank"], row["nranks"], row["cuda_dev"], row["nvml_dev"]) == (0, 24, 0, 0)
    assert row["bus_id"] == "0000:a4:00.0" and row["comm_id"] == "0x1d39176440db4936"
    assert row["func"] == "ncclCommInitRank" and row["host"] == "h100clust-worker-1" and row["pid"] == 497888


def test_host_stripped_lines_and_init_timings():
    res = _parse("37")
    comms = res.frames["nccl_comms"]
    assert sorted(comms["rank"].to_list()) == [2, 3, 4]
    assert comms["host"].null_count() == 3
    t = res.frames["nccl_events"].filter(pl.col("kind") == "init_timings")
    assert t["value"].to_list() == [3.03, 3.03, 3.03]


def test_transport_details_busid_and_index_brackets():
    ch = _parse("05").frames["nccl_channels"]
    # `13[92000] -> 4[89000] [send] via NET/IB/0/GDRDMA` (busId bracket, 2.10)
    r = ch.filter(pl.col("transport") == "NET").sort("line").row(0, named=True)
    assert (r["src_rank"], r["dst_rank"], r["direction"], r["net"], r["nic"], r["gdr"]) == (13, 4, "send", "IB", 0,
                                                                                            True)
    assert (r["src_bus_id"], r["dst_bus_id"]) == ("0000:92:00.0", "0000:89:00.0")
    ch36 = _parse("36").frames["nccl_channels"]
    # `3[1] -> 0[0] [send] via NET/IB/12/GDRDMA/Shared` (index bracket, 2.27)
    r = ch36.sort("line").row(0, named=True)
    assert (r["src_dev"], r["dst_dev"], r["nic"], r["shared"], r["conn_index"]) == (1, 0, 12, True, 1)


def test_tuning_table_old_format():
    t = _parse("30").frames["nccl_tuning"]
    assert t.height == 9  # 9 algo/proto columns on the Broadcast row
    rs = t.filter((pl.col("algo") == "Ring") & (pl.col("proto") == "Simple")).row(0, named=True)
    assert (rs["latency_us"], rs["bw_gbps"], rs["max_nthreads"]) == (18.0, 9.0, 256)
    assert t.filter(pl.col("bw_gbps") > 0).height == 1


def test_coll_lines():
    calls = _parse("25").frames["nccl_calls"]
    assert calls["op_count"].to_list() == [0x139D, 0x139D, 0x139E, 0x139E]
    assert calls["count"].to_list() == [7382228, 7382228, 7066572, 7066572]
    assert set(calls["datatype"]) == {"float32"} and set(calls["redop"]) == {"sum"}
    assert calls["bytes"][0] == 7382228 * 4
    sr = _parse("27").frames["nccl_calls"]
    assert sr.filter(pl.col("op") == "Send").height == 6 and sr.filter(pl.col("op") == "Recv").height == 1


def test_nccl_tests_rows_including_split_fragments():
    t = _parse("11").frames["nccl_tests"]
    full = t.filter(~pl.col("size_inferred"))
    # 10 full rows (1 MiB .. 512 MiB) x 2 placements
    assert full.height == 20
    r = full.filter((pl.col("size_bytes") == 67108864) & (pl.col("placement") == "out-of-place")).row(0, named=True)
    assert (r["time_us"], r["algbw_gbps"], r["busbw_gbps"]) == (24410.0, 2.75, 5.27)
    # `[0]   3300068    2.60    4.99      0`: 2.60 GB/s x 3300068 us ~ 8 GiB
    big = t.filter(pl.col("size_bytes") == 8589934592)
    assert big["time_us"].to_list() == [3300068.0]
    t33 = _parse("33").frames["nccl_tests"]
    assert t33["wrong"].to_list() == [0.0, 1.0]


def test_pytorch_lines():
    ct = _parse("20").frames["collective_timeouts"]
    to = ct.filter(pl.col("kind") == "watchdog_timeout").sort("rank")
    assert to["rank"].to_list() == [3, 7]
    assert to["op_type"].to_list() == ["ALLREDUCE", "BROADCAST"]
    assert to["seq"].to_list() == [80078, 80078]
    st = ct.filter(pl.col("kind") == "pg_status").row(0, named=True)
    assert (st["rank"], st["pg"], st["seq"], st["last_enqueued"], st["last_completed"]) == (7, 0, 80078, 80078, 80077)
    ct24 = _parse("24").frames["collective_timeouts"]
    assert ct24.filter(pl.col("kind") == "blocking_wait").height == 3
    assert ct24.filter(pl.col("kind") == "watchdog_timeout").height == 3
    ct42 = _parse("42").frames["collective_timeouts"].row(0, named=True)
    assert (ct42["rank"], ct42["seq"], ct42["last_enqueued"], ct42["last_completed"]) == (5, 120049, 120051, 120048)


def test_ras_output():
    ev = _parse("40").frames["nccl_events"]
    groups = ev.filter(pl.col("kind") == "ras_group")
    assert groups.height == 3 and groups.filter(pl.col("level") == "WARN").height == 3
    miss = ev.filter(pl.col("kind") == "ras_missing")
    assert set(miss["peer"]) == {"10.4.109.13"} and set(miss["code"]) == {60004}
    ok = _parse("39").frames["nccl_events"].filter(pl.col("kind") == "ras_group")
    assert ok["level"].to_list() == ["INFO"]


def test_warn_lines_and_launcher_ranks():
    ev = _parse("18").frames["nccl_events"]
    assert ev.filter(pl.col("kind") == "ib_async").height == 3
    assert ev.filter(pl.col("kind") == "call_failed").height == 3
    comms = _parse("18").frames["nccl_comms"]
    assert sorted(comms.filter(pl.col("origin") == "launcher")["rank"].to_list()) == [12, 13, 14]
    ev2 = _parse("02").frames["nccl_events"].filter(pl.col("kind") == "ib_completion")
    assert ev2["code"].to_list() == [4, 4, 4]
    assert sorted(ev2["host"].to_list()) == ["H100-1", "H100-2", "H100-5"]


def test_command_line_env():
    env = _parse("46").frames["nccl_env"]
    got = {r["var"]: r["value"] for r in env.iter_rows(named=True)}
    assert got["NCCL_P2P_DISABLE"] == "1" and got["NCCL_SHM_DISABLE"] == "1" and got["NCCL_NET_GDR_LEVEL"] == "4"
    assert set(env["origin"]) == {"command"}


def test_damaged_input_never_raises(tmp_path):
    p = tmp_path / "x.log"
    p.write_bytes(b"h:1:2 [0] NCCL INFO Channel 00/0 : 0[zz] -> 1[1] via\n\xff\xfe garbage\nh:1:2 [0] NCCL INFO NET/IB "
                  b": Using\n")
    res = parse(p, ParseContext(tmp_path, "x.log"))
    assert res.status == "ok"
    assert res.frames["nccl_files"]["nccl_unknown"][0] == 2
    gz = tmp_path / "t.log.gz"
    gz.write_bytes(b"\x1f\x8b\x08\x00garbage")
    res = parse(gz, ParseContext(tmp_path, "t.log.gz"))
    assert res.status in ("failed", "partial")


def test_version_range_from_line_formats():
    # SOURCES.md: 11_ is 2.22 (per-op TUNING line without function, `Init timings:`), 09_ 2.24-2.26
    # (`Check P2P Type intraNodeP2pSupport`), 15_ 2.17-2.19 (channel summary with nvls, no collnet),
    # 46_ `Channel` lines with busId brackets (2.7-2.18.1), 04_ device-index brackets (>= 2.18.3)
    got = {p: _parse(p).frames["nccl_files"]["version_range"][0] for p in ("11", "09", "15", "46", "04")}
    assert got == {"11": "2.22", "09": "2.24-2.26", "15": "2.18.3-2.19", "46": "2.7-2.18.1", "04": ">=2.18.3"}


def test_warn_2_26_timestamp_and_2_30_function_forms(tmp_path):
    p = tmp_path / "w.log"
    p.write_text(
        "\n[2025-06-01 10:00:00] gpu1:7:8 [2] transport/net_ib.cc:2358 NCCL WARN NET/IB : Got completion from peer "
        "10.0.0.2<1> with status=12 opcode=0 len=0 vendor err 129 (Send) localGid x remoteGids y\n"
        "gpu1:7:8 [2] transport/net_ib.cc:2543 (ncclIbTest) NCCL WARN NET/IB: Got completion from peer 10.0.0.2<1> "
        "with status=IBV_WC_RETRY_EXC_ERR(12) opcode=IBV_WC_SEND(0) reqSize=0 vendor_err=129 req_type=Send hca mlx5_0\n"
    )
    res = parse(p, ParseContext(tmp_path, "w.log"))
    ev = res.frames["nccl_events"]
    assert ev["kind"].to_list() == ["ib_completion", "ib_completion"]
    assert ev["code"].to_list() == [12, 12] and ev["host"].to_list() == ["gpu1", "gpu1"]
    assert ev["file_line"].to_list() == ["transport/net_ib.cc:2358", "transport/net_ib.cc:2543"]
    assert res.frames["nccl_files"]["version_range"][0] == ">=2.30"


def test_pytorch_timeout_at_work_form(tmp_path):
    p = tmp_path / "t.log"
    p.write_text("[rank0]:[E0314 09:10:00.1 ProcessGroupNCCL.cpp:1708] [PG ID 0 PG GUID 0(default_pg) Rank 0] "
                 "Timeout at NCCL work: 7, last enqueued NCCL work: 7, last completed NCCL work: 6.\n")
    row = parse(p, ParseContext(tmp_path, "t.log")).frames["collective_timeouts"].row(0, named=True)
    assert (row["kind"], row["rank"], row["seq"], row["last_enqueued"], row["last_completed"]) == ("pg_status", 0, 7, 7,
                                                                                                   6)


def test_ring_lines_of_2_4_and_2_5(tmp_path):
    p = tmp_path / "r.log"
    p.write_text(
        "a:1:2 [2] NCCL INFO Ring 00 : 26[2] -> 24[0] via P2P/IPC\n"
        "b:1:2 [0] NCCL INFO Ring 01 : 3[1b000] -> 0[20000] [send] via NET/IB/0/GDRDMA\n"
    )
    res = parse(p, ParseContext(tmp_path, "r.log"))
    ch = res.frames["nccl_channels"].sort("line")
    assert (ch["src_dev"][0], ch["dst_dev"][0], ch["src_bus_id"][0]) == (2, 0, None)
    assert (ch["src_bus_id"][1], ch["dst_bus_id"][1], ch["src_dev"][1]) == ("0000:1b:00.0", "0000:20:00.0", None)
    assert res.frames["nccl_files"]["version_range"][0] == "inconsistent: >=2.5 and <=2.4"


def test_ring_order_trees_and_collnet_lines(tmp_path):
    ev = _parse("05").frames["nccl_events"]
    assert ev.filter(pl.col("kind") == "trees").height == 4  # grep -c 'NCCL INFO Trees' 05_ = 4
    r13 = _parse("13").frames["nccl_events"].filter(pl.col("kind") == "ring_order").row(0, named=True)
    assert (r13["code"], r13["value"], r13["message"]) == (0, 2.0, "0 1")
    p = tmp_path / "c.log"
    p.write_text("h:1:2 [0] NCCL INFO CollNet 00/0 : 3 [send] via COLLNET/IBext/1/GDRDMA\n")
    ch = parse(p, ParseContext(tmp_path, "c.log")).frames["nccl_channels"].row(0, named=True)
    assert (ch["transport"], ch["src_rank"], ch["direction"], ch["net"], ch["nic"], ch["gdr"]) == ("COLLNET", 3, "send",
                                                                                                   "IBext", 1, True)


# aws-ofi-nccl 1.16 on NCCL 2.27 (EFA), formats as printed in a public training log
EFA_227 = """\
n0:191:191 [0] NCCL INFO NCCL_SOCKET_IFNAME set by environment to ^docker0,lo
n0:191:191 [0] NCCL INFO Bootstrap: Using eth0:10.0.5.28<0>
n0:191:191 [0] NCCL INFO NCCL version 2.27.3+cuda12.9
n0:191:191 [0] NCCL INFO Comm config Blocking set to 1
n0:191:726 [0] NCCL INFO NET/Plugin: Loaded net plugin Libfabric (v10)
n0:191:726 [0] NCCL INFO NET/Plugin: Failed to find ncclCollNetPlugin_v10 symbol.
n0:191:726 [0] NCCL INFO Successfully loaded external plugin libnccl-net.so
n0:191:726 [0] NCCL INFO NET/OFI Initializing aws-ofi-nccl 1.16.2
n0:191:726 [0] NCCL INFO NET/OFI Selected provider is efa, fabric is efa (found 1 nics)
n0:191:726 [0] NCCL INFO NET/OFI Could not disable CUDA API usage for HMEM, disabling GDR
n0:191:726 [0] NCCL INFO NET/OFI Need to force simple protocol: GDR not supported
n0:191:726 [0] NCCL INFO NET/OFI Adding NCCL_PROTO=simple to environment
n0:191:726 [0] NCCL INFO Initialized NET plugin Libfabric
n0:191:726 [0] NCCL INFO Assigned NET plugin Libfabric to comm
n0:191:726 [0] NCCL INFO Using network Libfabric
n0:191:726 [0] NCCL INFO DMA-BUF is available on GPU device 0
n0:191:726 [0] NCCL INFO ncclCommInitRankConfig comm 0x556ea5166cf0 rank 0 nranks 16 cudaDev 0 nvmlDev 0 busId 38000 commId 0x81dca7568efe26d7 - Init START
n0:191:726 [0] NCCL INFO Bootstrap timings total 0.730364 (create 0.000079, send 0.000147, recv 0.000953, ring 0.727395, delay 0.000000)
n0:191:726 [0] NCCL INFO NVLS multicast support is not available on dev 0 (NVLS_NCHANNELS 0)
n0:191:726 [0] NCCL INFO comm 0x556ea5166cf0 rank 0 nRanks 16 nNodes 4 localRanks 4 localRank 0 MNNVL 0
n0:191:726 [0] NCCL INFO Check P2P Type isAllDirectP2p 0 directMode 0
n0:191:726 [0] NCCL INFO NCCL_PROTO set by environment to simple
n0:191:726 [0] NCCL INFO Enabled NCCL Func/Proto/Algo Matrix:
     Function |       LL     LL128    Simple   |          Tree           Ring  CollNetDirect   CollNetChain           NVLS       NVLSTree            PAT  
    Broadcast |        0         0         1   |             1              1              1              1              1              1              1  
    AllReduce |        0         0         1   |             1              1              1              1              1              1              1  

n0:191:726 [0] NCCL INFO TUNER/Plugin: Using tuner plugin nccl_ofi_tuner
n0:191:726 [0] NCCL INFO NET/OFI NCCL_OFI_TUNER is not available for platform : g6e.12xlarge, Fall back to NCCL's tuner
n0:191:1160 [0] NCCL INFO ncclCommSplit comm 0x556ea5a6db80 rank 0 nranks 16 cudaDev 0 nvmlDev 0 busId 38000 parent 0x556ea5166cf0 splitCount 1 color 1734919490 key 0- Init START
"""  # noqa: E501 -- verbatim log lines (test data)


def test_aws_ofi_efa_2_27_lines(tmp_path):
    p = tmp_path / "efa.log"
    p.write_text(EFA_227)
    res = parse(p, ParseContext(tmp_path, "efa.log"))
    f = res.frames["nccl_files"].row(0, named=True)
    assert f["nccl_unknown"] == 0, f["unknown_sample"]
    assert f["nccl_lines"] == 29 and f["other_lines"] == 1  # 26 envelope lines + 3 matrix body lines; 1 blank
    env = res.frames["nccl_env"]
    assert env.filter(pl.col("var") == "NCCL_PROTO")["origin"].to_list() == ["plugin", "plugin"]
    net = res.frames["nccl_net"]
    assert net.filter(pl.col("kind") == "ofi_provider")["name"].to_list() == ["efa"]
    assert net.filter((pl.col("kind") == "gdr_hca") & (pl.col("state") == "Disabled")).height == 2
    comms = res.frames["nccl_comms"]
    assert comms["func"].to_list() == ["ncclCommInitRankConfig", "ncclCommSplit"]
    assert comms["nnodes"].to_list() == [4, None]
    p2p = res.frames["nccl_events"].filter(pl.col("kind") == "p2p_check")
    assert p2p["code"].to_list() == [None]


def test_sharp_collnet_lines_and_new_nccl_tests_bus_format(tmp_path):
    p = tmp_path / "s.log"
    p.write_text(
        "#  Rank  4 Group  0 Pid   9455 on      gpu40 device  0 [0000:4c:00] NVIDIA A100-SXM4-80GB\n"
        "gpu40:2899:2929 [0] NCCL INFO NET/IB : Using [0]mlx5_2:1/IB/SHARP [1]mlx5_0:1/IB/SHARP [RO]; OOB "
        "ib0:10.159.0.40<0>\n"
        "gpu40:2899:2929 [0] NCCL INFO CollNet 00/0 : 4 [receive] via COLLNET/SHARP/0/GDRDMA\n"
        "\ngpu40:2899:2947 [0] sharp_plugin.c:382 NCCL WARN SHARP int8,uint8,bfloat16 Datatypes not supported\n"
        "gpu40:2899:2947 [0] NCCL INFO SHARP rank 2/4 initialized on mlx5_2:1\n"
    )
    res = parse(p, ParseContext(tmp_path, "s.log"))
    assert res.frames["nccl_files"]["nccl_unknown"][0] == 0
    dev = res.frames["nccl_comms"].row(0, named=True)
    assert (dev["rank"], dev["bus_id"], dev["gpu_name"]) == (4, "0000:4c:00.0", "NVIDIA A100-SXM4-80GB")
    assert res.frames["nccl_net"].filter(pl.col("kind") == "ib")["name"].to_list() == ["mlx5_2", "mlx5_0"]
    assert res.frames["nccl_channels"]["transport"].to_list() == ["COLLNET"]
    assert res.frames["nccl_events"].filter(pl.col("level") == "WARN")["kind"].to_list() == ["warn_other"]


def test_flight_recorder_dump_signal(tmp_path):
    p = tmp_path / "fr.log"
    p.write_text("[rank2]:[E1001 10:00:00.1 ProcessGroupNCCL.cpp:1573] [PG ID 0 PG GUID 0(default_pg) Rank 2] "
                 "Received a dump signal due to a collective timeout from rank 5 and we will try our best to dump the "
                 "debug info.\n")
    ev = parse(p, ParseContext(tmp_path, "fr.log")).frames["nccl_events"].row(0, named=True)
    assert (ev["kind"], ev["rank"], ev["code"]) == ("flight_recorder", 2, 5)


def test_nccl_events_carry_each_lines_own_stamp_and_glog_stamps_wait_for_the_jobs_year(tmp_path):
    """A dated stamp fills time_ns at parse time; a year-less glog stamp is kept as written and placed once the job's
    year is known (forensics.facts.job_year.placed); a line with neither stays null."""
    from forensics.facts.job_year import placed

    text = ("[2026-03-14 09:10:00] nodeA:100:100 [0] NCCL WARN Cuda failure 'unspecified launch failure'\n"
            "[rank1]:[E0314 09:10:02.500000000 ProcessGroupNCCL.cpp:1595] [PG ID 0 PG GUID 0 Rank 1] Received a dump "
            "signal due to a collective timeout from rank 0 and we will try our best to dump the debug info.\n"
            "nodeA:100:100 [0] NCCL WARN Cuda failure 'unspecified launch failure'\n")
    p = tmp_path / "rank.log"
    p.write_text(text)
    ev = parse(p, ParseContext(tmp_path, "rank.log")).frames["nccl_events"].sort("line")
    assert ev["kind"].to_list() == ["cuda_failure", "flight_recorder", "cuda_failure"]
    t0 = int(datetime(2026, 3, 14, 9, 10, tzinfo=timezone.utc).timestamp()) * 10**9
    assert ev["time_ns"].to_list() == [t0, None, None]
    assert ev["stamp"].to_list() == [None, "0314 09:10:02.500000000", None]
    assert placed(ev, 2026)["time_ns"].to_list() == [t0, t0 + 2_500_000_000, None]
    assert placed(ev, None)["time_ns"].to_list() == [t0, None, None]
