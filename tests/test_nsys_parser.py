"""The nsys parser on real exports (identity, NCCL, clock domain, read-only) and on tiny synthetic
exports for what no real sample has (GPU metrics, NCCL payloads, rank variables, schema variants)."""

from __future__ import annotations

import hashlib
import sqlite3
import struct
from pathlib import Path

import polars as pl
import pytest
from forensics.parsers.nsys import classify_kernels, parse
from forensics.parsers.result import ParseContext

from forensics.base.frames import JobFrames
from forensics.facts.gpu_metrics import has_metric, sm_active_in_windows
from tests.conftest import shared_path
from tests.nsys_synth import make_export

RING = "DistributedSysLab_FS24/ring_simple_2nodes_6gpus_job508813"
TREE = "DistributedSysLab_FS24/tree_simple_2nodes_6gpus_job508838"
# (file host_pid, rank, host, device) from the per-rank tables in sample_data/nsys/SOURCES.md.
RING_RANKS = [("ault43.cscs.ch_485050", 0, "ault43", 0), ("ault43.cscs.ch_485052", 1, "ault43", 1),
              ("ault43.cscs.ch_485055", 2, "ault43", 2), ("ault44.cscs.ch_739538", 3, "ault44", 0),
              ("ault44.cscs.ch_739541", 4, "ault44", 1), ("ault44.cscs.ch_739537", 5, "ault44", 2)]
TREE_RANKS = [("ault43.cscs.ch_491768", 0, "ault43", 0), ("ault43.cscs.ch_491764", 1, "ault43", 1),
              ("ault43.cscs.ch_491770", 2, "ault43", 2), ("ault44.cscs.ch_742412", 3, "ault44", 0),
              ("ault44.cscs.ch_742406", 4, "ault44", 1), ("ault44.cscs.ch_742413", 5, "ault44", 2)]
JOBS = [(RING, r, "RING") for r in RING_RANKS] + [(TREE, r, "TREE") for r in TREE_RANKS]


def run(path: Path):
    return parse(path, ParseContext(path.parent, path.name))


def sql(path: Path, query: str) -> list[tuple]:
    con = sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True)
    try:
        return con.execute(query).fetchall()
    finally:
        con.close()


# --- real exports -----------------------------------------------------------------------------


@pytest.mark.parametrize("job,who,algo", JOBS, ids=[f"{j.split('_')[2]}-{w[0]}" for j, w, _ in JOBS])
def test_multinode_rank_host_device_and_nccl_kernel(job, who, algo):
    stem, rank, host, device = who
    path = shared_path("nsys", job, f"example_2_nsys_report_{stem}.sqlite")
    res = run(path)
    assert (res.status, res.rank, res.host) == ("ok", rank, host)
    ranks = res.frames["ranks"]
    assert ranks.select("rank", "host", "device", "world_size", "gpu_name", "sm_count").row(0) == (
        rank, host, device, 6, "NVIDIA GeForce RTX 3090", 82)
    assert ranks["pid"].item() == int(stem.rsplit("_", 1)[1])
    comm = res.frames["kernels"].filter(pl.col("class") == "comm")
    assert comm.height == 1
    assert comm.select("collective", "name_algo", "name_proto", "rank", "device").row(0) == ("allreduce", algo, "LL",
                                                                                             rank, device)
    # the one ncclAllReduce NVTX call, linked to the kernel it launched (correlation read with SQL)
    (corr,), = sql(path, "SELECT correlationId FROM CUPTI_ACTIVITY_KIND_KERNEL")
    comms = res.frames["comms"]
    assert comms.select("name", "collective", "rank",
                        "kernel_correlation").rows() == [("ncclAllReduce", "allreduce", rank, corr)]


def test_normalised_export_keeps_epoch_times():
    path = shared_path("nsys", RING, "example_2_nsys_report_ault43.cscs.ch_485050.sqlite")
    (start, end), = sql(path, "SELECT start, end FROM CUPTI_ACTIVITY_KIND_KERNEL")
    k = run(path).frames["kernels"].filter(pl.col("class") == "comm")
    assert k.select("start_ns", "end_ns").row(0) == (start, end)


def test_session_relative_export_is_shifted_to_epoch():
    path = shared_path("nsys", "nsys-ai", "mfu_2gpu_before.sqlite")
    (utc,), = sql(path, "SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME")
    (lo, hi), = sql(path, "SELECT min(start), max(end) FROM CUPTI_ACTIVITY_KIND_KERNEL")
    k = run(path).frames["kernels"].filter(pl.col("class").is_in(["compute", "comm"]))
    assert (k["start_ns"].min(), k["end_ns"].max()) == (lo + utc, hi + utc)


def test_two_processes_without_rank_are_numbered_in_gpu_order_as_a_guess():
    path = shared_path("nsys", "nsys-ai", "mfu_2gpu_before.sqlite")
    res = run(path)
    assert res.rank is None and res.rank_guessed
    # pids and devices as in the gpu_gaps reference CSV (PID 144 on device 0, PID 145 on device 1)
    assert sorted(res.frames["ranks"].select("pid", "device", "rank").rows()) == [(144, 0, 0), (145, 1, 1)]
    assert "analysed as ranks 0-1 in GPU order" in (res.message or "")


def test_p2p_nccl_kernels_and_calls_nsys_2026():
    path = shared_path("nsys", "nsys-ai", "mfu_2gpu_before.sqlite")
    res = run(path)
    comm = res.frames["kernels"].filter(pl.col("class") == "comm")
    (n_kernels,), = sql(path,
                        "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id = k.shortName "
                              "WHERE s.value LIKE 'nccl%'")
    assert comm.height == n_kernels
    assert comm["collective"].unique().to_list() == ["sendrecv"]
    counts = dict(sql(path, "SELECT s.value, count(*) FROM NVTX_EVENTS n JOIN StringIds s ON s.id = n.textId "
                            "WHERE s.value IN ('ncclSend', 'ncclRecv') GROUP BY 1"))
    comms = res.frames["comms"]
    assert dict(comms.group_by("name").len().rows()) == counts
    # the NCCL domain's create row was cut by the windowed export: the domain is found from API names
    assert comms["collective"].unique().sort().to_list() == ["recv", "send"]


def test_mpi_rank_from_thread_name_nsys_2022():
    path = shared_path("nsys", "pipit", "saxpy-mpi-cuda_nsys_perlmutter0.sqlite")
    res = run(path)
    assert res.status == "ok"
    assert res.rank == 0  # NVTX thread name "MPI Rank 0"
    (hostname,), = sql(path, "SELECT value FROM TARGET_INFO_SYSTEM_ENV WHERE name = 'Hostname'")
    assert res.host == hostname.split(".")[0]


def test_sample_exports_are_not_modified():
    path = shared_path("nsys", "nsys-ai", "mock.sqlite")
    before = hashlib.sha1(path.read_bytes()).hexdigest()
    siblings = set(path.parent.iterdir())
    assert run(path).status == "ok"
    assert hashlib.sha1(path.read_bytes()).hexdigest() == before
    assert set(path.parent.iterdir()) == siblings  # no -journal / -wal / -shm files


# --- not nsys / damaged -----------------------------------------------------------------------


def test_sqlite_that_is_not_nsys_is_failed_with_reason(tmp_path):
    path = tmp_path / "app.sqlite"
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE users (id INTEGER, name TEXT)")
    con.commit()
    con.close()
    res = run(path)
    assert res.status == "failed"
    assert "not an Nsight Systems export" in res.message


def test_damaged_sqlite_is_failed_not_raised(tmp_path):
    path = tmp_path / "broken.sqlite"
    path.write_bytes(b"SQLite format 3\x00" + b"\x13" * 5000)
    res = run(path)
    assert res.status == "failed"
    assert "broken.sqlite" in res.message


def test_discovery_reports_non_nsys_sqlite(tmp_path):
    from forensics.pipeline import load

    con = sqlite3.connect(tmp_path / "cache.db")
    con.execute("CREATE TABLE t (x)")
    con.commit()
    con.close()
    sources, _ = load(tmp_path, workers=1)
    row = sources.row(0, named=True)
    assert (row["kind"], row["status"]) == ("nsys", "failed")
    assert "not an Nsight Systems export" in row["message"]


# --- synthetic exports ------------------------------------------------------------------------

T0 = 1_700_000_000_000_000_000


def test_old_metadata_table_env_rank_and_time_offset(tmp_path):
    path = make_export(
        tmp_path / "x.sqlite", meta_table="EXPORT_META_DATA", utc_epoch_ns=T0,
        env={"RANK": "3", "WORLD_SIZE": "8", "SLURM_PROCID": "0", "HOSTNAME": "gpu-node-17.cluster.local"},
        kernels=[(1000, 2000, 0, 7, 11, 42, "void gemm_kernel<float>(float*)", 264)],
        runtime=[(900, 950, 42, 43, 11, "cudaLaunchKernel_v7000"),
                 (960, 990, 42, 43, 12, "cudaStreamSynchronize_v3020")],
    )
    res = run(path)
    assert (res.status, res.rank, res.host) == ("ok", 3, "gpu-node-17")
    k = res.frames["kernels"].row(0, named=True)
    assert (k["start_ns"], k["end_ns"], k["rank"], k["class"], k["stream"], k["correlation"]) == (T0 + 1000, T0 + 2000,
                                                                                                  3, "compute", 7, 11)
    assert k["blocks_per_sm"] == pytest.approx(264 / 132)
    ops = res.frames["cpu_ops"].sort("start_ns")
    assert ops.select("name", "category", "is_launch", "pid", "tid").rows() == [
        ("cudaLaunchKernel", "cuda_runtime", True, 42, 43), ("cudaStreamSynchronize", "cuda_runtime", False, 42, 43)]
    assert res.frames["ranks"].select("rank", "world_size").row(0) == (3, 8)


def test_rank_from_file_name_never_from_pid_suffix(tmp_path):
    kern = [(10, 20, 0, 7, 1, 5, "k", 1)]
    assert run(make_export(tmp_path / "trace_rank7.sqlite", kernels=kern)).rank == 7
    guessed = run(make_export(tmp_path / "report_node3_4242.sqlite", kernels=kern))
    assert guessed.rank_guessed and guessed.rank == 0  # numbered from 0, not 4242 or 3


def test_env_rank_not_applied_to_several_processes(tmp_path):
    kern = [(10, 20, 0, 7, 1, 5, "k", 1), (10, 20, 1, 7, 1, 6, "k", 1)]
    res = run(make_export(tmp_path / "x.sqlite", env={"SLURM_PROCID": "1"}, kernels=kern))
    assert res.rank is None and res.rank_guessed
    assert sorted(res.frames["kernels"]["rank"].to_list()) == [0, 1]  # GPU order, not the environment's 1


def test_nccl_kernel_names_in_every_naming_era():
    names = [
        ("ncclKernel_AllReduce_RING_LL_Sum_float", "comm", "allreduce", "RING", "LL"),
        ("ncclDevKernel_AllGather_RING_LL", "comm", "allgather", "RING", "LL"),
        ("ncclDevKernel_ReduceScatter_Sum_bf16_RING_SIMPLE", "comm", "reduce_scatter", "RING", "SIMPLE"),
        ("ncclDevKernel_AllReduce_Sum_f32_NVLS_SIMPLE", "comm", "allreduce", "NVLS", "SIMPLE"),
        ("ncclDevKernel_Broadcast_RING_LL128", "comm", "broadcast", "RING", "LL128"),
        ("ncclDevKernel_SendRecv", "comm", "sendrecv", None, None),
        ("ncclSymDevKernel_AllReduce_AGxLL_R_sum_f32", "comm", "allreduce", None, None),
        ("ncclSymkDevKernel_AllGather_LL", "comm", "allgather", None, "LL"),
        ("void at::native::vectorized_elementwise_kernel<4>(int)", "compute", None, None, None),
        ("nvjet_tst_192x192_64x4_2x1_v_bz_coopB_bias_TNN", "compute", None, None, None),
        ("void deep_ep::intranode::dispatch<8, 768>(int*, float*)", "comm", None, None, None),
    ]
    df = pl.DataFrame({"name": [n[0] for n in names], "short": [n[0] for n in names], "kind": ["kernel"] * len(names)})
    out = classify_kernels(df)
    assert out.select("class", "collective", "name_algo", "name_proto").rows() == [n[1:] for n in names]


def _payload(comm: int, size: int, tail: int) -> bytes:
    return struct.pack("<QQi", comm, size, tail)


def test_nccl_nvtx_payloads_and_steps(tmp_path):
    entries = [(1, 16777223, 0, 18, "NCCL communicator ID", 0), (1, 16777223, 1, 22, "Message size [bytes]", 8),
               (1, 16777223, 2, 16777232, "Reduction operation", 16),
               (1, 16777226, 0, 18, "NCCL communicator ID", 0), (1, 16777226, 1, 22, "Message size [bytes]", 8),
               (1, 16777226, 2, 5, "Peer rank", 16),
               (1, 16777227, 0, 18, "NCCL communicator ID", 0), (1, 16777227, 1, 5, "No. of ranks", 8),
               (1, 16777227, 2, 5, "Rank", 12), (1, 16777227, 3, 5, "CUDA device", 16)]
    path = make_export(
        tmp_path / "rank0.sqlite", env={"OMPI_COMM_WORLD_RANK": "0"},
        kernels=[(500, 900, 0, 13, 77, 9, "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
                  4)],
        runtime=[(120, 130, 9, 10, 77, "cudaLaunchKernelExC_v11060")],
        nvtx=[
            (0, None, 75, 9, 10, "NCCL", 1, None, None),
            (10, 90, 59, 9, 10, "ncclCommInitRank", 1, None, struct.pack("<Qiii", 0xABC, 8, 0, 0)),
            (100, 200, 59, 9, 10, "ncclAllReduce", 1, None, _payload(0xABC, 8 << 20, 0)),
            (300, 400, 59, 9, 10, "ncclSend", 1, None, _payload(0xABC, 4096, 5)),
            (410, 420, 59, 9, 10, "ncclRecv", 1,
             '{"NCCL communicator ID": 2748, "Message size [bytes]": 1024, "Peer rank": 2}', None),
            (0, 1000, 59, 9, 10, "ProfilerStep#5", 0, None, None),
            (1000, 2000, 59, 9, 10, "ProfilerStep#6, op_id = 4711", 0, None, None),
            (2000, 2100, 59, 9, 10, "stepper_kernel_wrapper", 0, None, None),
        ],
        schema_entries=entries, schemas=[(1, 16777223, 20), (1, 16777226, 20), (1, 16777227, 20)],
    )
    res = run(path)
    comms = res.frames["comms"].sort("start_ns")
    assert comms.select("name", "collective", "bytes", "pg_name", "group_size", "src_rank", "dst_rank",
                        "kernel_correlation").rows() == [
        ("ncclAllReduce", "allreduce", 8 << 20, "0xabc", 8, None, None, 77),
        ("ncclSend", "send", 4096, "0xabc", 8, 0, 5, None),
        ("ncclRecv", "recv", 1024, "0xabc", 8, 2, 0, None),
    ]
    assert res.frames["steps"].select("step", "rank", "start_ns").rows() == [(5, 0, T0), (6, 0, T0 + 1000)]
    # the AllReduce kernel carries the size and communicator of the call that launched it
    k = res.frames["kernels"].filter(pl.col("class") == "comm")
    assert k.select("collective", "bytes", "pg_name", "group_size").rows() == [("allreduce", 8 << 20, "0xabc", 8)]


def test_gpu_metrics_frame_and_sm_active_windows(tmp_path):
    # device 0: SM Active samples at 100, 200, 300, 400 ns (raw) of 10, 50, 100, 20 %. A sample describes
    # the interval up to the next sample (nsys' gpu_metric_util_map reading), so the last covers nothing.
    metrics = [(100, 0, "SM Active [Throughput %]", 10), (200, 0, "SM Active [Throughput %]", 50),
               (300, 0, "SM Active [Throughput %]", 100), (400, 0, "SM Active [Throughput %]", 20),
               (200, 0, "Tensor Active [Throughput %]", 5), (300, 0, "Tensor Active [Throughput %]", 7),
               (400, 0, "Tensor Active [Throughput %]", 9),
               (100, 0, "DRAM Read Bandwidth [Throughput %]", 33)]
    path = make_export(tmp_path / "m.sqlite", env={"RANK": "2"}, kernels=[(150, 350, 0, 7, 1, 5, "k", 1)],
                       metrics=metrics)
    res = run(path)
    gm = res.frames["gpu_metrics"].sort("timestamp_ns")
    assert gm.select("timestamp_ns", "sm_active", "tensor_active", "rank", "device").rows() == [
        (T0 + 100, 10.0, None, 2, 0), (T0 + 200, 50.0, 5.0, 2, 0), (T0 + 300, 100.0, 7.0, 2, 0),
        (T0 + 400, 20.0, 9.0, 2, 0)]
    frames = JobFrames(res.frames)
    # whole sampled span [100, 400]: (10*100 + 50*100 + 100*100) / 300 / 100
    whole = sm_active_in_windows(frames, pl.DataFrame({"source": ["m.sqlite"], "device": [0], "start_ns": [T0],
                                                       "end_ns": [T0 + 1000]}))
    assert whole["sm_active_covered_ns"].item() == 300
    assert whole["sm_active"].item() == pytest.approx(160 / 300)
    # [150, 250]: 10 % for 50 ns, 50 % for 50 ns -> 0.30; [350, 500] clipped to [350, 400] -> 1.0
    w = pl.DataFrame({"source": ["m.sqlite"] * 3, "device": [0, 0, 0],
                      "start_ns": [T0 + 150, T0 + 350, T0 + 500], "end_ns": [T0 + 250, T0 + 500, T0 + 600]})
    out = sm_active_in_windows(frames, w)
    assert out["sm_active"].to_list()[:2] == [pytest.approx(0.30), pytest.approx(1.0)]
    assert out["sm_active"].to_list()[2] is None
    assert out["sm_active_covered_ns"].to_list() == [100, 50, 0]


def test_gpu_metrics_from_generic_events_json(tmp_path):
    path = make_export(tmp_path / "g.sqlite", kernels=[(150, 350, 1, 7, 1, 5, "k", 1)])
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE GENERIC_EVENTS (rawTimestamp INTEGER NOT NULL, timestamp INTEGER, typeId INTEGER NOT "
                "NULL, data TEXT NOT NULL)")
    con.executemany("INSERT INTO GENERIC_EVENTS VALUES (?, ?, ?, ?)", [
        (9_000, 100, 0x10001, '{"SM Active": 40, "SM Issue": 12, "Tensor Active": 0}'),
        (9_100, 200, 0x10001, '{"SM Active": 60, "SM Issue": 30, "Tensor Active": 25}'),
        (9_150, 250, 0x20000, '{"CPU Frequency": 3000}'),
    ])
    con.commit()
    con.close()
    gm = run(path).frames["gpu_metrics"].sort("timestamp_ns")
    assert gm.select("timestamp_ns", "device", "sm_active", "sm_issue", "tensor_active").rows() == [
        (T0 + 100, 1, 40.0, 12.0, 0.0), (T0 + 200, 1, 60.0, 30.0, 25.0)]


def test_no_gpu_metrics_means_empty_answer():
    path = shared_path("nsys", "nsys-ai", "mock.sqlite")
    res = run(path)
    assert "gpu_metrics" not in res.frames  # the export has no GPU_METRICS table: absent, not empty
    assert not has_metric(JobFrames(res.frames))
    w = pl.DataFrame({"source": ["mock.sqlite"], "device": [0], "start_ns": [0], "end_ns": [10]})
    assert sm_active_in_windows(JobFrames(res.frames), w)["sm_active"].to_list() == [None]


def test_damaged_page_gives_partial_with_the_table_named(tmp_path):
    src = shared_path("nsys", "nsys-ai", "h100_2gpu_1s.sqlite")
    whole = run(src)
    data = bytearray(src.read_bytes())
    # find a page of CUPTI_ACTIVITY_KIND_RUNTIME: the root page of its b-tree, from sqlite_master
    (root,), = sql(src, "SELECT rootpage FROM sqlite_master WHERE name = 'CUPTI_ACTIVITY_KIND_RUNTIME'")
    (page_size,), = sql(src, "PRAGMA page_size")
    data[(root - 1) * page_size:root * page_size] = b"\xff" * page_size
    path = tmp_path / "damaged.sqlite"
    path.write_bytes(bytes(data))
    res = run(path)
    assert res.status == "partial"
    assert "CUPTI_ACTIVITY_KIND_RUNTIME" in res.message and "damaged.sqlite" in res.message
    assert res.frames["kernels"].height == whole.frames["kernels"].height
    assert res.frames["cpu_ops"].filter(pl.col("category") == "cuda_runtime").height == 0


def test_launch_flags_and_grouped_p2p_calls_linked_to_their_kernel():
    path = shared_path("nsys", "nsys-ai", "mfu_2gpu_before.sqlite")
    res = run(path)
    # is_launch: the runtime call has a kernel / memcpy / memset with the same (pid, correlation id);
    # counted here from the raw tables in Python.
    gpu = set()
    for t in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET"):
        gpu |= {(g >> 24, c) for g, c in sql(path, f"SELECT globalPid, correlationId FROM {t}")}
    runtime = sql(path, "SELECT globalTid, correlationId FROM CUPTI_ACTIVITY_KIND_RUNTIME")
    expected = sum((g >> 24, c) in gpu for g, c in runtime)
    ops = res.frames["cpu_ops"]
    assert ops["is_launch"].sum() == expected
    assert "cudaStreamWaitEvent" not in ops.filter(pl.col("is_launch"))["name"].to_list()
    # ncclGroupStart; ncclSend x2; ncclRecv x2; ncclGroupEnd: the SendRecv kernel is launched inside
    # ncclGroupEnd, and all four calls of the group point to it.
    comms = res.frames["comms"].drop_nulls("kernel_correlation")
    comm_kernels = res.frames["kernels"].filter(pl.col("class") == "comm")
    assert comms.join(comm_kernels, left_on="kernel_correlation", right_on="correlation", how="anti").height == 0
    per_kernel = comms.group_by("pid", "kernel_correlation").agg(pl.col("name").sort())
    assert per_kernel["name"].to_list() == [["ncclRecv", "ncclRecv", "ncclSend", "ncclSend"]] * per_kernel.height
    # windowed export: groups cut by the window edge stay unlinked; nearly every kernel is reached
    assert per_kernel.height >= comm_kernels.height - 2
