"""Shapes with no file among the shared job logs, written here from the formats quoted in
shared/research/wave3.md §2 (each with its source there): srun task exits and step OOM kills, SLURM node
failure, Kubernetes eviction, raw py-spy and gdb dumps, DeepSpeed's launcher, a NaN guard, restarts."""

from __future__ import annotations

from pathlib import Path

from forensics.parsers.lastwords import parse
from forensics.parsers.result import ParseContext


def _rows(tmp_path: Path, text: str, frame: str = "last_words") -> list[dict]:
    path = tmp_path / "job.out"
    path.write_text(text)
    res = parse(path, ParseContext(tmp_path, "job.out"))
    return res.frames[frame].to_dicts() if frame in res.frames else []


def test_srun_task_exits_step_oom_and_node_failure(tmp_path):
    rows = _rows(tmp_path, "srun: error: nid001234: tasks 4-7: Exited with exit code 1\n"
                           "srun: error: nid001235: task 9: Out Of Memory\n"
                           "slurmstepd: error: Detected 1 oom_kill event in StepId=440575.0. Some of the step tasks "
                           "have been OOM Killed.\n"
                           "slurmstepd: error: *** JOB 440575 ON nid001234 CANCELLED AT 2024-02-01T10:00:00 DUE TO "
                           "NODE "
                           "FAILURE, SEE SLURMCTLD LOG FOR DETAILS ***\n")
    assert [(r["event"], r["cls"], r["host"], r["tasks"], r["exit_code"]) for r in rows] == [
        ("task_exit", "task_exit", "nid001234", "4-7", 1), ("task_exit", "out_of_memory", "nid001235", "9", None),
        ("scheduler", "step_oom", None, None, None), ("scheduler", "node_fail", "nid001234", None, None)]


def test_kubernetes_eviction_and_preemption(tmp_path):
    rows = _rows(tmp_path, "status:\n  message: 'The node was low on resource: ephemeral-storage.'\n  phase: Failed\n"
                           "  reason: Evicted\n  conditions:\n  - reason: PreemptionByScheduler\n")
    assert [r["cls"] for r in rows] == ["evicted", "evicted", "preempted"]


def test_raw_pyspy_dump_one_stack_per_thread_and_gdb_python_frames(tmp_path):
    stacks = _rows(tmp_path, 'Process 25585: python train.py\nPython v3.10.12 (/usr/bin/python3.10)\n\n'
                             'Thread 25585 (idle): "MainThread"\n    wait (threading.py:320)\n'
                             '    save (torch/serialization.py:628)\n    save_checkpoint (train.py:90)\n'
                             'Thread 25601 (active): "pin_memory"\n    _pin_memory_loop '
                             '(torch/utils/data/_utils/pin_memory.py:52)\n\n'
                             'Thread 1 (Thread 0x7f1a2b3c4740 (LWP 4242) "python"):\n'
                             '#0  0x00007f1a2b5d in __futex_abstimed_wait_common () from '
                             '/lib/x86_64-linux-gnu/libc.so.6\n'
                             '#1  0x00007f1a2b5e in ncclCommDestroy () from libnccl.so.2\n', "stacks")
    assert [(s["process"], s["thread"], s["main"], s["where"], s["innermost"]) for s in stacks] == [
        ("25585", "MainThread", True, "checkpoint_io", "wait (threading.py:320)"),
        ("25585", "pin_memory", False, "data_loader", "_pin_memory_loop (torch/utils/data/_utils/pin_memory.py:52)"),
        ("25585", "python", False, "collective", "__futex_abstimed_wait_common (/lib/x86_64-linux-gnu/libc.so.6)")]


def test_deepspeed_launcher_exit_and_elastic_restart(tmp_path):
    rows = _rows(tmp_path, "[2024-05-08 08:47:31,261] [ERROR] [launch.py:321:sigkill_handler] ['python', 'train.py'] "
                           "exits with return code = -9\n"
                           "[2024-05-08 08:47:32,000] torch.distributed.elastic.agent.server.api: [WARNING] [default] "
                           "Worker group FAILED. 2/3 attempts left; will restart worker group\n")
    assert [(r["event"], r["exit_code"], r["signal"], r["detail"], r["time_from"]) for r in rows] == [
        ("launcher_failure", -9, "SIGKILL", None, "line"), ("restart", None, None, "2 attempt(s) left", "line")]


def test_nan_guard_raised_as_an_exception(tmp_path):
    rows = _rows(tmp_path, "Traceback (most recent call last):\n  File \"/job/train.py\", line 9, in <module>\n"
                           "    check(loss)\nFloatingPointError: loss is nan at step 1200\n")
    assert [(r["cls"], r["exc_type"], r["user_frame"]) for r in rows] == [
        ("nan", "FloatingPointError", "/job/train.py:9 in <module>")]


def test_a_store_error_a_dead_peer_left_is_a_victim(tmp_path):
    rows = _rows(tmp_path, "[rank3]: torch.distributed.DistBackendError: [3] is setting up NCCL communicator and "
                           "retrieving ncclUniqueId from [0] via c10d key-value store by key '0', but store->get('0') "
                           "got "
                           "error: Connection reset by peer\n")
    assert [(r["rank"], r["cls"]) for r in rows] == [(3, "dist_error")]
