"""Command line. The only module that talks to the terminal: progress on stderr, results on stdout.

Exit codes: 0 analysis done and nothing at or above ``--fail-on``; 1 findings at or above it (and
only that); 2 bad usage, unreadable input or an output that cannot be written; 3 internal error (a
bug: one line on stderr, the traceback in OUT/crash.txt); 130 interrupted (SIGINT), 143 terminated
(SIGTERM). Text that comes from the input (file, host, kernel names) is never read as rich markup.
"""

from __future__ import annotations

import functools
import importlib
import importlib.abc
import importlib.machinery
import os
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from enum import Enum
from importlib.machinery import ModuleSpec
from pathlib import Path
from types import FrameType, ModuleType
from typing import TYPE_CHECKING, Any, TypeVar

import typer
from rich.console import Console
from rich.text import Text

from forensics import __version__
from forensics.base.errors import ForensicsError, UsageError
from forensics.base.findings import Severity
from forensics.base.lazy import defer_import, imports_without_gc

if TYPE_CHECKING:  # rich.progress is imported when a bar is shown: -q runs never pay for it
    from rich.progress import Progress

EXIT_OK = 0
EXIT_FINDINGS = 1
EXIT_ERROR = 2
EXIT_INTERNAL = 3
EXIT_SIGINT = 130
EXIT_SIGTERM = 143

app = typer.Typer(
    name="forensics",
    help="Why was this distributed GPU training job slow, or why did it die?",
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)
# emoji=False: input text such as the bus id "0000:ab:00.0" must never become an emoji code
err = Console(stderr=True, soft_wrap=True, emoji=False)
out = Console(soft_wrap=True, emoji=False)
F = TypeVar("F", bound=Callable[..., Any])


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread. A KeyboardInterrupt so that code which cleans up on
    Ctrl-C (the parser pool, temporary outputs) cleans up on SIGTERM the same way."""


@dataclass
class _RunState:
    """What the running command is doing, for the one line an interrupt or a bug ends with."""

    phase: str = "start"
    item: str | None = None  # what the phase was handling ("file x", "detector y"), when the pipeline said
    out_dir: Path | None = None  # set once --out passed its checks: crash.txt may go there
    committed: bool = False

    def at(self, phase: str, item: str | None = None) -> None:
        self.phase, self.item = phase, item


_run = _RunState()


class FailOn(str, Enum):
    critical = "critical"
    warning = "warning"
    info = "info"
    never = "never"


def _line(console: Console, label: str, style: str, message: str) -> None:
    """One line: a styled label, then ``message`` as plain text (never parsed as markup)."""
    console.print(Text.assemble((label, style), ": ", " ".join(message.split())), highlight=False)


def _error(message: str) -> None:
    _line(err, "error", "red", message)


# The signal this process got, once it got one. Ctrl-C raises KeyboardInterrupt wherever Python runs next,
# and when that is a Python call made from inside Polars' Rust code, Rust unwraps it into a panic
# (pyo3's PanicException, a BaseException): the command then ends in that panic, not in the interrupt.
_received: list[KeyboardInterrupt] = []


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    _received.append(Terminated())
    raise Terminated()


def _on_sigint(signum: int, frame: FrameType | None) -> None:
    _received.append(KeyboardInterrupt())
    raise KeyboardInterrupt()


def _ended(exc: BaseException) -> int:
    """The exit code for an exception that is not an interrupt: an interrupt still, when a signal came first
    (whatever it surfaced as), else a bug or the machine's state."""
    return _interrupted(_received[0]) if _received else _unexpected(exc)


@contextmanager
def _progress(label: str, quiet: bool) -> Iterator[object]:
    if quiet:
        yield None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[item]}", markup=False),  # a file name is text, not markup
        console=err,
        transient=True,
    ) as bar:
        task = bar.add_task(label, total=None, item="")

        def update(item: str, done: int, total: int) -> None:
            bar.update(task, completed=done, total=total, item=item[-60:])

        yield update


# what each phase counts, for its closing line on stderr
_PHASE_UNITS = {
    "discover": "file(s) found", "parse": "file(s) parsed", "match": "NCCL collective(s) matched across ranks",
    "detect": "detector(s) run", "render": "output(s) rendered", "write": "file(s) written",
}


class _Phases:
    """Progress of a pipeline in phases: a live bar for the phase running, and one line per phase done
    ("parse: 17 file(s) parsed in 1.2 s") so the log shows every phase with its count. Also tells the
    interrupt and crash messages which phase was running. ``quiet``: no output, the phase is still tracked."""

    def __init__(self, quiet: bool) -> None:
        self.quiet = quiet
        self.bar: Progress | None = None
        self.task: Any = None
        self.phase: str | None = None
        self.total = 0
        self.started = 0.0

    def __enter__(self) -> _Phases:
        if not self.quiet:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self.bar = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                                TimeElapsedColumn(), TextColumn("{task.fields[item]}", markup=False),
                                console=err, transient=True)
            self.bar.__enter__()
            self.task = self.bar.add_task("", total=None, item="")
        return self

    def __exit__(self, *exc: object) -> None:
        if exc[0] is None:
            self._close()
        if self.bar is not None:
            self.bar.__exit__(None, None, None)

    def _close(self) -> None:
        if self.phase is not None and self.bar is not None:
            took = time.monotonic() - self.started
            self.bar.console.print(Text(f"{self.phase}: {self.total} {_PHASE_UNITS.get(self.phase, '')} in {took:.1f} "
                                        f"s"),
                                   highlight=False)
        self.phase = None

    def __call__(self, phase: str, item: str, done: int, total: int) -> None:
        if phase != self.phase:
            self._close()
            self.phase, self.started = phase, time.monotonic()
        _run.at(phase, f"{_ITEM_STARTED[phase]} {item}" if item and phase in _ITEM_STARTED else None)
        self.total = max(total, done)
        if self.bar is not None:
            self.bar.update(self.task, description=phase, completed=done, total=total or None, item=item[-60:])


# --- interrupts and internal errors ------------------------------------------------------------

# The phases whose progress reports name the item before handling it (forensics.pipeline.PhaseFn), and what
# that item is; parse reports each file once parsed, so a crash there names the phase only.
_ITEM_STARTED = {"discover": "file", "detect": "detector"}


def _write_crash(text: str) -> Path:
    """crash.txt in --out when it is known and writable, else a file in the temporary folder."""
    from forensics.base.outputs import write_one

    data = text.encode("utf-8", "replace")
    if _run.out_dir is not None:
        try:
            write_one(_run.out_dir / "crash.txt", data)
            return _run.out_dir / "crash.txt"
        except (OSError, ForensicsError):
            pass
    fd, name = tempfile.mkstemp(prefix="forensics-crash-", suffix=".txt")
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    return Path(name)


def _internal_error(exc: BaseException) -> None:
    phase, what = _run.phase, _run.item
    header = f"forensics {__version__}: internal error during {phase}" + (f" ({what})" if what else "")
    body = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    where = _write_crash(f"{header}\ncommand: {' '.join(sys.argv)}\n\n{body}")
    detail = " ".join(f"{type(exc).__name__}: {exc}".split())[:300]
    subject = f" of {what}" if what else ""
    _error(f"internal error during {phase}{subject}: {detail} (a bug, please report it; traceback in {where})")


#: optional modules -> the extra that installs them (a missing one is the user's to install, not a bug)
OPTIONAL_EXTRAS = {"ray": "ray", "holistictraceanalysis": "bench", "hta": "bench", "psutil": "bench"}
_NO_SPACE = (28, 122)  # ENOSPC, EDQUOT
#: how a full disk reads in an error that is no OSError: Polars' (Rust's io::Error) `... (os error 28)`, inside a
#: ComputeError when a Parquet write fails (`parquet: File out of specification: underlying IO error: No space
#: left on device (os error 28)`), and the C library's strerror text
_NO_SPACE_WORDS = ("(os error 28)", "(os error 122)", "No space left on device", "Disk quota exceeded")


def environment_problem(exc: BaseException) -> str | None:
    """One line saying what to do when ``exc`` is the machine's state, not a bug: a full disk or quota, a missing
    optional extra; None otherwise."""
    for e in (exc, exc.__cause__, exc.__context__):
        if e is not None and ((isinstance(e, OSError) and e.errno in _NO_SPACE)
                              or any(w in str(e) for w in _NO_SPACE_WORDS)):
            name = getattr(e, "filename", None)
            where = f" writing {name}" if name else ""
            return f"no space left on the device{where}: free some space or write --out to another disk"
        if isinstance(e, ModuleNotFoundError) and (e.name or "").split(".")[0] in OPTIONAL_EXTRAS:
            mod = (e.name or "").split(".")[0]
            return f"this needs the optional module {mod}: pip install 'trace-forensics[{OPTIONAL_EXTRAS[mod]}]'"
    return None


def _unexpected(exc: BaseException) -> int:
    """The exit code and one line for an exception no command expected: 2 for the machine's state, else 3 (a bug)."""
    problem = environment_problem(exc)
    if problem:
        _error(problem)
        return EXIT_ERROR
    _internal_error(exc)
    return EXIT_INTERNAL


def _interrupted(exc: KeyboardInterrupt) -> int:
    label, code = ("terminated", EXIT_SIGTERM) if isinstance(exc, Terminated) else ("interrupted", EXIT_SIGINT)
    if _run.committed:
        left = f"the outputs in {_run.out_dir} were already complete"
    elif _run.out_dir is not None:
        left = f"no new output written; anything already in {_run.out_dir} is as it was"
    else:
        left = "no output written"
    _line(err, label, "yellow", f"during {_run.phase}; {left}")
    return code


def _command(func: F) -> F:
    """Every command ends in exactly one line for a usage error, an interrupt or a bug."""

    @functools.wraps(func)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        _run.at("start")
        _run.out_dir, _run.committed = None, False
        try:
            return func(*args, **kwargs)
        except typer.Exit:
            raise
        except ForensicsError as exc:
            _error(str(exc))
            raise typer.Exit(EXIT_ERROR) from None
        except KeyboardInterrupt as exc:  # SIGINT, or SIGTERM as Terminated
            raise typer.Exit(_interrupted(exc)) from None
        except (SystemExit, GeneratorExit):
            raise
        except BaseException as exc:  # a bug, or a signal that surfaced as another exception (see _received)
            raise typer.Exit(_ended(exc)) from None

    return guarded  # type: ignore[return-value]


# --- argument checks ---------------------------------------------------------------------------


def _check_input(path: Path) -> None:
    """RUN_DIR: a folder or a single file."""
    if not path.exists():
        raise UsageError(f"{path}: no such file or directory")
    if not (path.is_dir() or path.is_file()):
        raise UsageError(f"{path}: not a folder or a regular file")


def _check_out_dir(inputs: list[Path], out_dir: Path) -> None:
    from forensics.base.outputs import check_out_dir

    for path in inputs:
        _check_input(path)
    check_out_dir(out_dir, inputs)
    _run.out_dir = out_dir


def _fail_threshold(fail_on: FailOn) -> int | None:
    return {"critical": 3, "warning": 2, "info": 1, "never": None}[fail_on.value]


def _print_version(value: bool) -> None:
    if value:
        out.print(f"forensics {__version__}", markup=False, highlight=False)
        raise typer.Exit(EXIT_OK)


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True,
                                 help="print the version and exit"),
) -> None:
    """Why was this distributed GPU training job slow, or why did it die?"""


_WORKERS_HELP = "parser processes, at least 1 [default: CPU count]"


# --- analyze -----------------------------------------------------------------------------------


class TriageEngine(str, Enum):
    """Where files (analyze) or jobs (triage) are parsed and analysed."""

    local = "local"
    ray = "ray"


def _analysis_outputs(analysis: Any, out_dir: Path, phases: _Phases | None = None,
                      timeline_steps: int | None = None) -> Any:
    from forensics.base.outputs import OutputSet, write_parquet
    from forensics.reports import html as html_report
    from forensics.reports import json_report, markdown, perfetto
    from forensics.reports.view_collectives import collectives_parquet_metadata, collectives_table

    tick = phases or (lambda *a: None)
    outs = OutputSet(out_dir)
    tick("render", "findings.json", 0, 3)
    outs.add_bytes("findings.json", json_report.render(analysis))
    tick("render", "summary.md", 1, 3)
    outs.add_text("summary.md", markdown.render(analysis))
    tick("render", "report.html", 2, 3)
    outs.add("report.html", html_report.report_writer(analysis))  # no 5 MB string, plotly.js streamed
    outs.add("collectives.parquet", functools.partial(write_parquet, collectives_table(analysis.context),
                                                      metadata=collectives_parquet_metadata()))
    if timeline_steps is not None:
        outs.add_bytes("timeline.json.gz", perfetto.render(analysis, timeline_steps))
    outs.remove("timeline.json.gz")  # an earlier run's, when this one writes none (kept when it does)
    tick("render", "", 3, 3)
    outs.remove("crash.txt")  # from an earlier run that crashed: this one did not
    return outs


def _commit(outs: Any, phases: _Phases | None = None, count: int = 0) -> None:
    _run.at("write")
    if phases is not None:
        phases("write", "", 0, count)
    outs.commit()
    if phases is not None:
        phases("write", "", count, count)
    _run.committed = True


def _print_analysis(analysis: Any, out_dir: Path) -> None:
    for row in analysis.sources.filter(analysis.sources["status"].is_in(["partial", "failed"])).iter_rows(named=True):
        _line(err, row["status"], "yellow", f"{row['path']}: {row['message']}")
    from forensics.incidents import verdict_text

    for inc in analysis.incidents:  # the verdict: one line per incident, worst first
        out.print(verdict_text(inc), highlight=False, markup=False)
    counts = {s: sum(1 for f in analysis.findings if f.severity.value == s) for s in ("critical", "warning", "info")}
    out.print(
        f"{len(analysis.findings)} finding(s): {counts['critical']} critical, {counts['warning']} warning, "
        f"{counts['info']} info; {len(analysis.skipped)} detector(s) skipped. Report: {out_dir}",
        highlight=False, markup=False,
    )
    for f in analysis.findings[:10]:
        out.print(f"  [{f.severity.value}] {f.title}", highlight=False, markup=False)


@app.command()
@_command
def analyze(
    run_dir: Path = typer.Argument(...,
                                   help="folder a training job left behind (traces, logs, kernel logs), or one file"),
    out_dir: Path | None = typer.Option(None, "--out", "-o",
                                        help="where to write the report [default: ./forensics-<RUN_DIR name>]"),
    fail_on: FailOn = typer.Option(FailOn.critical, "--fail-on",
                                   help="exit 1 when a finding is at or above this severity"),
    settings: list[str] = typer.Option([], "--set",
                                       help="override a detector threshold: DETECTOR.SETTING=VALUE (repeatable)"),
    only: list[str] = typer.Option([], "--only", help="run only this detector (repeatable)"),
    workers: int | None = typer.Option(None, "--workers", min=1, help=_WORKERS_HELP),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="no progress on stderr"),
    timeline: bool = typer.Option(False, "--timeline",
                                  help="also write timeline.json.gz (Perfetto / chrome://tracing)"),
    timeline_steps: int = typer.Option(1, "--timeline-steps", min=0,
                                       help="steps either side of the worst one in the timeline"),
    engine: TriageEngine = typer.Option(TriageEngine.local, "--engine",
                                        help="local: parse on this machine (a process pool); ray: parse files as Ray "
                                             "tasks (pip install 'trace-forensics[ray]')"),
    ray_address: str | None = typer.Option(None, "--ray-address",
                                           help="address of an existing Ray cluster, whose nodes see RUN_DIR at the "
                                                "same path [default: start a local one]"),
) -> None:
    """Analyze RUN_DIR; write findings.json, summary.md, report.html and collectives.parquet to --out."""
    out_dir = out_dir or Path.cwd() / f"forensics-{run_dir.resolve().name}"
    if ray_address and engine is not TriageEngine.ray:
        raise UsageError("--ray-address needs --engine ray")
    _check_out_dir([run_dir], out_dir)
    with imports_without_gc():
        from forensics.detectors import parse_overrides
        from forensics.pipeline import analyze as run_analysis
        from forensics.reports import html as _html  # noqa: F401  (imported here for the collector's sake)

        overrides = parse_overrides(settings)  # imports every detector module
    _run.at("discover")
    with _Phases(quiet) as phases:
        analysis = run_analysis(run_dir, overrides=overrides, only=only or None, progress=phases, workers=workers,
                                engine=engine.value, ray_address=ray_address)
        _run.at("render")
        outs = _analysis_outputs(analysis, out_dir, phases, timeline_steps if timeline else None)
        _commit(outs, phases, count=len(outs.names))
    _print_analysis(analysis, out_dir)
    if not analysis.readable:
        _error(f"no readable trace or log under {run_dir} ({analysis.unreadable_because()}; see run.sources in "
               f"{out_dir / 'findings.json'})")
        raise typer.Exit(EXIT_ERROR)
    threshold = _fail_threshold(fail_on)
    if threshold is not None and any(f.severity.rank >= threshold for f in analysis.findings):
        raise typer.Exit(EXIT_FINDINGS)
    raise typer.Exit(EXIT_OK)


@app.command()
@_command
def frames(
    run_dir: Path = typer.Argument(..., help="folder a training job left behind, or one file"),
    out_dir: Path = typer.Option(..., "--out", "-o", help="folder for <frame>.parquet files"),
    workers: int | None = typer.Option(None, "--workers", min=1, help=_WORKERS_HELP),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="no progress on stderr"),
) -> None:
    """Parse RUN_DIR and write every canonical frame as Parquet (for Polars or DuckDB)."""
    _check_out_dir([run_dir], out_dir)
    from forensics.base.frames import FRAME_SPECS, PARQUET_VERSION_KEY, SCHEMA_VERSION
    from forensics.base.outputs import OutputSet, write_parquet
    from forensics.pipeline import derived_tables, load

    _run.at("parse")
    with _progress("parsing", quiet) as update:
        sources, job = load(run_dir, progress=update, workers=workers)  # type: ignore[arg-type]
    _run.at("render")
    outs = OutputSet(out_dir)
    version = {PARQUET_VERSION_KEY: str(SCHEMA_VERSION)}  # docs/frames.md: how to join process groups
    for name in sorted(job.present):
        outs.add(f"{name}.parquet", functools.partial(write_parquet, job[name], metadata=version))
    for name in FRAME_SPECS:
        outs.remove(f"{name}.parquet")  # frames an earlier run had and this one has not
    for name, table in derived_tables(job).items():  # op categories per step, the ops behind the kernels
        outs.add(f"{name}.parquet", functools.partial(write_parquet, table))
    outs.remove("crash.txt")
    _commit(outs)
    out.print(f"{len(job.present)} frame(s) and 2 derived tables (op_categories, op_attribution) written to {out_dir}"
              f" (frame schema {SCHEMA_VERSION}: kernels and comms name their process group's members by pg_id, "
              "listed in process_groups; kernel and op names are Categorical: cast to String for string functions; "
              "docs/frames.md)", highlight=False, markup=False)
    if sources.filter(sources["status"].is_in(["ok", "partial"])).height == 0:
        _error(f"no readable trace or log under {run_dir}")
        raise typer.Exit(EXIT_ERROR)


# --- triage ------------------------------------------------------------------------------------


def _triage_outputs(run: Any, out_dir: Path) -> Any:
    from forensics.base.outputs import OutputSet
    from forensics.reports import triage_html, triage_json, triage_md

    outs = OutputSet(out_dir)
    run.add_outputs(outs)  # the job files (from staging), the dataset and the state
    outs.add_bytes("triage.json", triage_json.render(run))
    outs.add_text("triage.md", triage_md.render(run))
    outs.add_text("triage.html", triage_html.render(run))
    outs.remove("crash.txt")
    return outs


def _print_triage(run: Any, out_dir: Path) -> None:
    from forensics.fleet.state import job_ranking, recurring_culprits

    out.print(f"{len(run.summaries)} job(s): {len(run.analysed)} analysed, {len(run.summaries) - len(run.analysed)} "
              f"unchanged since the last run. Report: {out_dir / 'triage.html'}", highlight=False, markup=False)
    for row in job_ranking(run.data, run.analysed).head(10).iter_rows(named=True):
        hours = "" if row["job_gpu_hours_lost"] is None else f"{row['job_gpu_hours_lost']:.4g} GPU-h  "
        out.print(f"  {row['worst']:>8}  {row['job_id']}: {hours}{row['top_incident'] or row['reason'] or '-'}",
                  highlight=False, markup=False)
    for row in recurring_culprits(run.data).head(5).iter_rows(named=True):
        out.print(f"  drain candidate: {row['kind']} {row['culprit']}, root cause in {row['jobs']} jobs",
                  highlight=False, markup=False)
    for s in run.summaries:
        if s.status == "failed":
            _line(err, s.job_id, "yellow", str(s.reason))
    if run.found.skipped:
        _line(err, "skipped", "yellow", f"{len(run.found.skipped)} path(s) that are not jobs; listed in triage.md")
    if run.previous.note:
        _line(err, "note", "yellow", run.previous.note)


@app.command()
@_command
def triage(
    job_dirs: list[Path] = typer.Argument(...,
                                          help="one folder of job folders, or several job folders (see --job-depth)"),
    out_dir: Path = typer.Option(..., "--out", "-o",
                                 help="where to write triage.parquet/.json/.md/.html and jobs/<job>/"),
    fail_on: FailOn = typer.Option(FailOn.never, "--fail-on",
                                   help="exit 1 when any job has a finding at or above this severity"),
    settings: list[str] = typer.Option([], "--set",
                                       help="override a detector threshold: DETECTOR.SETTING=VALUE (repeatable)"),
    workers: int | None = typer.Option(None, "--workers", min=1,
                                       help="jobs analysed in parallel (local engine), at least 1 [default: CPU "
                                            "count]"),
    worker_memory: int | None = typer.Option(None, "--worker-memory", min=1,
                                             help="MB of resident memory a local worker may use; a job over it is "
                                                  "ended and becomes a failed row (default: 80% of the machine's "
                                                  "memory shared by the workers)"),
    engine: TriageEngine = typer.Option(TriageEngine.local, "--engine",
                                        help="local: a process pool on this machine; ray: Ray tasks (pip install "
                                             "'trace-forensics[ray]')"),
    ray_address: str | None = typer.Option(None, "--ray-address",
                                           help="address of an existing Ray cluster [default: start a local one]"),
    job_depth: int | None = typer.Option(None, "--job-depth", min=0,
                                         help="jobs are the folders this many levels below each JOB_DIR, e.g. 2 for "
                                              "DIR/<date>/<job> [default: 1 for one JOB_DIR, 0 for several]"),
    rebuild: bool = typer.Option(False, "--rebuild",
                                 help="analyse every job again, also those unchanged since the last run into --out"),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="no progress on stderr"),
) -> None:
    """Analyze many jobs; rank them by GPU-hours lost, name hosts and GPUs that keep being the root cause.
    A second run into the same --out analyses only new or changed jobs."""
    from forensics.detectors import parse_overrides
    from forensics.fleet.triage import find_jobs, run_triage

    overrides = parse_overrides(settings)
    if ray_address and engine is not TriageEngine.ray:
        raise UsageError("--ray-address needs --engine ray")
    _check_out_dir(job_dirs, out_dir)
    _run.at("discover")
    found = find_jobs(job_dirs, job_depth)
    from forensics.reports import triage_json

    _run.at("parse")
    with _progress("jobs", quiet) as update:
        run = run_triage(found, out_dir, overrides=overrides, engine=engine.value, workers=workers,
                         ray_address=ray_address, rebuild=rebuild, progress=update,  # type: ignore[arg-type]
                         render=triage_json.job_files, worker_memory=worker_memory)
    try:
        _run.at("render")
        _commit(_triage_outputs(run, out_dir))
    except BaseException:
        try:
            run.cleanup()
        except KeyboardInterrupt:  # the same Ctrl-C, a second time (see TriageRun.cleanup)
            run.cleanup()
        raise
    run.cleanup()
    _print_triage(run, out_dir)
    if all(s.status == "failed" for s in run.summaries):
        raise typer.Exit(EXIT_ERROR)
    threshold = _fail_threshold(fail_on)
    if threshold is not None and any(
        Severity(sev).rank >= threshold for s in run.summaries for sev, n in s.counts.items() if n
    ):
        raise typer.Exit(EXIT_FINDINGS)


@app.command()
@_command
def diff(
    base_dir: Path = typer.Argument(...,
                                    help="the run that was fine (BASE): a run folder, or an earlier `forensics frames` "
                                         "output"),
    new_dir: Path = typer.Argument(...,
                                   help="the run to explain (NEW): a run folder, or an earlier `forensics frames` "
                                        "output"),
    out_dir: Path = typer.Option(..., "--out", "-o", help="where to write diff.json, diff.md and diff.html"),
    fail_slower: float | None = typer.Option(None, "--fail-slower", min=0.0,
                                             help="exit 1 when NEW's median step is slower than BASE's by more than "
                                                  "this fraction (e.g. 0.05)"),
    warmup: int | None = typer.Option(None, "--warmup", min=0,
                                      help="steps dropped at the start of each run (default: 1 when both runs have 3 "
                                           "or more)"),
    workers: int | None = typer.Option(None, "--workers", min=1, help=_WORKERS_HELP),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="no progress on stderr"),
) -> None:
    """Explain what changed between BASE and NEW: per-step delta by cause, NCCL configuration, kernels, findings."""
    _check_out_dir([base_dir, new_dir], out_dir)
    from forensics.base.outputs import OutputSet
    from forensics.diff import compare, profile
    from forensics.pipeline import analyze as run_analysis
    from forensics.pipeline import analyze_frames, is_frames_output, load_frames_output
    from forensics.reports import diff_html, diff_report

    profiles = []
    for label, path in (("BASE", base_dir), ("NEW", new_dir)):
        _run.at("parse")
        if is_frames_output(path):  # an earlier `forensics frames --out` folder: no parsing again
            analysis = analyze_frames(path, load_frames_output(path))
        else:
            with _Phases(quiet) as phases:
                analysis = run_analysis(path, progress=phases, workers=workers)
        if not analysis.readable:
            _error(f"{label}: no readable trace or log under {path}")
            raise typer.Exit(EXIT_ERROR)
        profiles.append(profile(analysis, path.resolve().name))
    _run.at("render")
    d = compare(profiles[0], profiles[1], warmup=warmup)
    outs = OutputSet(out_dir)
    outs.add_bytes("diff.json", diff_report.render_json(d, str(base_dir), str(new_dir)))
    outs.add_text("diff.md", diff_report.render_md(d))
    outs.add_text("diff.html", diff_html.render(d))
    _commit(outs)
    out.print(d.verdict, highlight=False, markup=False)
    out.print(f"Diff: {out_dir}", highlight=False, markup=False)
    if fail_slower is not None and d.delta_frac is not None and d.delta_frac > fail_slower:
        raise typer.Exit(EXIT_FINDINGS)


class RulesFormat(str, Enum):
    text = "text"
    md = "md"


@app.command()
def rules(
    name: str | None = typer.Argument(None, help="a detector name; all when omitted"),
    fmt: RulesFormat = typer.Option(RulesFormat.text, "--format",
                                    help="text (terminal) or md (Markdown, as in docs/detectors.md)"),
) -> None:
    """Print each detector (or one) with its documentation and its settings table."""
    defer_import("polars")  # the declarations printed here need none of it (0.3 s of start-up)
    from forensics.detectors import load_all
    from forensics.reports import rules as rules_report

    registry = load_all()
    if name and name not in registry:
        raise UsageError(f"unknown detector {name!r}; known: {', '.join(registry)}")
    chosen = [registry[name]] if name else list(registry.values())
    if fmt is RulesFormat.md:
        typer.echo(rules_report.markdown(chosen, intro=name is None), nl=False)
    else:
        typer.echo(rules_report.text(chosen), nl=False)


@app.command()
def docs(
    check: bool = typer.Option(False, "--check", help="write nothing; exit 1 when a generated document is stale"),
    root: Path = typer.Option(Path("."), "--root", help="the checkout whose docs/ to regenerate"),
) -> None:
    """Regenerate every generated document (docs/detectors.md, docs/incidents.md, docs/frames.md,
    docs/collectives.md, and the report templates' code, reports/templates/compiled.json) from its source, or check
    that they are current."""
    from forensics.reports import docs as generated

    if check:
        bad = generated.stale(root)
        if bad:
            typer.echo(f"stale: {', '.join(bad)} (run `forensics docs` to regenerate)", err=True)
            raise typer.Exit(1)
        typer.echo(f"{len(generated.GENERATED)} generated documents are current")
        return
    changed = generated.write(root)
    typer.echo(f"rewrote {', '.join(changed)}" if changed else "every generated document was current")


# --- simulate ----------------------------------------------------------------------------------


def _parse_params(params: list[str]) -> dict[str, str]:
    kv: dict[str, str] = {}
    for item in params:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"--param {item!r}: expected KEY=VALUE")
        kv[key.strip()] = value.strip()
    return kv


def _simulation_target(out_dir: Path | None) -> Path:
    from forensics.base.outputs import check_out_dir

    if out_dir is None:
        raise UsageError("--out DIR is required")
    check_out_dir(out_dir)
    if out_dir.exists() and any(out_dir.iterdir()):
        raise UsageError(f"--out {out_dir} is not empty")
    return out_dir


def _simulate_into(out_dir: Path, truth_path: Path | None, run: Callable[[Path], dict[str, Any]]) -> dict[str, Any]:
    """Simulate into a hidden sibling folder, then rename it to ``out_dir``: an interrupted or failed
    simulation leaves no RUN_DIR that looks complete but is not."""
    import shutil

    from forensics.base.outputs import OutputError, write_one

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_dir.parent / f".{out_dir.name}.{os.getpid()}.tmp"
    try:
        truth = run(tmp)
        _run.at("write")
        if truth_path is not None:
            write_one(truth_path, (tmp / "truth.json").read_bytes())
            (tmp / "truth.json").unlink()
        os.replace(tmp, out_dir)
    except OSError as exc:
        raise OutputError(f"cannot write {out_dir}: {exc.strerror or exc}") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    _run.committed = True
    return truth


@app.command()
@_command
def simulate(
    scenario: str | None = typer.Argument(None,
                                          help="scenario name (see --list); e.g. ddp_clean, ddp_straggler, pp_small_m"),
    out_dir: Path | None = typer.Option(None, "--out", "-o",
                                        help="RUN_DIR to write (created; must be empty or absent)"),
    ranks: int | None = typer.Option(None, "--ranks", help="world size [default: the scenario's]"),
    steps: int | None = typer.Option(None, "--steps",
                                     help="profiled training steps, at least 1 [default: the scenario's]"),
    seed: int = typer.Option(0, "--seed", help="random seed; the same seed gives byte-identical output"),
    size: float | None = typer.Option(None, "--size",
                                      help="keep adding steps until each trace holds about this many MB of JSON "
                                           "(benchmarks)"),
    params: list[str] = typer.Option([], "--param", "-p",
                                     help="scenario parameter KEY=VALUE (repeatable), e.g. rank=3, slowdown=0.1"),
    nccl_version: str | None = typer.Option(None, "--nccl-version",
                                            help="NCCL version to imitate, e.g. 2.18.5 (< 2.19: old ncclKernel_* "
                                                 "names)"),
    truth_path: Path | None = typer.Option(None, "--truth",
                                           help="where to write the ground truth [default: OUT/truth.json]"),
    list_: bool = typer.Option(False, "--list", help="list the scenarios and exit"),
) -> None:
    """Write a simulated RUN_DIR (traces, NCCL logs, kernel logs) with a known, injected fault, plus truth.json."""
    from forensics.simulate import SCENARIOS, check_run_args
    from forensics.simulate import flight_recorder as fr_sim
    from forensics.simulate import simulate as run_simulation
    from forensics.simulate.scenarios import ScenarioError

    if list_ or scenario == "list":
        for sc in SCENARIOS.values():
            out.print(f"{sc.name:20s} {sc.summary}", highlight=False, markup=False)
        for name in fr_sim.SCENARIOS:
            out.print(f"{'fr_' + name:20s} {fr_sim.SUMMARIES[name]}", highlight=False, markup=False)
        raise typer.Exit(EXIT_OK)
    if scenario is None:
        raise UsageError("name a scenario (forensics simulate --list shows them)")
    if scenario.removeprefix("fr_") in fr_sim.SCENARIOS and scenario.startswith("fr_"):
        _simulate_fr(scenario, _simulation_target(out_dir), ranks, _parse_params(params), truth_path)
        return
    if scenario not in SCENARIOS:
        raise UsageError(f"unknown scenario {scenario!r}; known: {', '.join(SCENARIOS)}")
    out_dir = _simulation_target(out_dir)
    kv = _parse_params(params)
    try:
        check_run_args(scenario, ranks=ranks, steps=steps, size_mb=size, params=kv, nccl_version=nccl_version)
    except ScenarioError as exc:
        raise UsageError(str(exc)) from None
    _run.at("simulate")
    truth = _simulate_into(out_dir, truth_path, lambda tmp: run_simulation(
        scenario, tmp, ranks=ranks, steps=steps, seed=seed, size_mb=size, params=kv, nccl_version=nccl_version))
    culprits = sorted({r for f in truth["faults"] for r in f["ranks"]})
    out.print(
        f"{scenario}: {truth['job']['world_size']} ranks on {truth['job']['nodes']} node(s), "
        f"{len(truth['job']['steps'])} step(s); "
        f"culprit rank(s): {culprits or 'none'}. Wrote {out_dir}; ground truth in "
        f"{truth_path or out_dir / 'truth.json'}",
        highlight=False, markup=False,
    )


def _simulate_fr(scenario: str, out_dir: Path, ranks: int | None, kv: dict[str, str], truth_path: Path | None) -> None:
    """A Flight Recorder hang scenario (forensics.simulate.flight_recorder): one dump per rank and truth.json."""
    from forensics.simulate import flight_recorder as fr_sim

    unknown = sorted(set(kv) - {"format", "version", "stacks", "host_names"})
    world = ranks or 16
    if unknown or kv.get("format", "pickle") not in ("pickle", "json") or kv.get("version",
                                                                                 "2.9") not in fr_sim.VERSIONS \
            or world % 4 or world < 8:
        raise UsageError(f"{scenario}: --ranks a multiple of 4 (at least 8); -p format=pickle|json, "
                         f"version={'|'.join(fr_sim.VERSIONS)}, stacks=0|1, host_names=0|1")
    _run.phase = "simulate"
    truth = _simulate_into(out_dir, truth_path, lambda tmp: fr_sim.write(
        scenario.removeprefix("fr_"), tmp, world=world, fmt=kv.get("format", "pickle"),
        version=kv.get("version", "2.9"), stacks=kv.get("stacks") == "1", host_names=kv.get("host_names") == "1"))
    exp = truth["expected"]
    out.print(f"{scenario}: {world} Flight Recorder dumps; device-stuck {exp['device'] or 'none'}, host-stuck "
              f"{exp['host'] or 'none'}, missing dumps {exp['missing_dumps'] or 'none'}. Wrote {out_dir}",
              highlight=False, markup=False)


# --- help without Markdown and pretty tracebacks ------------------------------------------------

HELP_FORMATTER = "typer.rich_utils"
DEFERRED_CLASSES = {"rich.markdown": "Markdown", "rich.traceback": "Traceback"}
"""What typer's rich help formatter imports at its top for two features this command line does not use:
Markdown help text (``rich_markup_mode="markdown"``; ours is typer's default, ``"rich"``) and pretty tracebacks
(``pretty_exceptions_enable=False``). They bring markdown_it and pygments: 170 modules, 0.1-0.2 s of CPU in every
``--help`` and usage error."""


class _Deferred(type):
    """A stand-in for a class of :data:`DEFERRED_CLASSES`: calling it or reading an attribute imports the real
    class, so a use of either feature would still work, only later."""

    module: str
    name: str

    def real(cls) -> Any:
        return getattr(importlib.import_module(cls.module), cls.name)

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        return cls.real()(*args, **kwargs)

    def __getattr__(cls, attr: str) -> Any:
        return getattr(cls.real(), attr)


class _DeferringLoader(importlib.abc.Loader):
    """Runs the help formatter's module with stand-in modules for :data:`DEFERRED_CLASSES` in ``sys.modules``,
    removed again afterwards: a later ``import rich.markdown`` gets the real module."""

    def __init__(self, loader: importlib.abc.Loader) -> None:
        self.loader = loader

    def create_module(self, spec: ModuleSpec) -> ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        stand_ins = {name: _stand_in(name, cls) for name, cls in DEFERRED_CLASSES.items() if name not in sys.modules}
        sys.modules.update(stand_ins)
        try:
            self.loader.exec_module(module)
        finally:
            for name, stand_in in stand_ins.items():
                if sys.modules.get(name) is stand_in:
                    del sys.modules[name]


def _stand_in(module: str, name: str) -> ModuleType:
    stand_in = ModuleType(module)
    setattr(stand_in, name, _Deferred(name, (), {"module": module, "name": name}))
    return stand_in


class _HelpFormatterFinder(importlib.abc.MetaPathFinder):
    """Finds :data:`HELP_FORMATTER` where the path finder does and loads it through :class:`_DeferringLoader`."""

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None) \
            -> ModuleSpec | None:
        if fullname != HELP_FORMATTER:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _DeferringLoader(spec.loader)
        return spec


def _defer_help_imports() -> None:
    if HELP_FORMATTER not in sys.modules and not any(isinstance(f, _HelpFormatterFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _HelpFormatterFinder())


JEMALLOC_CONF = "_RJEM_MALLOC_CONF"
"""Polars' allocator (jemalloc, symbol prefix ``_rjem_``) reads its options from this variable when Polars
is first imported; set by :func:`main` unless the user set it."""


def _jemalloc_conf(cpus: int) -> str:
    """Fewer jemalloc arenas than its default of four per core. Each Polars thread allocates from its own
    arena, and what one arena frees only that arena reuses, so a run that keeps little after its parse
    still holds the pages it freed in all of them: measured on this 2-core machine (docs/performance.md),
    one arena instead of eight took 15-25 MB off the peak of the 53.7 MB trace and 20-45 MB off the
    100 MB kernel-dense one, at the same CPU time. One arena per eight cores keeps many-core machines from
    contending on one arena lock."""
    return f"narenas:{max(1, cpus // 8)}"


def main() -> None:
    """Entry point: a usage error, an interrupt or a bug ends in one line and its exit code, never a traceback."""
    # Polars spreads over all cores by default; parser processes already do that.
    os.environ.setdefault("POLARS_MAX_THREADS", str(os.cpu_count() or 1))
    os.environ.setdefault(JEMALLOC_CONF, _jemalloc_conf(os.cpu_count() or 1))
    signal.signal(signal.SIGTERM, _on_sigterm)
    signal.signal(signal.SIGINT, _on_sigint)
    _defer_help_imports()
    try:
        app()  # typer reports its own usage errors (exit 2) and exits with the command's code
    except ForensicsError as exc:  # from a command without its own guard
        _error(str(exc))
        sys.exit(EXIT_ERROR)
    except KeyboardInterrupt as exc:
        sys.exit(_interrupted(exc))
    except (SystemExit, GeneratorExit):
        raise
    except BaseException as exc:
        sys.exit(_ended(exc))


if __name__ == "__main__":
    main()
