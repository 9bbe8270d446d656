"""Kineto parser on the real traces in ../shared/sample_data/kineto/.

Every expected figure below was computed independently of the parser, with a throwaway script that
loads each file with plain ``json``/``gzip`` and counts: events with ``ph == "X"`` and ``cat`` in
kernel/Kernel, gpu_memcpy/Memcpy, gpu_memset/Memset; NCCL kernels = kernels whose lower-cased name
contains ``nccl`` or ``rccl``, their collective from the kernel's ``Collective name`` arg, else from
the ``record_param_comms``/``c10d::*`` op enclosing the launch that has the kernel's correlation id
(same pid/tid, time containment), else from the ``Kernel_<Coll>_`` token of the name; steps =
``ProfilerStep#N`` ranges on the host; rank/world from ``distributedInfo``; host from ``host_name``.
They agree with ../shared/sample_data/kineto/SOURCES.md where that table gives the same figure.
"""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

import polars as pl
import pytest
from forensics.parsers.kineto import parse
from forensics.parsers.kineto_names import (
    host_from_filename,
    kernel_name_hints,
    normalise_collective,
    rank_from_filename,
)
from forensics.parsers.result import ParseContext, ParseResult

from forensics.base.frames import pg_id
from tests.conftest import shared_path

_CACHE: dict[str, ParseResult] = {}


def parsed(rel: str) -> ParseResult:
    if rel not in _CACHE:
        path = shared_path("kineto", *rel.split("/"))
        _CACHE[rel] = parse(path, ParseContext(path.parent, rel))
    return _CACHE[rel]


# file -> (compute+comm kernels, memcpy, memset, {collective: NCCL/RCCL kernels}, steps, rank, world)
EXPECTED = {
    "hta/df_index_resolver.json.gz": (19370, 2040, 880, {"allreduce": 2020}, [2, 3, 4, 5, 6], 1, 2),
    "hta/nccl_data.json.gz": (2700, 960, 114, {"allreduce": 15, "broadcast": 6}, [4, 5, 6], 0, 2),
    "hta/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz": (4350, 1600, 145, {}, [101, 102, 103, 104, 105], 0, 1),
    "hta/rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz": (0, 0, 0, {}, [551], 34, 300),
    "hta/rank0.json.gz": (
        6080, 1390, 277,
        {"alltoall": 45, "reduce_scatter": 10, "allreduce": 10, "allgather": 10, "sendrecv": 5},
        [550, 551, 552, 553, 554], 0, 16,
    ),
    "tracelens/eager_trace.json.gz": (768, 161, 0, {"allgather": 1}, [], 0, 8),
    "tracelens/resnet_act_checkpoint.json.gz": (
        2995, 550, 108, {None: 5, "broadcast": 6, "allreduce": 6}, [15, 16, 17], 0, 8,
    ),
    "deepseek_profile_data/train.json.gz": (963, 8, 12, {}, [1], 0, 64),
    "kineto_tb_plugin/worker0.1623143089861.pt.trace.json.gz": (8772, 12, 312, {}, [5, 6, 7, 8, 9, 10], None, None),
}
DLRM = {
    # rank -> compute+comm kernels, memset; every rank: 16 memcpy, 5 alltoall (SendRecv) + 3 allreduce
    0: (245, 0), 1: (310, 0), 2: (246, 0), 3: (315, 6), 4: (251, 6), 5: (245, 0), 6: (246, 0), 7: (246, 0),
}
DLRM_FILES = {
    0: "worker0_step_12.1694128201545", 1: "worker1_step_12.1694128201556", 2: "worker2_step_12.1694128201554",
    3: "worker3_step_12.1694128201557", 4: "worker4_step_12.1694128201547", 5: "worker5_step_12.1694128201549",
    6: "worker6_step_12.1694128201553", 7: "worker7_step_12.1694128201553",
}


def _check_counts(res: ParseResult, kernels: int, memcpy: int, memset: int, colls: dict, steps: list[int]):
    assert res.status == "ok", res.message
    k = res.frames["kernels"]
    by_class = dict(k.group_by("class").len().iter_rows())
    assert by_class.get("compute", 0) + by_class.get("comm", 0) == kernels
    assert by_class.get("memcpy", 0) == memcpy
    assert by_class.get("memset", 0) == memset
    nccl = k.filter(pl.col("name").cast(pl.String).str.to_lowercase().str.contains("nccl|rccl"))
    assert dict(nccl.group_by("collective").len().iter_rows()) == colls
    assert (nccl.get_column("class") == "comm").all()
    assert res.frames["steps"].sort("start_ns").get_column("step").to_list() == steps


@pytest.mark.parametrize("rel", sorted(EXPECTED))
def test_counts_per_sample_trace(rel: str):
    kernels, memcpy, memset, colls, steps, rank, world = EXPECTED[rel]
    res = parsed(rel)
    _check_counts(res, kernels, memcpy, memset, colls, steps)
    ranks = res.frames["ranks"]
    assert ranks.height == 1
    assert ranks.get_column("world_size")[0] == world
    # only the 2024-04 HTA trace names its host (`host_name`); no file name has `<host>_<pid>.`
    # host_name in the trace is the FQDN twshared39868.02.pnb3.facebook.com; frames keep the short name
    # NCCL logs and syslog print, so every source joins on one key.
    host = "twshared39868" if rel.startswith("hta/rank-0.") else None
    assert res.host == host and ranks.get_column("host")[0] == host
    if rel.startswith("kineto_tb_plugin"):
        # No distributedInfo in the 2021 trace: the rank comes from the file name `worker0`.
        assert res.rank == 0 and "from the file name" in (res.message or "")
    else:
        assert res.rank == rank and ranks.get_column("rank")[0] == rank


@pytest.mark.parametrize("rank", range(8))
def test_dlrm_8_ranks(rank: int):
    rel = f"param_dlrm_8rank/{DLRM_FILES[rank]}.pt.trace.json.gz"
    kernels, memset = DLRM[rank]
    res = parsed(rel)
    _check_counts(res, kernels, 16, memset, {"alltoall": 5, "allreduce": 3}, [10])
    assert res.rank == rank and res.host is None  # `worker0_step_12` is a worker name, not a host
    r = res.frames["ranks"].row(0, named=True)
    assert (r["world_size"], r["device"], r["gpu_name"], r["sm_count"]) == (8, rank, "Tesla V100-SXM2-32GB", 80)
    # SendRecv is what the alltoall looks like on the GPU: the name keeps it as a hint only.
    a2a = res.frames["kernels"].filter(pl.col("collective") == "alltoall")
    assert set(a2a.get_column("name_algo")) == {"RING"} and set(a2a.get_column("name_proto")) == {"SIMPLE"}
    # 13 record_param_comms: 8 inside c10d collectives (each linked to its kernel), 5 bare ones.
    comms = res.frames["comms"]
    assert comms.height == 13
    linked = comms.filter(pl.col("kernel_correlation").is_not_null())
    assert dict(linked.group_by("collective").len().iter_rows()) == {"alltoall": 5, "allreduce": 3}
    assert set(linked.get_column("kernel_correlation")) <= set(res.frames["kernels"].get_column("correlation"))


def test_dlrm_epoch_microseconds_become_exact_ns():
    # worker7: first SendRecv kernel `"ts": 1694128201431930, "dur": 10` (hta.md §2.4).
    k = parsed("param_dlrm_8rank/worker7_step_12.1694128201553.pt.trace.json.gz").frames["kernels"]
    row = k.filter(pl.col("correlation") == 41293).row(0, named=True)
    assert (row["start_ns"], row["end_ns"]) == (1694128201431930000, 1694128201431940000)
    assert (row["grid_x"], row["block_x"], row["blocks_per_sm"], row["stream"], row["device"]) == (8, 640, 0.1, 84, 7)


def test_ns_float_timestamps_and_base_time():
    res = parsed("hta/nccl_data.json.gz")
    k = res.frames["kernels"].filter(pl.col("correlation") == 60047).row(0, named=True)
    # "ts": 4458677009853.422, "dur": 2636.669 (µs), "baseTimeNanoseconds": 1711964646000000000
    start = int(Decimal("4458677009853.422") * 1000) + 1711964646000000000
    assert k["start_ns"] == start
    assert k["end_ns"] == start + 2636669
    assert (k["collective"], k["in_nelems"], k["out_nelems"], k["dtype"], k["bytes"]) == (
        "allreduce", 6637568, 6637568, "Float", 6637568 * 4,
    )
    assert (k["pg_name"], k["pg_desc"], k["pg_id"], k["group_size"]) == ("0", "default_pg", pg_id([0, 1]), 2)
    pgs = res.frames["process_groups"]
    # pg_config declares the group, which the collectives' "Process Group Ranks" name too; six "wait" calls name an
    # empty list (no group name), which no group declares
    src = "hta/nccl_data.json.gz"
    assert pgs.rows() == [(0, "0", "default_pg", "cuda:nccl", 2, [0, 1], pg_id([0, 1]), True, src),
                          (0, None, None, None, 0, [], pg_id([]), False, src)]
    assert res.frames["ranks"].get_column("nccl_version")[0] == "2.17.1"


def test_b200_nccl_2_27_driver_launch_and_comm_call():
    res = parsed("tracelens/eager_trace.json.gz")
    # the trace's other comm kernels are symmetric-memory all-reduces (tests/test_tp_overlap.py)
    k = res.frames["kernels"].filter((pl.col("class") == "comm")
                                     & pl.col("name").cast(pl.String).str.starts_with("nccl")).row(0, named=True)
    assert k["name"].startswith("ncclDevKernel_AllGather_RING_LL(")
    assert (k["collective"], k["in_nelems"], k["out_nelems"], k["dtype"]) == ("allgather", 25136, 201088, "BFloat16")
    assert k["bytes"] == 201088 * 2 and k["pg_name"] == "3" and k["group_size"] == 8
    # launched by the driver API `cuLaunchKernelEx` (cat cuda_driver), correlation 15270
    launch = res.frames["cpu_ops"].filter(pl.col("correlation") == 15270).row(0, named=True)
    assert (launch["category"], launch["name"], launch["is_launch"]) == ("cuda_driver", "cuLaunchKernelEx", True)
    comms = res.frames["comms"]
    assert comms.height == 1
    c = comms.row(0, named=True)
    assert (c["name"], c["collective"], c["kernel_correlation"], c["external_id"]) == (
        "record_param_comms", "allgather", 15270, 4802,
    )
    r = res.frames["ranks"].row(0, named=True)
    assert (r["gpu_name"], r["nccl_version"], r["pg_count"], r["world_size"]) == ("NVIDIA B200", "2.27.5", 71, 8)
    assert res.frames["process_groups"].height == 15  # pg_config lists 15 of the 71 groups


def test_rccl_generic_kernels_take_the_collective_from_the_host_call():
    res = parsed("tracelens/resnet_act_checkpoint.json.gz")
    k = res.frames["kernels"].filter(pl.col("class") == "comm")
    assert set(k.get_column("name")) == {"ncclDevKernel_Generic(ncclDevKernelArgsStorage<4096ul>)"}
    assert k.get_column("name_algo").null_count() == k.height  # the generic name says nothing
    linked = k.filter(pl.col("collective").is_not_null())
    assert (linked.get_column("pg_name") == "0").all()
    # record_param_comms in the file: allreduce BFloat16 x6, broadcast BFloat16 x3 and Long x3
    dtypes = linked.group_by("collective", "dtype").len().sort("collective", "dtype").rows()
    assert dtypes == [("allreduce", "BFloat16", 6), ("broadcast", "BFloat16", 3), ("broadcast", "Long", 3)]
    r = res.frames["ranks"].row(0, named=True)
    assert (r["gpu_name"], r["sm_count"], r["nccl_version"]) == ("AMD Instinct MI300X", 304, "2.22.3")
    assert set(res.frames["cpu_ops"].filter(pl.col("is_launch")).get_column("name")) >= {"hipLaunchKernel"}


def test_cpu_only_gloo_trace():
    res = parsed("hta/rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz")
    assert res.frames["kernels"].height == 0
    comms = res.frames["comms"]
    # 10 `gloo:all_reduce` user annotations on two threads, no record_param_comms
    assert comms.height == 10 and set(comms.get_column("collective")) == {"allreduce"}
    assert comms.get_column("kernel_correlation").null_count() == 10
    r = res.frames["ranks"].row(0, named=True)
    assert (r["rank"], r["world_size"], r["backend"], r["device"], r["gpu_name"]) == (34, 300, "gloo", None, None)
    pgs = res.frames["process_groups"]
    assert pgs.height == 11 and set(pgs.get_column("pg_size")) == {300}


def test_host_from_trace_metadata():
    res = parsed("hta/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz")
    assert res.host == "twshared39868"  # from host_name "twshared39868.02.pnb3.facebook.com", domain dropped
    assert set(res.frames["kernels"].get_column("host")) == {"twshared39868"}


def test_legacy_2021_schema():
    res = parsed("kineto_tb_plugin/worker0.1623143089861.pt.trace.json.gz")
    cpu = res.frames["cpu_ops"]
    cats = dict(cpu.group_by("category").len().iter_rows())
    # Operator 23,646 -> cpu_op, Runtime 11,923 -> cuda_runtime (independent count)
    assert cats == {"cpu_op": 23646, "cuda_runtime": 11923}
    k = res.frames["kernels"]
    assert k.get_column("stream").null_count() == 0 and set(k.get_column("stream")) == {7}
    assert k.get_column("external_id").null_count() == 0  # lower-case `external id`
    assert cpu.get_column("tid").null_count() == 0  # `"tid": "25738"` strings


def test_deepep_kernels_are_comm_without_a_collective():
    k = parsed("deepseek_profile_data/train.json.gz").frames["kernels"].filter(pl.col("class") == "comm")
    assert k.height == 36 and k.get_column("name").cast(pl.String).str.contains("dpsk::ep::").all()
    assert k.get_column("collective").null_count() == 36


def test_comms_link_to_kernels_on_the_nccl_heavy_trace():
    res = parsed("hta/df_index_resolver.json.gz")
    comms = res.frames["comms"]
    # 4,040 record_param_comms: 2,020 inside c10d::allreduce_ (each launches one NCCL kernel), 2,020 bare
    assert comms.height == 4040
    linked = comms.filter(pl.col("kernel_correlation").is_not_null())
    assert linked.height == 2020 and set(linked.get_column("collective")) == {"allreduce"}
    assert linked.get_column("kernel_correlation").n_unique() == 2020


@pytest.mark.parametrize(
    "raw,expected",
    [
        ("_allgather_base", "allgather"), ("all_gather_into_tensor", "allgather"), ("alltoall_base", "alltoall"),
        ("reduce_scatter_tensor", "reduce_scatter"), ("_reduce_scatter_base", "reduce_scatter"),
        ("AllReduce", "allreduce"), ("ReduceScatter", "reduce_scatter"), ("SendRecv", "sendrecv"),
        ("nccl:all_reduce", "allreduce"), ("c10d::allreduce_", "allreduce"), ("c10d::_allgather_base_", "allgather"),
        ("broadcast", "broadcast"), ("barrier", "barrier"), ("send", "send"), ("recv", "recv"),
        ("allreduce_coalesced", "allreduce"), ("reduce_scatter_tensor_coalesced", "reduce_scatter"),
        ("gloo:all_reduce", "allreduce"), ("", None),
    ],
)
def test_collective_names(raw: str, expected: str | None):
    assert normalise_collective(raw) == expected


@pytest.mark.parametrize(
    "name,expected",
    [
        ("ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)", ("allreduce", "RING", "LL")),
        ("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", ("allgather", "RING", "LL")),
        ("ncclDevKernel_AllReduce_Sum_f32_RING_LL128", ("allreduce", "RING", "LL128")),
        ("ncclDevKernel_ReduceScatter_Sum_bf16_NVLS_SIMPLE", ("reduce_scatter", "NVLS", "SIMPLE")),
        ("ncclSymDevKernel_AllReduce_AGxLL_R_bf16", ("allreduce", None, None)),
        ("ncclSymkDevKernel_AllGather_LL", ("allgather", None, "LL")),
        ("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)", ("sendrecv", None, None)),
        ("ncclDevKernel_Generic(ncclDevKernelArgsStorage<4096ul>)", (None, None, None)),
        ("void rcclGenericKernel<1, false>(ncclDevComm*, unsigned long, ncclWork*)", (None, None, None)),
    ],
)
def test_kernel_name_hints(name: str, expected: tuple):
    assert kernel_name_hints(name) == expected


def test_rank_and_host_from_file_names():
    assert rank_from_filename("rank3.json.gz") == 3
    assert rank_from_filename("rank-12.Apr_03.pt.trace.json") == 12
    assert rank_from_filename("worker5_step_12.1694128201549.pt.trace.json.gz") == 5
    assert rank_from_filename("trace_rank_7.json") == 7
    assert rank_from_filename("train.json.gz") is None
    assert rank_from_filename("ranking.json") is None
    assert host_from_filename("node-a01_4242.1712195495520.pt.trace.json.gz", {4242}) == "node-a01"
    assert host_from_filename("node-a01_4242.1712195495520.pt.trace.json.gz", {99}) is None
    assert host_from_filename("worker0_step_12.1694128201545.pt.trace.json.gz", {59811}) is None


def test_rank_from_file_name_and_unknown_rank(tmp_path: Path):
    body = b'{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 1, "dur": 2}]}'
    named = tmp_path / "gpu-host7_31337.1700000000000.pt.trace.json"
    named.write_bytes(body.replace(b'"pid": 0',
                                   b'"pid": 0').replace(b"]}",
                                                        b', {"ph": "X", "cat": "cpu_op", "name": "op", "pid": 31337, '
                                                        b'"tid": 1, "ts": 0, "dur": 5}]}'))
    res = parse(named, ParseContext(tmp_path, named.name))
    assert res.status == "ok" and res.host == "gpu-host7"
    # unknown: numbered 0 as a guess that discovery keeps only for a lone trace (not 31337, not 7)
    assert res.rank == 0 and res.rank_guessed and "analysed as rank 0" in (res.message or "")
    assert res.frames["kernels"].get_column("rank").to_list() == [0]
    (tmp_path / "rank5").mkdir()
    in_dir = tmp_path / "rank5" / "trace.json"
    in_dir.write_bytes(body)
    res = parse(in_dir, ParseContext(tmp_path, "rank5/trace.json"))
    assert res.rank == 5 and res.frames["ranks"].get_column("rank")[0] == 5
