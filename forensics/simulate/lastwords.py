"""The job's own last words for the death scenarios: a rank's traceback (CUDA out of memory, illegal memory
access, an exception in a pipeline stage), torchrun's failure table on its node, py-spy-style stack dumps of a
hang where one rank sits in its data loader, SLURM's cancellation at the time limit or for preemption.

Written after the rank logs (:func:`forensics.simulate.logs.write_stdout_logs`), from the fault and the
times the engine recorded; returns what was written for truth.json (`last_words`)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from forensics.simulate.kineto import EPOCH_NS
from forensics.simulate.model import GPUS_PER_NODE, Job

SLURM_JOB = 4242

_ERRORS = {
    "cuda_oom": (
        [("/job/train.py", 212, "train_step", "loss = model(batch).loss"),
         ("/job/model/attention.py", 88, "forward", "scores = torch.matmul(q, k.transpose(-1, -2))")],
        ["torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 4.00 GiB. GPU {dev} has a total capacity of "
         "79.10 GiB of which 1.12 GiB is free. Including non-PyTorch memory, this process has 77.96 GiB memory in use. "
         "Of the allocated memory 61.25 GiB is allocated by PyTorch, and 15.80 GiB is reserved by PyTorch but unallocated. "
         "If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to "
         "avoid fragmentation.  See documentation for Memory Management  "
         "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"]),
    "illegal_address": (
        [("/job/train.py", 212, "train_step", "loss = model(batch).loss"),
         ("/job/kernels/fused_rope.py", 41, "apply_rope", "fused_rope_cuda.forward(q, k, cos, sin)")],
        ["torch.AcceleratorError: CUDA error: an illegal memory access was encountered",
         "Search for `cudaErrorIllegalAddress' in https://docs.nvidia.com/cuda/cuda-runtime-api/group__CUDART__TYPES.html "
         "for more information.",
         "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might be "
         "incorrect.", "For debugging consider passing CUDA_LAUNCH_BLOCKING=1",
         "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions."]),
    "exception": (
        [("/job/train.py", 212, "train_step", "loss = model(batch).loss"),
         ("/job/pipeline/stage.py", 133, "compute_loss", "return F.cross_entropy(logits, labels)")],
        ["ValueError: Expected input batch_size (8) to match target batch_size (4)."]),
}


def _stamp(ns: int, fmt: str = "%Y-%m-%d_%H:%M:%S") -> str:
    return time.strftime(fmt, time.gmtime(ns // 1_000_000_000))


def _traceback(r: int, death: str, dev: int) -> list[str]:
    frames, exc = _ERRORS[death]
    lines = ["Traceback (most recent call last):", '  File "/job/train.py", line 301, in <module>', "    main()",
             '  File "/job/train.py", line 270, in main', "    train_step(model, batch)"]
    for file, line, func, code in frames:
        lines += [f'  File "{file}", line {line}, in {func}', f"    {code}"]
    return [f"[rank{r}]: {line}" for line in lines + [e.format(dev=dev) for e in exc]]


def _torchrun_table(out: Path, host: str, r: int, st: Any, peers: list[Any], t_die: int) -> str:
    """The culprit node's torchrun log: SIGTERM to its local peers, then the failure table."""
    rel = f"launcher/torchrun-{host}.log"
    lines = [f"W{_stamp(t_die, '%m%d %H:%M:%S')}.000000 {st.pid - 10} torch/distributed/elastic/multiprocessing/api.py:897] "
             f"Sending process {p.pid} closing signal SIGTERM" for p in peers]
    lines += [f"E{_stamp(t_die, '%m%d %H:%M:%S')}.000000 {st.pid - 10} torch/distributed/elastic/multiprocessing/api.py:869] "
              f"failed (exitcode: 1) local_rank: {st.local} (pid: {st.pid}) of binary: /usr/bin/python3",
              "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
              "============================================================", "train.py FAILED",
              "------------------------------------------------------------", "Failures:"]
    for p in peers:
        lines += [f"[{peers.index(p) + 1}]:", f"  time      : {_stamp(t_die + 1_000_000_000)}", f"  host      : {host}",
                  f"  rank      : {p.rank} (local_rank: {p.local})", f"  exitcode  : -15 (pid: {p.pid})",
                  "  error_file: <N/A>", f"  traceback : Signal 15 (SIGTERM) received by PID {p.pid}"]
    lines += ["------------------------------------------------------------", "Root Cause (first observed failure):",
              "[0]:", f"  time      : {_stamp(t_die)}", f"  host      : {host}", f"  rank      : {r} (local_rank: {st.local})",
              f"  exitcode  : 1 (pid: {st.pid})", "  error_file: <N/A>",
              "  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html",
              "============================================================"]
    (out / rel).parent.mkdir(parents=True, exist_ok=True)
    (out / rel).write_text("\n".join(lines) + "\n", encoding="utf-8")
    return rel


def _stacks(out: Path, job: Job, engine: Any, r: int, t: int) -> str:
    """A debug-server stack file: every rank in the gradient all-reduce but ``r``, in its data loader."""
    rel = f"debug/stacks_{_stamp(t, '%Y%m%d%H%M%S')}.txt"
    waiting = ['  File "/usr/lib/python3/site-packages/torch/distributed/distributed_c10d.py", line 2501 in all_reduce',
               '  File "/usr/lib/python3/site-packages/torch/nn/parallel/distributed.py", line 1312 in _sync',
               '  File "/job/train.py", line 215 in train_step']
    loader = ['  File "/usr/lib/python3.11/threading.py", line 331 in wait',
              '  File "/usr/lib/python3.11/queue.py", line 180 in get',
              '  File "/usr/lib/python3/site-packages/torch/utils/data/dataloader.py", line 1133 in _try_get_data',
              '  File "/usr/lib/python3/site-packages/torch/utils/data/dataloader.py", line 1295 in _get_data',
              '  File "/usr/lib/python3/site-packages/torch/utils/data/dataloader.py", line 1329 in _next_data',
              '  File "/job/train.py", line 208 in train_step']
    tail = ['  File "/job/train.py", line 270 in main', '  File "/job/train.py", line 301 in <module>']
    lines: list[str] = []
    for st in engine.states:
        lines += [f"=== Rank {st.rank} ===", f"Thread 0x{0x7f0000000000 + st.pid:x} (most recent call first):",
                  *(loader if st.rank == r else waiting), *tail, ""]
    (out / rel).parent.mkdir(parents=True, exist_ok=True)
    (out / rel).write_text("\n".join(lines), encoding="utf-8")
    return rel


def _insert_after_first_iteration(path: Path, line: str) -> None:
    text = path.read_text(encoding="utf-8").splitlines()
    at = next((i + 1 for i, x in enumerate(text) if "] iteration " in x), len(text))
    path.write_text("\n".join(text[:at] + [line] + text[at:]) + "\n", encoding="utf-8")


def _scheduler_stop(out: Path, engine: Any, f: dict[str, Any], step_log: dict[int, list[tuple[int, int, int]]],
                    offsets: list[int], log0: str) -> dict[str, Any]:
    """SLURM's output file: the step and the job cancelled at the time limit (or preempted) after the last step;
    rank 0's log gets a timed checkpoint save after its first step."""
    end = max(EPOCH_NS + offsets[st.node] + step_log[st.rank][-1][2] for st in engine.states if step_log[st.rank])
    t = end // 1_000_000_000 * 1_000_000_000 + 2_000_000_000
    first = step_log[0][0]
    ck = (EPOCH_NS + offsets[engine.states[0].node] + first[2]) // 1_000_000_000 * 1_000_000_000
    _insert_after_first_iteration(out / log0, f" [{_stamp(ck, '%Y-%m-%d %H:%M:%S')}] saving checkpoint at iteration "
                                              f"{first[0]:8d} to /checkpoints/job in torch format")
    why, host = f["why"], engine.hosts[0]
    lines = ["srun: Job step aborted: Waiting up to 32 seconds for job step to finish.",
             f"slurmstepd: error: *** STEP {SLURM_JOB}.0 ON {host} CANCELLED AT {_stamp(t, '%Y-%m-%dT%H:%M:%S')} DUE TO {why} ***",
             f"slurmstepd: error: *** JOB {SLURM_JOB} ON {host} CANCELLED AT {_stamp(t, '%Y-%m-%dT%H:%M:%S')} DUE TO {why} ***"]
    lines += [f"W{_stamp(t, '%m%d %H:%M:%S')}.500000 {100 + n} torch/distributed/elastic/agent/server/api.py:704] "
              "Received Signals.SIGTERM death signal, shutting down workers" for n in range(len(engine.hosts))]
    rel = f"slurm-{SLURM_JOB}.out"
    (out / rel).write_text("\n".join(lines) + "\n", encoding="utf-8")
    return {"death": "time_limit" if why == "TIME LIMIT" else "preempted", "rank": None, "host": host,
            "wall_ns": t, "checkpoint_wall_ns": ck, "files": [rel, log0]}


def write_last_words(out: Path, job: Job, engine: Any, offsets: list[int], timeout: dict[str, Any] | None,
                     step_log: dict[int, list[tuple[int, int, int]]], log_paths: dict[int, str]) -> dict[str, Any] | None:
    """The last words of the scenario's death (None for scenarios without one)."""
    f = next((f for f in job.faults if f["kind"] in ("app_death", "scheduler_stop")), None)
    if f is None:
        return None
    if f["kind"] == "scheduler_stop":
        return _scheduler_stop(out, engine, f, step_log, offsets, log_paths[0])
    r = f["ranks"][0]
    st = engine.states[r]
    stop = timeout["stop"][r] if timeout is not None and r in timeout["stop"] else step_log[r][-1][2]
    t_die = EPOCH_NS + offsets[st.node] + stop + 1_000_000
    if f["death"] == "dataloader_hang":
        rel = _stacks(out, job, engine, r, t_die + 300_000_000_000)
        return {"death": "dataloader_hang", "rank": r, "host": st.host, "wall_ns": None, "files": [rel]}
    with open(out / log_paths[r], "a", encoding="utf-8") as fh:
        fh.write("\n".join(_traceback(r, f["death"], st.local)) + "\n")
    peers = [p for p in engine.states if p.node == st.node and p.rank != r][: GPUS_PER_NODE - 1]
    rel = _torchrun_table(out, st.host, r, st, peers, t_die)
    return {"death": f["death"], "rank": r, "host": st.host, "wall_ns": t_die // 1_000_000_000 * 1_000_000_000,
            "files": [log_paths[r], rel]}
