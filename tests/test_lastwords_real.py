"""The job's own last words on real public text: ../shared/sample_data/job_logs (SOURCES.md there gives each
file's origin: bigscience-workshop/bigscience chronicles and SLURM outputs @9e64edec for 01-06, the Kubernetes
docs @0189ae0f for 07, public GitHub issues for 08-20). Every expectation below was read off the file by hand
(line numbers, values as printed), not produced by the parser."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

import polars as pl
import pytest
from forensics.parsers.lastwords import parse
from forensics.parsers.result import ParseContext

from forensics.pipeline import analyze
from tests.conftest import shared_path

GiB, MiB, KiB = 2**30, 2**20, 2**10


def _log(prefix: str) -> Path:
    folder = shared_path("job_logs")
    matches = sorted(p for p in folder.iterdir() if p.name.startswith(prefix))
    assert len(matches) == 1, prefix
    return matches[0]


def _rows(prefix: str, frame: str = "last_words") -> list[dict]:
    path = _log(prefix)
    res = parse(path, ParseContext(path.parent, path.name))
    return res.frames[frame].to_dicts() if frame in res.frames else []


def _utc(text: str) -> int:
    return int(datetime.fromisoformat(text).replace(tzinfo=timezone.utc).timestamp()) * 10**9


def _failures(rows: list[dict]) -> list[dict]:
    return [r for r in rows if r["event"] in ("exception", "error_line")]


def test_01_pyspy_groups_one_process_in_its_data_loader_fifteen_in_collectives():
    st = pl.DataFrame(_rows("01_", "stacks"))
    assert st.height == 16
    assert st.filter(pl.col("where") == "data_loader")["process"].to_list() == ["688514"]
    assert st.filter(pl.col("where") == "collective").height == 15
    assert st["thread"].unique().to_list() == ["MainThread"] and st["main"].all()
    dl = st.filter(pl.col("process") == "688514").row(0, named=True)
    assert dl["status"] == "idle" and dl["depth"] == 17 and dl["frames"][:3] == [
        "wait (threading.py:306)", "get (queue.py:179)", "_try_get_data (torch/utils/data/dataloader.py:1011)"]


def test_02_ecc_first_then_the_next_jobs_cuda_error_out_of_memory_at_the_barrier():
    f = _failures(_rows("02_"))
    assert [(r["line"], r["cls"], r["exc_type"]) for r in f] == [
        (20, "ecc", "RuntimeError"), (22, "ecc", "c10::Error"), (65, "cuda_context_oom", "RuntimeError")]
    assert f[0]["message"].startswith("transform: failed to synchronize: cudaErrorECCUncorrectable")
    assert f[0]["user_frame"].endswith("deepspeed/runtime/pipe/engine.py:679 in _exec_backward_pass")
    assert f[0]["frames"] == 8 and f[0]["time_ns"] is None
    # the second job's traceback follows `[2021-08-12 08:19:28,225] [INFO] ...`: the nearest stamp before it
    assert (f[2]["time_ns"], f[2]["time_from"]) == (_utc("2021-08-12 08:19:28") + 225_000_000, "before")
    assert f[2]["user_frame"].endswith("megatron/initialize.py:140 in _compile_dependencies")


def test_03_cuda_unknown_error_in_the_watchdog_thread_of_local_rank_3():
    (r,) = _rows("03_")
    assert (r["local_rank"], r["rank"], r["cls"], r["exc_type"], r["message"]) == (
        3, None, "cuda_unknown", "c10::CUDAError", "CUDA error: unknown error")
    assert r["detail"] == "raised from query at ../aten/src/ATen/cuda/CUDAEvent.h:95"


@pytest.mark.parametrize("prefix,cls,when,job", [
    ("04_", "time_limit", "2021-05-27 21:42:11", "1999616"),
    ("05_", "cancelled", "2021-05-23 08:46:02", "1809577"),
])
def test_04_05_slurm_cancellation_with_and_without_a_reason_and_the_launchers_cleanup(prefix, cls, when, job):
    rows = _rows(prefix)
    sched = [r for r in rows if r["event"] == "scheduler"]
    assert [(r["cls"], r["job"], r["time_ns"], r["time_from"]) for r in sched] == [
        (cls, f"STEP {job}.0", _utc(when), "scheduler"), (cls, f"JOB {job}", _utc(when), "scheduler")]
    assert {r["host"] for r in sched} == {"r6i4n5" if prefix == "04_" else "r6i5n1"}
    assert sum(r["event"] == "launcher_signal" for r in rows) == 64  # `Killing subprocess` x 64
    assert sum(r["event"] == "launcher_stopped" for r in rows) == 16  # `Main process received SIGTERM` x 16
    assert not _failures(rows)


def test_06_interleaved_dataloader_bus_errors_of_two_processes():
    f = _failures(_rows("06_"))
    bus = f[0]
    assert (bus["line"], bus["cls"], bus["repeats"]) == (1, "dataloader", 4)  # four identical lines folded
    killed = [r for r in f if "is killed by signal: Bus error" in (r["message"] or "")]
    assert [(r["line"], r["message"][:30]) for r in killed] == [
        (15, "DataLoader worker (pid 30882) "), (19, "DataLoader worker (pid 30801) ")]
    assert killed[0]["exc_type"] == "RuntimeError" and killed[1]["detail"] == "worker pid 30801, signal Bus error"


def test_07_kubernetes_oomkilled_pod_exit_137():
    rows = _rows("07_")
    first = rows[0]
    assert (first["event"], first["cls"], first["exit_code"], first["signal"]) == ("pod", "oom_killed", 137, "SIGKILL")
    assert first["time_ns"] == _utc("2017-06-20 20:52:19")
    assert [(r["cls"], r["pid"]) for r in rows if r["cls"] == "node_oom"] == [("node_oom", 4481)]


def test_08_torchrun_table_cut_mid_entry_every_rank_sigabrt():
    rows = _rows("08_")
    assert [(r["rank"], r["local_rank"], r["pid"], r["exit_code"], r["signal"], r["first_observed"]) for r in rows] == [
        (None, None, 3437, -6, "SIGABRT", False), (7, 7, 3438, -6, "SIGABRT", False), (0, 0, 3431, -6, "SIGABRT", True)]
    assert rows[2]["time_ns"] == _utc("2025-05-01 11:12:35") and rows[2]["time_from"] == "launcher"
    assert rows[2]["host"] == "472a4389fceb"


def test_09_accelerate_child_failed_error_root_cause_rank_0_sigkill():
    rows = _rows("09_")
    launcher_tb, entry = rows
    assert launcher_tb["role"] == "launcher" and launcher_tb["exc_type"].endswith("ChildFailedError")
    assert (entry["rank"], entry["local_rank"], entry["pid"], entry["exit_code"], entry["signal"]) == (
        0, 0, 14750, -9, "SIGKILL")
    assert entry["first_observed"] is True and entry["job"] == "src/open_r1/grpo_gsm.py"
    assert entry["host"] == "mlxlab115rp2n7682d40d9-20250521025625-6dyyd3-8nir8b-worker"
    assert (entry["time_ns"], entry["time_from"]) == (_utc("2025-05-21 15:43:03"), "launcher")


def test_10_old_elastic_format_local_rank_3_sigkill_and_sigterm_to_the_others():
    rows = _rows("10_")
    failed = [r for r in rows if r["event"] == "launcher_failure"]
    assert [(r["local_rank"], r["pid"], r["exit_code"], r["signal"]) for r in failed] == [(3, 812917, -9, "SIGKILL")]
    assert [(r["pid"], r["signal"]) for r in rows if r["event"] == "launcher_signal"] == [
        (812914, "SIGTERM"), (812915, "SIGTERM"), (812916, "SIGTERM")]
    assert [r["role"] for r in rows if r["event"] == "exception"] == ["launcher"]  # torchrun's own traceback


def test_11_new_format_oom_numbers_and_the_rank_prefixed_tracebacks():
    f = _failures(_rows("11_"))
    oom = next(r for r in f if r["cls"] == "cuda_oom")
    assert (oom["line"], oom["rank"], oom["gpu_index"], oom["exc_type"]) == (11, None, 0, "torch.OutOfMemoryError")
    assert (oom["oom_requested_bytes"], oom["oom_total_bytes"], oom["oom_free_bytes"], oom["oom_process_bytes"],
            oom["oom_allocated_bytes"], oom["oom_reserved_unallocated_bytes"]) == (
        388 * MiB, int(9.68 * GiB), int(95.75 * MiB), int(9.54 * GiB), int(6.61 * GiB), int(2.57 * GiB))
    cut = {r["rank"]: r for r in f if r["cls"] == "truncated"}
    assert cut[6]["innermost"].endswith("fsdp/_flat_param.py:1354 in unshard")
    assert cut[0]["user_frame"] == "/data/cy/LLMlable/grpo/sft/sft.py:67 in <module>"


def test_12_timestamp_and_rank_prefix_peeled_oom_of_rank_3():
    (r,) = _rows("12_")
    assert (r["rank"], r["time_ns"], r["time_from"], r["gpu_index"]) == (3, _utc("2024-11-20 14:37:16"), "line", 3)
    assert (r["oom_requested_bytes"], r["oom_total_bytes"], r["oom_free_bytes"], r["oom_process_bytes"],
            r["oom_allocated_bytes"], r["oom_reserved_unallocated_bytes"]) == (
        132 * MiB, int(79.10 * GiB), 98 * MiB, int(78.89 * GiB), int(70.12 * GiB), int(765.81 * MiB))


def test_13_oldest_oom_format_and_the_chained_traceback():
    oom, chained = _failures(_rows("13_"))
    assert (oom["line"], oom["cls"], oom["exc_type"], oom["gpu_index"]) == (5, "cuda_oom", "RuntimeError", 0)
    assert (oom["oom_requested_bytes"], oom["oom_total_bytes"], oom["oom_allocated_bytes"], oom["oom_free_bytes"],
            oom["oom_reserved_unallocated_bytes"]) == (1024 * MiB, int(15.90 * GiB), int(14.25 * GiB),
                                                       int(991.56 * MiB), 607 * KiB)
    assert (chained["role"], chained["cls"], chained["user_frame"]) == ("chained", "truncated",
                                                                        "memtestcase.py:78 in fwbw")


def test_14_cuda_runtime_out_of_memory_at_the_barrier_then_the_launcher_kills_four():
    rows = _rows("14_")
    f = [r for r in _failures(rows) if r["role"] == "rank"]
    assert [(r["line"], r["cls"]) for r in f] == [(17, "cuda_context_oom")]
    assert f[0]["user_frame"].endswith("nnUNetTrainerV2_DDP.py:160 in initialize")
    assert [r["pid"] for r in rows if r["event"] == "launcher_signal"] == [31867, 31868, 31869, 31870]


def test_15_illegal_memory_access_in_the_watchdog_of_two_runs_and_the_faulthandler_tail():
    rows = _rows("15_")
    assert [(r["line"], r["rank"], r["cls"], r["stamp"]) for r in rows] == [
        (2, 0, "illegal_address", "0504 22:44:08.389636235"), (30, 0, "illegal_address", "0504 23:32:59.338859795")]
    (st,) = _rows("15_", "stacks")
    assert st["frames"] == ["spawn_main (/home/kblueleaf/micromamba/lib/python3.12/multiprocessing/spawn.py:122)",
                            "<module> (<string>:1)"]


def test_16_device_side_assertion_with_its_traceback_and_seven_sigterms():
    rows = _rows("16_")
    a = rows[0]
    assert (a["line"], a["cls"]) == (1, "device_assert")
    assert a["user_frame"] == "/root/data1/yolov8/ultralytics/engine/trainer.py:332 in _do_train"
    assert "IndexKernel.cu:92" in a["detail"]
    assert [r["pid"] for r in rows if r["event"] == "launcher_signal"] == [16074, 16075, 16076, 16078, 16079, 16080,
                                                                           16081]


def test_17_nccl_remote_error_raised_to_python_with_the_ofi_last_error():
    f = _failures(_rows("17_"))
    nccl = [r for r in f if r["cls"] == "nccl_remote"]
    assert [(r["line"], r["rank"], r["exc_type"]) for r in nccl] == [(5, 3, "torch.distributed.DistBackendError")]
    assert nccl[0]["detail"].splitlines()[-1] == (
        "NET/OFI Request 0x7f14cc5b60c0 completed with error. RC: 113. Error: 2 (UNDELIVERABLE). Completed length: 0")


def test_18_the_watchdogs_nccl_error_line_is_the_nccl_logs_not_a_python_exception():
    assert _rows("18_") == []


def test_19_lightning_step_cancelled_at_its_time_limit():
    (r,) = _rows("19_")
    assert (r["cls"], r["job"], r["host"], r["time_ns"]) == (
        "time_limit", "STEP 55595933.0", "maestro-3017", _utc("2025-01-10 15:27:25"))


def test_20_defunct_workers_of_two_listings():
    rows = _rows("20_")
    assert [(r["pid"], r["job"]) for r in rows] == [
        (6472, "process listing at line 15"), (6601, "process listing at line 15"),
        (6474, "process listing at line 15"),
        (6475, "process listing at line 15"), (2834, "process listing at line 48"),
        (2836, "process listing at line 48"),
        (2971, "process listing at line 48"), (2837, "process listing at line 48"),
        (2964, "process listing at line 48")]


# --- what `forensics analyze` now says (verdicts), per file --------------------------------------------------

VERDICTS = {
    "01_": ("Hung: process 688514 in its data loader while 15 of 16 wait in a collective", "critical"),
    "02_": ("Job died: Uncorrectable ECC error raised to Python: RuntimeError: transform: failed to synchronize",
            "critical"),
    "03_": ("Job died: CUDA unknown error on local rank 3: c10::CUDAError: CUDA error: unknown error", "critical"),
    "04_": ("Stopped at 21:42:11: Cancelled by the scheduler: time limit", "warning"),
    "05_": ("Stopped at 08:46:02: Cancelled by the scheduler: cancelled by a user or administrator", "warning"),
    "07_": ("Job died: Container OOMKilled (memory limit)", "critical"),
    "09_": ("Job died: Worker exited: exit code -9 (SIGKILL) of rank 0, local rank 0, pid 14750 on "
            "mlxlab115rp2n7682d40d9-20250521025625-6dyyd3-8nir8b-worker (rank 0)", "critical"),
    "10_": ("Job died: Worker exited on local rank 3: exit code -9 (SIGKILL) of local rank 3, pid 812917", "critical"),
    "12_": ("Job died: CUDA out of memory: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 132.00 MiB",
            "critical"),
    "14_": ("Job died: CUDA could not allocate (CUDA error: out of memory): RuntimeError: CUDA error: out of memory",
            "critical"),
    "15_": ("Job died: Illegal memory access in a CUDA kernel: ProcessGroupNCCL watchdog: CUDA error: an illegal "
            "memory "
            "access was encountered on Amphitrite (rank 0)", "critical"),
    "16_": ("Job died: Device-side assertion in a CUDA kernel: IndexKernel.cu:92", "critical"),
    # the NCCL log lines' immediate error (nccl_comm_failure, #28) now leads; the Python-raised copy follows it
    "17_": ("NCCL communication failure: remote process exited or network error (rank 3)", "critical"),
    "19_": ("Stopped at 15:27:25: Cancelled by the scheduler: time limit", "warning"),
}


@pytest.mark.parametrize("prefix", sorted(VERDICTS))
def test_the_verdict_names_the_first_failure(prefix):
    a = analyze(_log(prefix))
    text, severity = VERDICTS[prefix]
    top = a.incidents[0]
    assert top.verdict.startswith(text) and top.severity.value == severity


def test_time_limit_and_illegal_access_advice():
    a = analyze(_log("19_"))
    stop = next(f for f in a.findings if f.detector == "last_words")
    assert "Checkpoint more often than the limit allows" in stop.remediation
    assert "not a fault" in a.incidents[0].cost_method
    ima = next(f for f in analyze(_log("15_")).findings if f.detector == "last_words")
    assert "CUDA_LAUNCH_BLOCKING=1" in ima.remediation and "compute-sanitizer" in ima.remediation
    assert "Do not drain the node" in ima.remediation


def test_oom_advice_carries_the_numbers_and_fragmentation():
    f = next(f for f in analyze(_log("11_")).findings if f.detector == "last_words")
    assert "asked for 388.00 MiB with 95.75 MiB free of 9.68 GiB" in f.remediation
    assert "2.57 GiB reserved but unallocated" in f.remediation and "expandable_segments:True" in f.remediation
    assert "activation checkpointing" in f.remediation and "micro-batch" in f.remediation
    small = next(f for f in analyze(_log("13_")).findings if f.detector == "last_words")
    assert "expandable_segments" not in small.remediation  # 607 KiB unallocated of 15.90 GiB: not fragmentation
