"""Titles and remediation of the last-words findings, by class (plain text; reports escape it)."""

from __future__ import annotations

from typing import Any

WORDS = {
    "cuda_oom": "CUDA out of memory", "cuda_context_oom": "CUDA could not allocate (CUDA error: out of memory)",
    "illegal_address": "illegal memory access in a CUDA kernel",
    "device_assert": "device-side assertion in a CUDA kernel",
    "launch_failure": "CUDA kernel launch failure", "ecc": "uncorrectable ECC error raised to Python",
    "cuda_unknown": "CUDA unknown error", "cuda_error": "CUDA error",
    "nccl_remote": "NCCL remote error raised to Python", "nccl_system": "NCCL system error raised to Python",
    "nccl_internal": "NCCL internal error raised to Python", "nccl_cuda": "NCCL unhandled CUDA error raised to Python",
    "nccl_usage": "NCCL invalid usage raised to Python", "dist_error": "torch.distributed error raised to Python",
    "dataloader": "data-loader worker failure",
    "nan": "NaN/Inf guard stopped training", "fatal_signal": "fatal signal in the Python process",
    "exception": "Python exception", "truncated": "traceback cut off (no exception line)",
    "exit": "worker exited", "task_exit": "SLURM task exited", "oom_killed": "container OOMKilled (memory limit)",
    "evicted": "pod evicted", "error": "container failed", "gpu_unhealthy": "pod refused: unhealthy GPU",
    "node_oom": "cgroup OOM killer", "step_oom": "SLURM step OOM-killed (host memory)",
    "time_limit": "time limit", "preempted": "preemption", "node_fail": "node failure", "requeue": "requeue",
    "cancelled": "cancelled by a user or administrator (no reason given: scancel)", "cancelled_other": "cancelled",
}


def gib(b: Any) -> str:
    return "?" if not isinstance(b, int) else f"{b / 2**30:.2f} GiB" if b >= 2**30 else f"{b / 2**20:.2f} MiB"


def _exit_line(row: dict[str, Any]) -> str:
    who = [f"rank {row['rank']}" if row.get("rank") is not None else "",
           f"local rank {row['local_rank']}" if row.get("local_rank") is not None else "",
           f"pid {row['pid']}" if row.get("pid") is not None else ""]
    sig = f" ({row['signal']})" if row.get("signal") else ""
    return f"exit code {row.get('exit_code')}{sig} of " + (", ".join(w for w in who if w) or "a worker")


def first_line(row: dict[str, Any]) -> str:
    if row.get("event") == "launcher_failure":
        return _exit_line(row)
    if row.get("event") == "pod":
        code = f" (exit code {row['exit_code']})" if row.get("exit_code") is not None else ""
        return (f"pod {WORDS.get(row.get('cls') or '', row.get('cls'))}{code}: "
                f"{(row.get('message') or '').strip()[:100]}")
    etype, msg = row.get("exc_type"), (row.get("message") or "").strip()
    if row.get("cls") == "device_assert" and "Assertion" in msg:
        msg = msg[msg.rfind("/") + 1:] if "/" in msg.split(":", 1)[0] else msg
        etype = None
    text = f"{etype}: {msg}" if etype and msg and not msg.startswith(etype) else (msg or etype or "")
    return text if len(text) <= 160 else text[:157].rstrip() + "..."


def oom_text(row: dict[str, Any], frag_fraction: float) -> str:
    total, req = row.get("oom_total_bytes"), row.get("oom_requested_bytes")
    ru = row.get("oom_reserved_unallocated_bytes")
    nums = (f"asked for {gib(req)} with {gib(row.get('oom_free_bytes'))} free of {gib(total)}; PyTorch held "
            f"{gib(row.get('oom_allocated_bytes'))} allocated and {gib(ru)} reserved but unallocated")
    frag = isinstance(ru, int) and isinstance(total, int) and total > 0 and (
        ru >= frag_fraction * total or (isinstance(req, int) and ru >= req))
    advice = (" Fragmentation: the reserved-but-unallocated memory would have held the request; set "
              "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (1.x-2.0: max_split_size_mb)." if frag else "")
    return (f"Make the model fit: it {nums}.{advice} Reduce the micro-batch size (or sequence length), enable "
            f"activation checkpointing, "
            "or shard more (FSDP / ZeRO stage, tensor or pipeline parallel). If only this rank failed, find what "
            "differs on it: a pipeline stage holding more layers or the embedding and loss, uneven data (the longest "
            "sequences), or another process on its GPU (`Process N has ... memory in use`).")


def remediation(cls: str, row: dict[str, Any], frag_fraction: float) -> str:
    frame = row.get("user_frame") or row.get("innermost")
    where = f" The frame: {frame}." if frame else ""
    kernel = f" {row['detail']}." if row.get("detail") and cls == "device_assert" else ""
    texts = {
        "cuda_oom": oom_text(row, frag_fraction),
        "cuda_context_oom": "Look for another job or a leftover process on the GPU: CUDA could not allocate at all (no "
                            "allocator numbers), so the GPU was full or shared before the model was built. Check for "
                            "another job or a leftover process on the GPU (nvidia-smi on "
                            "the node) and that each rank has its own device (LOCAL_RANK to CUDA_VISIBLE_DEVICES).",
        "illegal_address": "Fix the code: an illegal memory access is a bug in a kernel (a custom or fused kernel, an "
                           "out-of-range index, a race), not a GPU fault; an Xid 13/31/43/45 beside it is the same "
                           "error. "
                           "Rerun one rank with CUDA_LAUNCH_BLOCKING=1 to get the failing call, then under "
                           f"`compute-sanitizer --tool memcheck`.{where} Do not drain the node.",
        "device_assert": "Fix the data or the code: a device-side assertion is an index out of range (labels >= "
                         "number of classes, token ids >= vocabulary size, a gather/scatter index); rerun with "
                         f"CUDA_LAUNCH_BLOCKING=1 (and TORCH_USE_CUDA_DSA=1) to see the op.{kernel}{where}",
        "launch_failure": "Fix the code or the build: a kernel failed to launch (unspecified launch failure, too many "
                          "resources, no kernel image for this GPU's architecture); rerun with CUDA_LAUNCH_BLOCKING=1 "
                          "and "
                          f"compute-sanitizer, check the custom kernel's build targets.{where}",
        "ecc": "A GPU memory hardware fault: drain the node and have the GPU checked (nvidia-smi -q -d ECC, the kernel "
               "log for Xid 48/63/64/94/95); do not rerun on it.",
        "cuda_unknown": "Check the GPU: CUDA's 'unknown error' usually means it fell off the bus or the driver failed; "
                        "read the kernel log for Xid 79/119/..., run nvidia-smi on the node, drain it if it repeats.",
        "dataloader": "A data-loader worker died or stalled: a bus error in a worker means shared memory (/dev/shm) "
                      "ran "
                      "out (raise the container's shm size) or a worker crashed; lower num_workers, check the storage "
                      "the data is read from, and set a DataLoader timeout so a stall fails fast.",
        "nan": "A NaN/Inf guard stopped training: lower the learning rate or warm it up longer, check loss scaling "
               "(fp16) and gradient clipping, and inspect the batch of that step.",
        "fatal_signal": "The interpreter died of a signal (segmentation fault, abort, bus error): run with "
                        "`python -X faulthandler` and check native extensions and custom kernels." + where,
    }
    if cls in texts:
        return texts[cls]
    if cls.startswith("nccl_") or cls == "dist_error":
        return ("An NCCL error raised to Python is usually a victim: another rank died first or the network failed; "
                "read the first failure, the peer's log and the NCCL WARN lines (`Last error:`).")
    return exit_remediation(row) or (f"Read the traceback and fix the exception.{where}")


def exit_remediation(row: dict[str, Any]) -> str | None:
    sig = row.get("signal")
    if sig == "SIGKILL" or row.get("cls") in ("oom_killed", "node_oom", "step_oom"):
        return ("Killed with no traceback: usually the kernel's or a cgroup's OOM killer (host memory: the node, the "
                "pod's memory limit, the SLURM step), else the scheduler: check the kernel log for `Out of memory: "
                "Killed process`, the pod's lastState (OOMKilled), the scheduler's log; lower host-memory use (data "
                "loader workers, pinned memory, CPU offload) or raise the limit.")
    if sig == "SIGABRT":
        return ("Aborted (SIGABRT): the NCCL watchdog or a C++ exception took the process down; read that rank's "
                "last words and the watchdog's finding.")
    if sig == "SIGSEGV" or sig == "SIGBUS":
        return ("Crashed in native code: run with `python -X faulthandler`, check native extensions, /dev/shm (bus "
                "error).")
    if row.get("cls") == "evicted":
        return "The node ran low on a resource (memory, ephemeral storage): set requests and limits that match use."
    return None


def stop_remediation(cls: str) -> str:
    return {
        "time_limit": "Not a fault: the job reached its time limit. Checkpoint more often than the limit allows (and "
                      "on the scheduler's warning signal: SLURM --signal=USR1@300 with a handler), or ask for a longer "
                      "limit; resume from the last checkpoint.",
        "preempted": "Not a fault: the scheduler preempted the job. Resume from the last checkpoint; keep checkpoints "
                     "frequent and cheap, and let the job requeue (--requeue).",
        "node_fail": "The scheduler lost a node: drain it and check its health; resume from the last checkpoint.",
        "requeue": "The scheduler requeued the job: it resumes from its last checkpoint.",
    }.get(cls, "Cancelled by a user or administrator: nothing in the job to fix; resume from the last checkpoint.")
