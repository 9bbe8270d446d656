"""Batch triage: the same analysis over many jobs, incremental, on a local process pool or on Ray.

:func:`analyze_job` is the one per-job function both engines run: it analyses one job folder, writes
its report files (as ``forensics analyze`` would) into a staging folder inside OUT, and returns a small
:class:`JobSummary`, so memory stays bounded by one job per worker whatever the number of jobs. It
never raises for a job: a bad input or an internal error becomes a failed summary with the reason.

:func:`run_triage` finds the jobs (:mod:`forensics.fleet.jobs`), reuses the summaries of jobs whose
files did not change since the last run into OUT (the state file), analyses the others, and hands the
caller a :class:`TriageRun` whose outputs it commits in one :class:`~forensics.base.outputs.OutputSet`
(job files moved in from staging, the dataset and pages written): an interrupted run leaves OUT as it was.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl

from forensics import __version__
from forensics.base.errors import ForensicsError, UsageError, is_bug
from forensics.base.outputs import write_parquet
from forensics.base.ray_engine import ray_map
from forensics.base.workers import run_pool
from forensics.fleet.jobs import Discovery, JobRef, find_jobs, fingerprint
from forensics.fleet.state import (
    JOB_FILES,
    SEVERITIES,
    STATE_FILE,
    JobSummary,
    State,
    dataset,
    dump_state,
    load_state,
    state_config,
)
from forensics.incidents import trace_window
from forensics.pipeline import analyze, run_header

if TYPE_CHECKING:
    from forensics.base.outputs import OutputSet
    from forensics.pipeline import Analysis

__all__ = ["JobSummary", "JobTask", "TriageRun", "analyze_job", "find_jobs", "run_triage"]

JobRenderer = Callable[["Analysis"], dict[str, bytes]]
"""Renders one analysed job into its report files (file name -> content); runs in the worker, so it
must be a module-level function (picklable). The CLI passes one from forensics.reports."""
ProgressFn = Callable[[str, int, int], None]
_EPOCH_2000_NS = 946_684_800 * 10**9  # earlier "times" are offsets from an unknown origin, not dates
MIN_WORKER_MEMORY = 512 * 2**20


@dataclass(frozen=True)
class JobTask:
    job_id: str
    path: str
    fingerprint: str
    staging: str | None = None
    """Folder to write the job's report files into (None: no files)."""
    overrides: Mapping[str, Mapping[str, str]] | None = None
    render: JobRenderer | None = None


# --- the per-job function ------------------------------------------------------------------------


def analyze_job(task: JobTask) -> JobSummary:
    """Analyse one job and write its report files; never raises but for interrupts."""
    start = time.time_ns()
    try:
        analysis = analyze(Path(task.path), overrides=task.overrides, workers=1)
        summary = summarize(task, analysis, start)
        summary.files = _write_files(task, analysis)
    except ForensicsError as exc:
        return failed(task, str(exc), start)
    except BaseException as exc:  # a bug (or MemoryError, or a Rust panic) costs this job, not the batch
        if not is_bug(exc):
            raise
        return failed(task, internal_reason(exc), start)
    return summary


def failed(task: JobTask, reason: str, start: int = 0, retry: bool = False) -> JobSummary:
    return JobSummary(task.job_id, task.path, task.fingerprint, "failed", " ".join(reason.split())[:500],
                      tool_version=__version__, analysed_at_ns=start or time.time_ns(), retry=retry)


def internal_reason(exc: BaseException) -> str:
    """The traceback's last line, and where it was raised."""
    last = traceback.format_exception_only(type(exc), exc)[-1].strip()
    tb = traceback.extract_tb(exc.__traceback__)
    where = f" at {Path(tb[-1].filename).name}:{tb[-1].lineno}" if tb else ""
    return f"internal error (a bug, please report it): {last}{where}"


def summarize(task: JobTask, analysis: Analysis, start: int) -> JobSummary:
    run = run_header(analysis)
    counts = {sev: sum(1 for f in analysis.findings if f.severity.value == sev) for sev in SEVERITIES}
    damaged = analysis.sources.filter(pl.col("status").is_in(["partial", "failed"])).height
    lo, hi = job_window(analysis)
    return JobSummary(
        task.job_id, task.path, task.fingerprint,
        "ok" if analysis.readable else "failed", None if analysis.readable else "no readable trace or log",
        lo, hi, run["world_size"], len(run["ranks"]), len(run["hosts"]), len(run["gpus"]), counts, damaged,
        incident_records(analysis, run["gpus"]), [], __version__, start,
    )


def job_window(analysis: Analysis) -> tuple[int | None, int | None]:
    """Wall-clock start and end (Unix ns): the profiled steps, else the kernel-log lines' dates."""
    window = trace_window(analysis.frames)
    if window is not None and window[0] >= _EPOCH_2000_NS:
        return window
    if analysis.frames.has("kernel_events"):
        wall = analysis.frames["kernel_events"]["wall_ns"].drop_nulls()
        wall = wall.filter(wall >= _EPOCH_2000_NS)
        if wall.len():
            return int(wall.min()), int(wall.max())
    return None, None


def incident_records(analysis: Analysis, gpus: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each incident with its root cause's detector and culprits; a GPU is named ``host/pci bus id``."""
    detector = {f.id: f.detector for f in analysis.findings}
    hosts_of: dict[str, list[str]] = {}
    for g in gpus:
        hosts_of.setdefault(g["pci_bus_id"], []).append(g["host"])
    out = []
    for inc in analysis.incidents:
        culprit_gpus = sorted({
            f"{h}/{bus}" for bus in inc.gpus
            for h in ([h for h in hosts_of.get(bus, []) if h in inc.hosts] or list(inc.hosts) or ["?"])
        })
        out.append({
            "id": inc.id, "title": inc.title, "severity": inc.severity.value,
            "root_cause_detector": detector.get(inc.root_cause), "culprit_hosts": list(inc.hosts),
            "culprit_gpus": culprit_gpus, "culprit_ranks": list(inc.ranks), "gpu_hours_lost": inc.gpu_hours_lost,
            "confidence": inc.confidence, "verdict": inc.verdict,
        })
    return out


def _write_files(task: JobTask, analysis: Analysis) -> list[str]:
    if task.render is None or task.staging is None:
        return []
    files = task.render(analysis)
    staging = Path(task.staging)
    staging.mkdir(parents=True, exist_ok=True)
    # Plain writes, no fsync: the staging folder is this run's own, and a file gets into OUT only through
    # the run's OutputSet commit, which fsyncs it there (by then the kernel has mostly written it back).
    for name, data in files.items():
        (staging / name).write_bytes(data)
    return sorted(files)


# --- engines -------------------------------------------------------------------------------------

Done = Callable[[int, JobSummary], None]


def _lost(task: JobTask, why: str) -> JobSummary:
    # retry: the next run tries it again (with more memory, or with the worker that died for another reason)
    hint = "" if "memory limit" in why else " (out of memory?)"
    return failed(task, f"not analysed: {why}{hint}", retry=True)


def machine_memory() -> int:
    """Bytes of memory this process may use: the machine's (MemTotal), or its cgroup's limit when lower."""
    total = 0
    with contextlib.suppress(OSError, ValueError, IndexError):
        with open("/proc/meminfo") as fh:
            total = next(int(line.split()[1]) * 1024 for line in fh if line.startswith("MemTotal:"))
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        with contextlib.suppress(OSError, ValueError):
            limit = int(Path(path).read_text().strip())  # "max" (no limit) is a ValueError
            total = min(total, limit) if total else limit
    return total


def default_worker_memory(n_workers: int) -> int:
    """A local worker's memory bound in bytes: 80% of :func:`machine_memory` shared by the workers,
    at least :data:`MIN_WORKER_MEMORY` (a worker holds about 150-200 MB for a small job)."""
    return max(MIN_WORKER_MEMORY, int(0.8 * machine_memory()) // max(1, n_workers))


def run_local(tasks: list[JobTask], done: Done, workers: int | None, memory_mb: int | None = None) -> None:
    """Every job in a worker process, each bounded to ``memory_mb`` resident MB (None: the default
    share); ``workers`` 1 without ``memory_mb`` runs the jobs here, in this process, unbounded."""
    n = workers if workers is not None else min(os.cpu_count() or 1, len(tasks))
    if (n > 1 and len(tasks) > 1) or memory_mb is not None:
        limit = memory_mb * 2**20 if memory_mb is not None else default_worker_memory(n)
        # Each worker analyses one small job at a time: Polars threads beyond its share of the cores
        # only contend. Spawned workers read the variable when they import Polars.
        saved = os.environ.get("POLARS_MAX_THREADS")
        os.environ["POLARS_MAX_THREADS"] = str(max(1, (os.cpu_count() or 1) // max(1, n)))
        try:
            run_pool(analyze_job, tasks, n, _lost, done, memory_limit=limit, respawn=True)
        finally:
            if saved is None:
                os.environ.pop("POLARS_MAX_THREADS", None)
            else:
                os.environ["POLARS_MAX_THREADS"] = saved
    else:
        for i, task in enumerate(tasks):
            done(i, analyze_job(task))


def run_ray(tasks: list[JobTask], done: Done, address: str | None, in_flight: int = 0) -> None:
    """The same per-job function as Ray tasks (:func:`forensics.base.ray_engine.ray_map`)."""
    ray_map(analyze_job, tasks, _lost, done, address, in_flight)


# --- the run -------------------------------------------------------------------------------------


@dataclass
class TriageRun:
    out_dir: Path
    found: Discovery
    summaries: list[JobSummary]
    """One per job found, in job id order: analysed now or reused from the state."""
    analysed: set[str]
    """Job ids analysed by this run (the others were unchanged)."""
    staging: Path
    config: dict[str, Any]
    previous: State
    data: pl.DataFrame = field(default_factory=pl.DataFrame)

    def add_outputs(self, outs: OutputSet) -> None:
        """The job files (moved in from staging), stale files of jobs gone or re-analysed, the dataset
        and the state, into ``outs`` (the caller adds the pages and commits)."""
        for s in self.summaries:
            if s.job_id not in self.analysed:
                continue
            for name in s.files:
                outs.add(f"jobs/{s.job_id}/{name}", _mover(self.staging / "jobs" / s.job_id / name))
        kept = {s.job_id for s in self.summaries if s.job_id not in self.analysed}
        for old in self.previous.jobs.values():
            if old.job_id not in kept:
                for name in JOB_FILES:
                    outs.remove(f"jobs/{old.job_id}/{name}")
        outs.add_bytes(STATE_FILE, dump_state(self.config, self.summaries))
        outs.add("triage.parquet", self.write_parquet)

    def write_parquet(self, path: Path) -> None:
        """The dataset; the tool version and the schema's doc in the file's metadata (Polars writes it: pyarrow
        took 0.3-0.7 s and 1,500 modules to import, numpy included, for the metadata alone)."""
        write_parquet(self.data, path, {"forensics.version": __version__,
                                        "forensics.schema": "docs/triage.md (triage.parquet)"})

    def cleanup(self) -> None:
        """Remove the staging folder and the job folders left empty. On an interrupt path call it in a
        ``try`` whose ``except KeyboardInterrupt`` calls it again, written out at the call site: a Ctrl-C
        that stops a Polars query raises KeyboardInterrupt twice, once from Polars and once from
        Python's own pending signal at the next call (pola-rs/polars#23988), even a helper's first line."""
        shutil.rmtree(self.staging, ignore_errors=True)
        jobs = self.out_dir / "jobs"
        if jobs.is_dir():
            for dirpath, _, _ in sorted(os.walk(jobs), key=lambda t: -len(t[0])):
                try:
                    os.rmdir(dirpath)  # only empty ones go
                except OSError:
                    pass


def _mover(staged: Path) -> Callable[[Path], None]:
    def write(tmp: Path) -> None:
        os.replace(staged, tmp)

    return write


def _reusable(old: JobSummary | None, job: JobRef, fp: str, out_dir: Path) -> bool:
    if old is None or old.retry or old.fingerprint != fp or old.job_id != job.job_id:
        return False
    return all((out_dir / "jobs" / job.job_id / name).is_file() for name in old.files)


def _read_state(out_dir: Path) -> bytes | None:
    try:
        return (out_dir / STATE_FILE).read_bytes()
    except OSError:
        return None


def run_triage(
    found: Discovery,
    out_dir: Path,
    overrides: Mapping[str, Mapping[str, str]] | None = None,
    engine: str = "local",
    workers: int | None = None,
    ray_address: str | None = None,
    rebuild: bool = False,
    progress: ProgressFn | None = None,
    render: JobRenderer | None = None,
    worker_memory: int | None = None,
) -> TriageRun:
    """Analyse the new or changed jobs of ``found`` (all with ``rebuild``) into a staging folder in
    ``out_dir``; the caller commits :meth:`TriageRun.add_outputs` and calls :meth:`TriageRun.cleanup`.
    ``worker_memory``: MB of resident memory a local worker may hold (:func:`run_local`)."""
    if worker_memory is not None and engine == "ray":
        raise UsageError("--worker-memory bounds the local engine's workers; Ray's own memory monitor bounds its "
                         "workers")
    config = state_config(__version__, {d: dict(kv) for d, kv in (overrides or {}).items()})
    previous = load_state(None if rebuild else _read_state(out_dir), config)
    # absolute: Ray's workers write into it from their own working folders (on a cluster, OUT is a shared folder)
    staging = out_dir.absolute() / f".triage-staging.{os.getpid()}.{secrets.token_hex(4)}"
    by_id: dict[str, JobSummary] = {}
    tasks = []
    for job in found.jobs:
        fp = fingerprint(Path(job.path))
        old = previous.jobs.get(job.path)
        if old is not None and _reusable(old, job, fp, out_dir):
            by_id[job.job_id] = old
        else:
            tasks.append(JobTask(job.job_id, job.path, fp, str(staging / "jobs" / job.job_id), overrides, render))
    run = TriageRun(out_dir, found, [], {t.job_id for t in tasks}, staging, config, previous)

    def done(_i: int, res: JobSummary) -> None:
        by_id[res.job_id] = res
        if progress:
            progress(res.job_id, len(by_id), len(found.jobs))

    try:
        staging.mkdir(parents=True, exist_ok=True)
        if engine == "ray":
            run_ray(tasks, done, ray_address)
        else:
            run_local(tasks, done, workers, worker_memory)
    except BaseException:
        try:
            run.cleanup()
        except KeyboardInterrupt:  # the same Ctrl-C, a second time (see cleanup)
            run.cleanup()
        raise
    run.summaries = [by_id[j] for j in sorted(by_id)]
    run.data = dataset(run.summaries)
    return run
