"""The job's own last words: the first failure of a job that died, and where a hung job's ranks sit.

Its documentation (what it detects, why it matters, how it measures, what to do) is data: ``DOC``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import polars as pl

from forensics.base.findings import CostBasis, Finding, FindingKind, Role, Severity, When
from forensics.base.settings import setting
from forensics.detectors import DetectorDoc, detector
from forensics.detectors.last_words.events import VICTIM_CLASSES, failures, scheduler_stops, timed
from forensics.detectors.last_words.stacks import StackGroups, group_stacks
from forensics.detectors.last_words.texts import WORDS, first_line, remediation, stop_remediation
from forensics.facts.context import JobContext
from forensics.facts.job_year import job_year

EVIDENCE_CAP = 12


DOC = DetectorDoc(
    summary="The job's own last words: the first failure of a job that died, and where a hung job's ranks sit.",
    detects=(
        'The first failure in time across all ranks and sources (a Python traceback, a CUDA error: out of memory '
        "with the allocator's numbers, illegal memory access, device-side assertion, launch failure, ECC; a "
        "data-loader worker's death, a NaN guard, a fatal signal; else torchrun's failure record, an srun task's "
        'exit, a pod OOMKilled); the NCCL errors other ranks raised to Python afterwards (victims); a job '
        'cancelled by the scheduler (time limit, preemption, node failure, scancel); in stack dumps of a hung job '
        '(py-spy, faulthandler, debug-server, gdb), the ranks whose main thread is somewhere other than the '
        "majority's (their data loader, checkpoint I/O, a lock); worker processes left `<defunct>`."
    ),
    matters=(
        "Most jobs die of their own errors, and other ranks' watchdog timeouts minutes later are only the "
        'consequence: blaming the ranks that timed out, or the hardware, sends the fix to the wrong place. A job '
        'the scheduler cancelled did not fail at all.'
    ),
    measures=(
        "last_words rows (forensics.parsers.lastwords) placed in time: the line's own stamp, the nearest dated "
        "line before it, year-less glog stamps in the job's year, else torchrun's record of that rank; the "
        'earliest timed failure wins (ties: torchrun\'s "first observed failure", then file order). Other ranks\' '
        'failures of the same class join it; NCCL errors raised to Python are victims. Scheduler stops from '
        'slurmstepd `CANCELLED ... DUE TO` lines and pod status. Stacks: main threads grouped by `where` and by '
        'their innermost six frames; when more than `stack_majority` of them are in one place, the others are the '
        'suspects, else a stack alone beside larger groups.'
    ),
    todo=(
        "By class: out of memory (the allocator's numbers, expandable_segments when reserved-but-unallocated is "
        'large, micro-batch size, activation checkpointing, why this rank alone); illegal memory access and '
        'device-side asserts (CUDA_LAUNCH_BLOCKING=1, compute-sanitizer, the kernel or frame named: fix the code, '
        'never drain the node); data-loader stalls (workers, shared memory, storage); time limits (checkpoint '
        'interval against the limit); SIGKILL without a traceback (the OOM killer: kernel log, pod status).'
    ),
)
APP_FAILURE = FindingKind(
    "app_failure", "the job's first failure in its own words: a rank's traceback or CUDA error, else the launcher's "
    "record of a worker's death or a pod's", Role.FAULT,
    "Fix what the first failure says (its class's advice); the other ranks' timeouts and NCCL errors follow from it.",
    stage=0, ends_job=True)
SCHEDULER_STOP = FindingKind(
    "scheduler_stop", "the scheduler cancelled the job (time limit, preemption, node failure, scancel): not a fault "
    "of the job; what fails after it is its doing", Role.CONFIG,
    "Checkpoint more often than the limit allows, or ask for a longer one; resume from the last checkpoint.", stage=-1)
NCCL_RAISED = FindingKind(
    "nccl_raised", "NCCL (or torch.distributed) errors raised to Python on some ranks: usually victims of another "
    "rank's failure or of the network", Role.SYMPTOM,
    "Read the first failure and the NCCL log of the peer that went away.", stage=3)
STUCK_RANK = FindingKind(
    "stuck_rank", "in stack dumps of a hung job, the ranks whose main thread is somewhere other than the majority's "
    "(their data loader, checkpoint I/O, a lock)", Role.HANG,
    "Look at what the suspect waits for (data loader workers, storage, the lock's holder).", stage=1)
DEFUNCT = FindingKind(
    "defunct_workers", "worker processes left <defunct> beside live ones: the launcher did not stop the job",
    Role.SYMPTOM, "Find why the workers exited and make the launcher stop the job when one dies.", stage=3)
_METRIC_COLS = ("cls", "exc_type", "source", "line", "local_rank", "pid", "time_from", "user_frame", "innermost",
                "exit_code", "signal", "oom_requested_bytes", "oom_total_bytes", "oom_free_bytes", "oom_process_bytes",
                "oom_allocated_bytes", "oom_reserved_unallocated_bytes", "gpu_index", "detail")


@dataclass(frozen=True)
class LastWordsConfig:
    """Thresholds of the last-words checks."""

    frag_fraction: float = setting(0.1, unit="fraction of GPU memory", low=0.0, high=1.0,
                                   doc="CUDA OOM: reserved-but-unallocated memory above this share of the GPU "
                                       "(or above the request) gets the fragmentation advice")
    stack_majority: float = setting(0.5, unit="fraction of stacks", low=0.0, high=1.0,
                                    doc="stacks outside the place where more than this share of main threads sit "
                                        "are the suspects")


def _when(t: int | None, how: str | None) -> When:
    if t is None:
        return When.unknown("no time on the line, before it, or in the launcher's record")
    return When.span(t, t, {"line": "the stamp on its line", "before": "the nearest timestamped line before it",
                            "launcher": "torchrun's failure record (its local time read as UTC)",
                            "scheduler": "the scheduler's own time"}.get(how or "", "its line"))


def _hms(ns: int | None) -> str | None:
    return None if ns is None else datetime.fromtimestamp(ns / 1e9, tz=timezone.utc).strftime("%H:%M:%S")


def _evidence(row: dict[str, Any], role: str) -> dict[str, Any]:
    return {"role": role, "rank": row.get("rank"), "local_rank": row.get("local_rank"), "host": row.get("host"),
            "source": row.get("source"), "line": row.get("line"), "time_ns": row.get("t_ns"),
            "time_from": row.get("t_from"), "class": row.get("cls"), "first_line": first_line(row),
            "user_frame": row.get("user_frame"), "exit_code": row.get("exit_code"), "signal": row.get("signal"),
            "traceback": row.get("traceback")}


@dataclass(frozen=True)
class _FirstFailure:
    """What the first failure measured: its row, the same error on other events, the launcher's SIGTERMs."""

    first: dict[str, Any]
    same: pl.DataFrame  # other events of the same class
    failures: int  # rank failures found in all
    sigterms: int  # workers the launcher terminated

    @property
    def same_ranks(self) -> str:
        return ",".join(str(r) for r in sorted(set(self.same["rank"].drop_nulls().to_list())))


def _measure_first(t: pl.DataFrame) -> _FirstFailure | None:
    fails = failures(t)
    if fails.height == 0:
        return None
    first = fails.row(0, named=True)
    if first["event"] == "launcher_failure" and first.get("signal") in ("SIGABRT", "SIGTERM") and \
            fails["signal"].drop_nulls().unique().to_list() == [first["signal"]]:
        return None  # every worker aborted alike: the watchdog's (or the agent's) doing, not a first failure
    same = fails.filter((pl.col("cls") == first["cls"]) & (pl.col("order") != first["order"]))
    return _FirstFailure(first, same, fails.height, t.filter(pl.col("event") == "launcher_signal").height)


def _first_words(m: _FirstFailure) -> tuple[str, str]:
    """The first failure in words: title and summary."""
    first, same, rank, host = m.first, m.same, m.first.get("rank"), m.first.get("host")
    who = f"rank {rank}" if rank is not None else f"local rank {first['local_rank']}" if first.get(
        "local_rank") is not None else "a rank (not named)"
    words = WORDS.get(first["cls"], first["cls"])
    also = f" The same error on {same.height} more event(s)" + (
        f" (ranks {m.same_ranks})" if m.same_ranks else "") + "." if same.height else ""
    when = f" at {first['t_from']} time" if first.get("t_from") else " (no time in the inputs: first in file order)"
    on = "" if rank is not None or first.get("local_rank") is None else " on " + who
    return (f"{words[:1].upper() + words[1:]}{on}: {first_line(first)}",
            f"First failure: {words} on {who}{' of ' + host if host else ''}, {first['source']} line "
            f"{first['line']}{when}.{also}"
            + (f" The launcher then terminated {m.sigterms} worker(s)." if m.sigterms else ""))


def _first_failure(t: pl.DataFrame, cfg: LastWordsConfig) -> Finding | None:
    m = _measure_first(t)
    if m is None:
        return None
    first, rank, host = m.first, m.first.get("rank"), m.first.get("host")
    metrics: dict[str, Any] = {k: first.get(k) for k in _METRIC_COLS}
    metrics.update(time_from=first.get("t_from"), first_line=first_line(first), same_error_ranks=m.same_ranks,
                   same_error_count=m.same.height, workers_terminated=m.sigterms, job_died=True)
    if first.get("t_ns") is not None:
        metrics["fault_wall_ns"] = int(first["t_ns"])
    title, summary = _first_words(m)
    return Finding(
        detector="last_words", severity=Severity.CRITICAL, title=title, summary=summary,
        remediation=remediation(first["cls"], first, cfg.frag_fraction),
        ranks=(int(rank),) if rank is not None else (), hosts=(host,) if host else (),
        metrics=metrics, key=f"first:{first['cls']}", kind=APP_FAILURE.name,
        when=_when(first.get("t_ns"), first.get("t_from")), process_group=first.get("pg"),
        confidence="high" if first.get("t_ns") is not None or m.failures == 1 else "medium",
        evidence=tuple([_evidence(first, "culprit")]
                       + [_evidence(r, "same error") for r in m.same.head(EVIDENCE_CAP).iter_rows(named=True)]),
    )


def _victims_words(v: pl.DataFrame, ranks: list[int]) -> tuple[str, str]:
    """The NCCL errors raised to Python (their rows, first first) in words: title and summary."""
    first = v.row(0, named=True)
    return (f"NCCL error raised to Python on {len(ranks) or v.height} rank(s): {WORDS[first['cls']]}",
            f"{first_line(first)} ({first['source']} line {first['line']}). " + (
                f"NCCL's last error: {first['detail'].splitlines()[-1]}. " if first.get("detail") else "")
            + "A rank that reports an NCCL error is usually a victim of another rank's failure or of the network.")


def _victims(t: pl.DataFrame) -> Finding | None:
    v = t.filter(pl.col("cls").is_in(VICTIM_CLASSES) & (pl.col("role") == "rank"))
    if v.height == 0:
        return None
    ranks = sorted(set(v["rank"].drop_nulls().to_list()))
    first = v.row(0, named=True)
    metrics: dict[str, Any] = {"events": v.height, "first_line": first_line(first), "detail": first.get("detail")}
    if first.get("t_ns") is not None:
        metrics["time_ns"] = int(first["t_ns"])
    title, summary = _victims_words(v, ranks)
    return Finding(
        detector="last_words", severity=Severity.WARNING, title=title, summary=summary,
        remediation=remediation(first["cls"], first, 0.1), ranks=tuple(int(r) for r in ranks), metrics=metrics,
        key="victims", confidence="medium", kind=NCCL_RAISED.name, when=_when(first.get("t_ns"), first.get("t_from")),
        process_group=",".join(sorted(str(p) for p in v["pg"].drop_nulls().unique())) or None,
        evidence=tuple(_evidence(r, "victim") for r in v.head(EVIDENCE_CAP).iter_rows(named=True)))


def _stop(t: pl.DataFrame) -> Finding | None:
    stops = scheduler_stops(t)
    if stops.height == 0:
        return None
    s = stops.row(0, named=True)
    cls = s["cls"]
    metrics: dict[str, Any] = {"cls": cls, "job": s.get("job"), "batch_host": s.get("host"), "source": s["source"],
                               "line": s["line"], "first_line": first_line(s)}
    if s.get("t_ns") is not None:
        metrics["time_ns"] = int(s["t_ns"])
    title, summary = _stop_words(s)
    return Finding(
        detector="last_words", severity=Severity.CRITICAL if cls == "node_fail" else Severity.WARNING,
        title=title, summary=summary,
        remediation=stop_remediation(cls), metrics=metrics, key=f"scheduler:{cls}", confidence="high",
        kind=SCHEDULER_STOP.name, when=_when(s.get("t_ns"), s.get("t_from")),
        cost=CostBasis(fatal=True, died_ns=s.get("t_ns"), hung_s=0.0),
        evidence=tuple(_evidence(r, "scheduler") for r in stops.head(EVIDENCE_CAP).iter_rows(named=True)))


def _stop_words(s: dict[str, Any]) -> tuple[str, str]:
    """The scheduler's stop (its first row) in words: title and summary."""
    when = _hms(s.get("t_ns"))
    return (f"Cancelled by the scheduler: {WORDS.get(s['cls'], s['cls'])}",
            f"{s.get('job') or 'The job'}{' on ' + s['host'] if s.get('host') else ''} was cancelled"
            f"{' at ' + when if when else ''}: {first_line(s)}. Not a fault of the job: what followed (workers "
            "terminated, timeouts, errors) is the cancellation's doing.")


def _stacks(stacks: pl.DataFrame, cfg: LastWordsConfig) -> Finding | None:
    g = group_stacks(stacks, cfg.stack_majority)
    if g.suspects.height == 0:
        return None
    sus = g.suspects
    where = sus["where"].mode().sort().to_list()[0]
    members = sus["member"].to_list()
    ranks = tuple(sorted({int(r) for r in sus["rank"].drop_nulls().to_list()}))
    evidence = [{"role": "group", "where": r["where"], "count": r["n"], "members": ", ".join(r["member"][:16]),
                 "stack": r["stack"]} for r in g.groups.head(EVIDENCE_CAP).iter_rows(named=True)]
    title, summary = _stacks_words(g, where)
    return Finding(
        detector="last_words", severity=Severity.CRITICAL, title=title, summary=summary,
        remediation=_stack_advice(where), ranks=ranks,
        metrics={"where": where, "suspects": ", ".join(members[:32]), "stacks": g.n, "groups": g.groups.height,
                 "majority_where": g.majority_where},
        key="stacks", confidence="medium", evidence=tuple(evidence), kind=STUCK_RANK.name,
        when=When.unknown("stack dumps carry no time the parser reads"))


_PLACE = {"data_loader": "its data loader", "checkpoint_io": "checkpoint I/O", "lock": "a lock",
          "collective": "a collective", "compute": "compute (no wait on its stack)"}


def _stacks_words(g: StackGroups, where: str) -> tuple[str, str]:
    """The stack groups (the suspects at ``where``) in words: title and summary."""
    members, inner = g.suspects["member"].to_list(), g.suspects.row(0, named=True)
    majority = f"{g.n - g.suspects.height} of {g.n} wait in {_PLACE.get(g.majority_where or '', g.majority_where)}"
    return (f"Hung: {', '.join(members[:4])}{' ...' if len(members) > 4 else ''} in {_PLACE.get(where, where)} "
            f"while {majority}",
            f"Stack dumps of {g.n} process(es) in {g.groups.height} group(s); the odd one(s) out: "
            f"{', '.join(members[:8])} at {inner['innermost']} ({where}). The others wait for it.")


def _stack_advice(where: str) -> str:
    return {
        "data_loader": "The suspect waits for its data loader: a worker deadlocked or died, or storage is slow. Try "
                       "num_workers=0 for that loop to confirm, check the workers (py-spy dump --subprocesses) and the "
                       "storage, and set a DataLoader timeout so a stall fails fast.",
        "checkpoint_io": "The suspect is saving or loading a checkpoint: check the storage (latency, quota) and make "
                         "checkpointing asynchronous or less frequent.",
        "lock": "The suspect waits on a lock: a deadlock between threads; dump it with py-spy --native and check "
                "which thread holds the lock.",
        "collective": "The suspect is in a different collective from the others: a desynchronised code path "
                      "(data-dependent branch, uneven batches); set TORCH_NCCL_DESYNC_DEBUG=1.",
    }.get(where, "The suspect is computing while the others wait: a slow step or an infinite loop on that rank.")


def _defunct(t: pl.DataFrame) -> Finding | None:
    d = t.filter(pl.col("event") == "worker_exited").with_columns(
        pl.col("detail").str.extract(r"depth (\d+)").cast(pl.Int32).alias("_depth"))
    if d.height == 0:
        return None
    d = d.filter(pl.col("_depth") == pl.col("_depth").min().over("job"))  # the workers, not their children
    title, summary = _defunct_words(d)
    return Finding(
        detector="last_words", severity=Severity.WARNING, title=title, summary=summary,
        remediation="Find why those workers exited (their last words, the kernel log); make the launcher stop the job "
                    "when a worker dies (torchrun does by default; check the wrapper).",
        metrics={"defunct": d.height}, key="defunct", confidence="medium", kind=DEFUNCT.name,
        when=When.unknown("a process listing carries no time"))


def _defunct_words(d: pl.DataFrame) -> tuple[str, str]:
    """The defunct workers (one row each: job, pid) in words: title and summary."""
    return (f"{d.height} worker process(es) left <defunct> in {d['job'].n_unique()} process listing(s) while others "
            "still run",
            "A process listing shows exited workers (pids " + ", ".join(str(p) for p in d["pid"].to_list()[:12])
            + ") beside live ones: the launcher did not tear the job down, so the survivors wait in their next "
              "collective until a timeout.")


@detector("last_words", settings=LastWordsConfig, doc=DOC, requires_any=("last_words", "stacks"),
          kinds=(APP_FAILURE, SCHEDULER_STOP, NCCL_RAISED, STUCK_RANK, DEFUNCT), view="hw-events")
def detect(ctx: JobContext, cfg: LastWordsConfig) -> list[Finding]:
    found: list[Finding | None] = []
    if ctx.frames.has("last_words"):
        t = timed(ctx.frames["last_words"], job_year(ctx.frames))
        found += [_stop(t), _first_failure(t, cfg), _victims(t), _defunct(t)]
    if ctx.frames.has("stacks"):
        found.append(_stacks(ctx.frames["stacks"], cfg))
    return [f for f in found if f is not None]
