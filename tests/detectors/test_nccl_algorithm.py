from __future__ import annotations

import polars as pl

from forensics.base.frames import JobFrames
from forensics.facts import nccl_cost as nc
from tests.detectors.nccl_fixtures import HEALTHY, frames_from

# an all-reduce of 4 MiB that rank 0 ran (COLL line, NCCL 2.21 format)
RAN = ("nodeA:100:100 [0] NCCL INFO AllReduce: opCount 0 sendbuff 0x7f1 recvbuff 0x7f1 count 1048576 datatype 7 op 0 "
       "root 0 comm 0x1 [nranks=4] stream 0x5\n")
FORCED = "nodeA:100:110 [0] NCCL INFO NCCL_ALGO set by environment to Ring\n"


def test_triggers_on_forced_algorithm(run_detector, tmp_path):
    findings, _ = run_detector(frames_from(tmp_path, HEALTHY + FORCED + RAN))
    (f,) = findings
    assert f.key == "forced" and "NCCL_ALGO=Ring" in f.summary and f.ranks == (0,) and f.gpus == ("0000:18:00.0",)
    assert f.severity.value == "warning" and f.kind == "forced_algorithm" and f.metrics["ran_under"] == "AllReduce"
    assert "collectives ran under it (AllReduce; COLL lines)" in f.summary


def test_forced_algorithm_no_collective_ran_under_is_information_only(run_detector, tmp_path):
    # #28 item 1: only what ran counts; the same setting with no collective in the logs is said, not warned about
    (f,) = run_detector(frames_from(tmp_path, HEALTHY + FORCED))[0]
    assert f.severity.value == "info" and f.kind == "algorithm_setting" and f.metrics["ran_under"] is None
    assert "no collective is known to have run under it" in f.summary


def test_forced_tree_with_only_broadcasts_run_did_not_shape_them(run_detector, tmp_path):
    # Broadcast has no Tree implementation: NCCL_ALGO=Tree governs none of the collectives that ran
    text = HEALTHY + FORCED.replace("Ring", "Tree") + RAN.replace("AllReduce:", "Broadcast:")
    (f,) = run_detector(frames_from(tmp_path, text))[0]
    assert f.severity.value == "info" and f.kind == "algorithm_setting" and "(Broadcast; COLL lines)" in f.summary


def test_forced_setting_that_the_logged_choices_ignore_is_information_only(run_detector, tmp_path):
    # NCCL logged Tree/LL for the size the job ran: NCCL_ALGO=Ring did not govern that communicator
    text = HEALTHY + FORCED + RAN + "nodeA:100:100 [0] NCCL INFO AllReduce: 4194304 Bytes -> Algo 0 proto 0 time 30.0\n"
    (f,) = run_detector(frames_from(tmp_path, text))[0]
    assert f.severity.value == "info" and f.kind == "algorithm_setting" and "(Tree/LL)" in f.summary
    # ... and one logged choice that obeys it makes it count again
    both = text + "nodeA:100:100 [0] NCCL INFO AllReduce: 8388608 Bytes -> Algo 1 proto 2 time 60.0\n"
    (g,) = run_detector(frames_from(tmp_path, both, "both.log"))[0]
    assert g.kind == "forced_algorithm" and g.severity.value == "warning"


def test_a_kernel_name_is_not_read_as_the_algorithm(run_detector, tmp_path):
    # a traced all-reduce says a collective ran, never which algorithm: its _TREE_ name does not make NCCL_ALGO=Ring
    # "not applied"
    frames = frames_from(tmp_path, HEALTHY + FORCED)
    kernels = pl.DataFrame({"rank": [0], "class": ["comm"], "collective": ["allreduce"], "pg_name": ["0"],
                            "seq": [1], "bytes": [None], "start_ns": [0], "end_ns": [10],
                            "name": ["ncclKernel_AllReduce_TREE_LL_Sum_float"]}, schema_overrides={"bytes": pl.Int64})
    (f,) = run_detector(JobFrames({n: frames[n] for n in frames.present} | {"kernels": kernels}))[0]
    assert f.kind == "forced_algorithm" and "(AllReduce; trace)" in f.summary


def test_triggers_on_measured_time_far_above_prediction_in_a_trace(run_detector, tmp_path):
    # NCCL predicted 1000 us for 64 MiB (Ring/Simple); the fastest rank's kernel took 5000 us
    text = HEALTHY + "nodeA:100:100 [0] NCCL INFO AllReduce: 67108864 Bytes -> Algo 1 proto 2 time 1000.000000\n"
    frames = frames_from(tmp_path, text)
    kernels = pl.DataFrame({
        "rank": [0, 1, 2, 3], "class": ["comm"] * 4, "collective": ["allreduce"] * 4, "pg_name": ["0"] * 4,
        "seq": [7] * 4, "bytes": [67108864] * 4, "start_ns": [0, 0, 0, 0],
        "end_ns": [9_000_000, 5_000_000, 6_000_000, 7_000_000], "name": ["ncclDevKernel_AllReduce_Sum_f32_RING_LL"] * 4,
    })
    all_frames = {n: frames[n] for n in frames.present} | {"kernels": kernels}
    findings, _ = run_detector(JobFrames(all_frames))
    (f,) = [x for x in findings if x.key == "model_gap"]
    assert f.metrics["worst_ratio"] == 5.0 and "trace" in f.summary


def test_clean_default_choices_matching_measurements(run_detector, tmp_path):
    text = HEALTHY + "nodeA:100:100 [0] NCCL INFO AllReduce: 67108864 Bytes -> Algo 1 proto 2 time 1000.000000\n"
    findings, skipped = run_detector(frames_from(tmp_path, text))
    assert findings == [] and skipped == []


def test_skipped_without_nccl_inputs(run_detector):
    findings, skipped = run_detector(JobFrames({}))
    assert findings == [] and "nccl_env" in skipped[0].reason


def test_skipped_when_logs_have_nothing_about_algorithms(run_detector, tmp_path):
    findings, skipped = run_detector(frames_from(tmp_path,
                                                 "h:1:1 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM\n"))
    assert findings == []


def test_forced_loss_is_quantified_when_sizes_and_gpus_are_known(run_detector, tmp_path):
    # 4 x H100 on one node, COLL lines give 64 KiB all-reduces, user forced Ring/Simple
    text = "".join(
        f"n:1:1 [{d}] NCCL INFO comm 0x{d} rank {d} nranks 4 cudaDev {d} busId {d + 1}000 - Init COMPLETE\n"
        for d in range(4)
    ) + (
        "n:1:1 [0] NCCL INFO NCCL_PROTO set by environment to Simple\n"
        "n:1:1 [0] NCCL INFO 16 coll channels, 0 collnet channels, 16 nvls channels, 16 p2p channels, 2 p2p channels "
        "per peer\n"
        + "n:1:1 [0] NCCL INFO AllReduce: opCount 1 sendbuff 0x1 recvbuff 0x1 count 16384 datatype 7 op 0 root 0 comm "
          "0x0 [nranks=4] stream 0x1\n"
    )
    frames = frames_from(tmp_path, text)
    comms = frames["nccl_comms"].with_columns(pl.lit("NVIDIA H100 80GB HBM3").alias("gpu_name"))
    frames = JobFrames({n: frames[n] for n in frames.present} | {"nccl_comms": comms})
    (f,) = run_detector(frames)[0]
    c = nc.Comm(nranks=4, nnodes=1, ring=nc.Graph(16, 20.6, 12.0))
    expect = nc.choose(nc.Comm(**{**c.__dict__, "protos": frozenset({"Simple"})}), "AllReduce",
                       65536)[2] - nc.choose(c, "AllReduce", 65536)[2]
    assert f.metrics["predicted_lost_us"] == round(expect, 1) and expect > 0


# NCCL >= 2.18 TUNING table layout (tuning.cc: blocks of 3 algorithms), 2.24+ per-op line without time
TABLE_2_24 = """\
n:1:1 [0] NCCL INFO   Algorithm   |                   Tree                   |                   Ring                   |             CollNetDirect            |
n:1:1 [0] NCCL INFO   Protocol    |             LL |          LL128 |         Simple |             LL |          LL128 |         Simple |             LL |          LL128 |         Simple |
n:1:1 [0] NCCL INFO  Max NThreads |            512 |            640 |            512 |            512 |            640 |            512 |              0 |              0 |            512 |
n:1:1 [0] NCCL INFO     Broadcast |     0.0/   0.0 |     0.0/   0.0 |     0.0/   0.0 |     4.6/  16.0 |    14.0/  40.0 |    14.0/ 100.0 |     0.0/   0.0 |     0.0/   0.0 |     0.0/   0.0 |
n:1:1 [0] NCCL INFO     AllReduce |    10.0/  10.0 |    20.0/  40.0 |    30.0/  60.0 |    12.0/  10.0 |    25.0/  50.0 |    40.0/ 100.0 |     0.0/   0.0 |     0.0/   0.0 |     0.0/   0.0 |
n:1:1 [0] NCCL INFO AllReduce: 104857600 Bytes -> Algo Ring proto Simple channel{Lo..Hi}={0..15}
"""  # noqa: E501 -- verbatim log lines (test data)


def test_tuning_table_new_layout_is_parsed(tmp_path):
    t = frames_from(tmp_path, TABLE_2_24)["nccl_tuning"]
    assert t.height == 18
    r = t.filter((pl.col("collective") == "AllReduce") & (pl.col("algo") == "Ring")
                 & (pl.col("proto") == "Simple")).row(0, named=True)
    assert (r["latency_us"], r["bw_gbps"], r["max_nthreads"]) == (40.0, 100.0, 512)


def test_triggers_on_nccl_tests_time_far_above_the_tuning_table(run_detector, tmp_path):
    # 100 MiB AllReduce on Ring/Simple: table says 40 us + 104857600 B / (1000 * 100 GB/s) = 1088.576 us;
    # nccl-tests measured 10885.76 us -> 10x
    text = TABLE_2_24 + "n:1:1 [0] NCCL INFO comm 0x1 rank 0 nranks 2 cudaDev 0 busId 1000 - Init COMPLETE\n" + (
        "./build/all_reduce_perf -b 100M -e 100M\n"
        "   104857600      26214400     float     sum      -1  10885.76    9.63    9.63      0  10885.76    9.63    "
        "9.63      0\n"
    )
    findings, _ = run_detector(frames_from(tmp_path, text))
    (f,) = [x for x in findings if x.key == "model_gap"]
    assert abs(f.metrics["worst_ratio"] - 10.0) < 0.01 and f.metrics["worst_bytes"] == 104857600


def test_forced_loss_per_step_from_trace_sizes(run_detector, tmp_path):
    # same job, sizes from the trace: rank 0 issued four 64 KiB all-reduces over two profiled steps of 10 ms
    text = "".join(
        f"n:1:1 [{d}] NCCL INFO comm 0x{d} rank {d} nranks 4 cudaDev {d} busId {d + 1}000 - Init COMPLETE\n"
        for d in range(4)
    ) + "n:1:1 [0] NCCL INFO NCCL_PROTO set by environment to Simple\n"
    frames = frames_from(tmp_path, text)
    comms = frames["nccl_comms"].with_columns(pl.lit("NVIDIA H100 80GB HBM3").alias("gpu_name"))
    trace_comms = pl.DataFrame({"rank": [0, 0, 0, 0, 1], "collective": ["allreduce"] * 5, "bytes": [65536] * 5})
    steps = pl.DataFrame({"rank": [0, 0], "step": [1, 2], "start_ns": [0, 10_000_000],
                          "end_ns": [10_000_000, 20_000_000]})
    job = JobFrames({n: frames[n] for n in frames.present} | {"nccl_comms": comms, "comms": trace_comms,
                                                              "steps": steps})
    (f,) = run_detector(job)[0]
    c = nc.Comm(nranks=4, nnodes=1, ring=nc.Graph(2, 20.6, 12.0))
    one = nc.choose(nc.Comm(**{**c.__dict__, "protos": frozenset({"Simple"})}), "AllReduce",
                    65536)[2] - nc.choose(c, "AllReduce", 65536)[2]
    assert f.metrics["predicted_lost_us_per_step"] == round(2 * one, 1)
    assert abs(f.fraction_of_step - 2 * one / 10_000.0) < 1e-9
    assert abs(f.gpu_seconds_lost - 4 * one * 4 / 1e6) < 1e-12


def test_enable_switches_count_only_when_turned_off(run_detector, tmp_path):
    on = HEALTHY + "nodeA:100:110 [0] NCCL INFO NCCL_NVLS_ENABLE set by environment to 1.\n"
    assert run_detector(frames_from(tmp_path, on))[0] == []
    off = HEALTHY + "nodeA:100:110 [0] NCCL INFO NCCL_NVLS_ENABLE set by environment to 0.\n"
    (f,) = run_detector(frames_from(tmp_path, off, "off.log"))[0]
    assert "NCCL_NVLS_ENABLE=0" in f.summary


def test_clean_protocol_set_by_the_net_plugin_is_not_a_user_override(run_detector, tmp_path):
    from tests.test_nccl_log import EFA_227

    findings, _ = run_detector(frames_from(tmp_path, EFA_227))
    assert [f for f in findings if f.key == "forced"] == []


def test_unnamed_collectives_of_tuning_lines_give_way_to_named_ones(run_detector, tmp_path):
    # 2.20-2.22 TUNING lines name no function: with a COLL line naming AllReduce, AllReduce is what ran
    text = HEALTHY + FORCED + RAN + "nodeA:100:100 [0] NCCL INFO 4194304 Bytes -> Algo 1 proto 2 time 30.0\n"
    (f,) = run_detector(frames_from(tmp_path, text))[0]
    assert f.metrics["ran_under"] == "AllReduce" and "(AllReduce; COLL lines, TUNING lines)" in f.summary
    (g,) = run_detector(frames_from(tmp_path, HEALTHY + FORCED + text.splitlines()[-1] + "\n", "alone.log"))[0]
    assert "(collectives the logs do not name; TUNING lines)" in g.summary and g.severity.value == "warning"
