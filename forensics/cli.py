"""Command line. The only module that talks to the terminal: progress on stderr, results on stdout.

Exit codes: 0 analysis done and nothing at or above ``--fail-on``; 1 findings at or above it;
2 bad usage or no readable input.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from enum import Enum
from pathlib import Path

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from forensics.errors import ForensicsError, UsageError
from forensics.findings import Severity

EXIT_OK = 0
EXIT_FINDINGS = 1
EXIT_ERROR = 2

app = typer.Typer(
    name="forensics",
    help="Why was this distributed GPU training job slow, or why did it die?",
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
)
err = Console(stderr=True, soft_wrap=True)
out = Console(soft_wrap=True)


class FailOn(str, Enum):
    critical = "critical"
    warning = "warning"
    info = "info"
    never = "never"


@contextmanager
def _progress(label: str, quiet: bool) -> Iterator[object]:
    if quiet:
        yield None
        return
    with Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[item]}"),
        console=err,
        transient=True,
    ) as bar:
        task = bar.add_task(label, total=None, item="")

        def update(item: str, done: int, total: int) -> None:
            bar.update(task, completed=done, total=total, item=item[-60:])

        yield update


def _check_out_dir(run_dir: Path, out_dir: Path) -> None:
    if not run_dir.is_dir():
        raise UsageError(f"{run_dir}: no such directory")
    run_real, out_real = run_dir.resolve(), out_dir.resolve()
    if out_real == run_real or out_real.is_relative_to(run_real):
        raise UsageError(f"--out {out_dir} is inside RUN_DIR; forensics never writes into the run folder")


def _fail_threshold(fail_on: FailOn) -> int | None:
    return {"critical": 3, "warning": 2, "info": 1, "never": None}[fail_on.value]


@app.command()
def analyze(
    run_dir: Path = typer.Argument(..., help="folder a training job left behind (traces, logs, kernel logs)"),
    out_dir: Path | None = typer.Option(None, "--out", "-o", help="where to write the report [default: ./forensics-<RUN_DIR name>]"),
    fail_on: FailOn = typer.Option(FailOn.critical, "--fail-on", help="exit 1 when a finding is at or above this severity"),
    settings: list[str] = typer.Option([], "--set", help="override a detector threshold: DETECTOR.SETTING=VALUE (repeatable)"),
    only: list[str] = typer.Option([], "--only", help="run only this detector (repeatable)"),
    workers: int | None = typer.Option(None, "--workers", help="parser processes [default: CPU count]"),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="no progress on stderr"),
) -> None:
    """Analyze RUN_DIR; write findings.json, summary.md and report.html to --out."""
    from forensics.analyze import analyze as run_analysis
    from forensics.detectors import parse_overrides
    from forensics.reports import html as html_report
    from forensics.reports import json_report, markdown

    out_dir = out_dir or Path.cwd() / f"forensics-{run_dir.resolve().name}"
    _check_out_dir(run_dir, out_dir)
    overrides = parse_overrides(settings)
    with _progress("parsing", quiet) as update:
        analysis = run_analysis(run_dir, overrides=overrides, only=only or None, progress=update, workers=workers)  # type: ignore[arg-type]
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "findings.json").write_bytes(json_report.render(analysis))
    (out_dir / "summary.md").write_text(markdown.render(analysis), encoding="utf-8")
    (out_dir / "report.html").write_text(html_report.render(analysis), encoding="utf-8")

    for row in analysis.sources.filter(analysis.sources["status"].is_in(["partial", "failed"])).iter_rows(named=True):
        err.print(f"[yellow]{row['status']}[/]: {row['path']}: {row['message']}", highlight=False)
    counts = {s: sum(1 for f in analysis.findings if f.severity.value == s) for s in ("critical", "warning", "info")}
    out.print(
        f"{len(analysis.findings)} finding(s): {counts['critical']} critical, {counts['warning']} warning, "
        f"{counts['info']} info; {len(analysis.skipped)} detector(s) skipped. Report: {out_dir}",
        highlight=False,
    )
    for f in analysis.findings[:10]:
        out.print(f"  [{f.severity.value}] {f.title}", highlight=False, markup=False)
    if not analysis.readable:
        err.print(f"[red]error[/]: no readable trace or log under {run_dir}")
        raise typer.Exit(EXIT_ERROR)
    threshold = _fail_threshold(fail_on)
    if threshold is not None and any(f.severity.rank >= threshold for f in analysis.findings):
        raise typer.Exit(EXIT_FINDINGS)
    raise typer.Exit(EXIT_OK)


@app.command()
def frames(
    run_dir: Path = typer.Argument(..., help="folder a training job left behind"),
    out_dir: Path = typer.Option(..., "--out", "-o", help="folder for <frame>.parquet files"),
    workers: int | None = typer.Option(None, "--workers", help="parser processes [default: CPU count]"),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="no progress on stderr"),
) -> None:
    """Parse RUN_DIR and write every canonical frame as Parquet (for Polars or DuckDB)."""
    from forensics.analyze import load

    _check_out_dir(run_dir, out_dir)
    with _progress("parsing", quiet) as update:
        sources, job = load(run_dir, progress=update, workers=workers)  # type: ignore[arg-type]
    out_dir.mkdir(parents=True, exist_ok=True)
    for name in sorted(job.present):
        job[name].write_parquet(out_dir / f"{name}.parquet")
    out.print(f"{len(job.present)} frame(s) written to {out_dir}", highlight=False)
    if sources.filter(sources["status"].is_in(["ok", "partial"])).height == 0:
        err.print(f"[red]error[/]: no readable trace or log under {run_dir}")
        raise typer.Exit(EXIT_ERROR)


def _write_files(folder: Path, files: dict[str, bytes]) -> None:
    """Write rendered report files (name -> content) into ``folder``; nothing (no folder) when none."""
    if files:
        folder.mkdir(exist_ok=True)
        for name, content in files.items():
            (folder / name).write_bytes(content)


@app.command()
def triage(
    job_dirs: list[Path] = typer.Argument(..., help="one folder holding one subfolder per job, or several job folders"),
    out_dir: Path = typer.Option(..., "--out", "-o", help="where to write triage.json, triage.md and one folder per job"),
    fail_on: FailOn = typer.Option(FailOn.never, "--fail-on", help="exit 1 when any job has a finding at or above this severity"),
    settings: list[str] = typer.Option([], "--set", help="override a detector threshold: DETECTOR.SETTING=VALUE (repeatable)"),
    workers: int | None = typer.Option(None, "--workers", help="jobs analysed in parallel [default: CPU count]"),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="no progress on stderr"),
) -> None:
    """Analyze many jobs at once; rank them worst first and list hosts that recur across jobs."""
    from forensics.detectors import parse_overrides
    from forensics.reports import triage_json, triage_md
    from forensics.triage import host_table, job_table
    from forensics.triage import job_dirs as find_jobs
    from forensics.triage import triage as run_triage

    jobs = find_jobs(job_dirs)
    for job in jobs:
        _check_out_dir(job, out_dir)
    overrides = parse_overrides(settings)
    with _progress("jobs", quiet) as update:
        results = run_triage(jobs, overrides=overrides, workers=workers, progress=update,  # type: ignore[arg-type]
                             render=triage_json.job_files)
    out_dir.mkdir(parents=True, exist_ok=True)
    for res in results:
        _write_files(out_dir / res.name, res.files)
    (out_dir / "triage.json").write_bytes(triage_json.render(results))
    (out_dir / "triage.md").write_text(triage_md.render(results), encoding="utf-8")
    table = job_table(results)
    out.print(f"{len(results)} job(s) analysed. Report: {out_dir}", highlight=False)
    for row in table.head(10).iter_rows(named=True):
        out.print(f"  {row['worst']:>8}  {row['job']}: {row['top_finding'] or '-'}", highlight=False, markup=False)
    hosts = host_table(results)
    recurring = hosts.filter(hosts["jobs"] > 1)
    for row in recurring.head(5).iter_rows(named=True):
        out.print(f"  recurring host {row['host']}: {row['jobs']} jobs ({row['detectors']})", highlight=False, markup=False)
    for res in results:
        if res.error:
            err.print(f"[yellow]{res.name}[/]: {res.error}", highlight=False)
    if all(r.error for r in results):
        raise typer.Exit(EXIT_ERROR)
    threshold = _fail_threshold(fail_on)
    if threshold is not None and any(
        Severity(f["severity"]).rank >= threshold
        for r in results for f in r.findings or []
    ):
        raise typer.Exit(EXIT_FINDINGS)


class RulesFormat(str, Enum):
    text = "text"
    md = "md"


@app.command()
def rules(
    name: str | None = typer.Argument(None, help="a detector name; all when omitted"),
    fmt: RulesFormat = typer.Option(RulesFormat.text, "--format", help="text (terminal) or md (Markdown, as in docs/detectors.md)"),
) -> None:
    """Print each detector (or one) with its documentation and its settings table."""
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
def simulate(
    scenario: str | None = typer.Argument(None, help="scenario name (see --list); e.g. ddp_clean, ddp_straggler, pp_small_m"),
    out_dir: Path | None = typer.Option(None, "--out", "-o", help="RUN_DIR to write (created; must be empty or absent)"),
    ranks: int | None = typer.Option(None, "--ranks", help="world size [default: the scenario's]"),
    steps: int | None = typer.Option(None, "--steps", help="profiled training steps [default: the scenario's]"),
    seed: int = typer.Option(0, "--seed", help="random seed; the same seed gives byte-identical output"),
    size: float | None = typer.Option(None, "--size", help="keep adding steps until each trace holds about this many MB of JSON (benchmarks)"),
    params: list[str] = typer.Option([], "--param", "-p", help="scenario parameter KEY=VALUE (repeatable), e.g. rank=3, slowdown=0.1"),
    nccl_version: str | None = typer.Option(None, "--nccl-version", help="NCCL version to imitate (< 2.19: old ncclKernel_* names)"),
    truth_path: Path | None = typer.Option(None, "--truth", help="where to write the ground truth [default: OUT/truth.json]"),
    list_: bool = typer.Option(False, "--list", help="list the scenarios and exit"),
) -> None:
    """Write a simulated RUN_DIR (traces, NCCL logs, kernel logs) with a known, injected fault, plus truth.json."""
    from forensics.simulate import SCENARIOS
    from forensics.simulate import simulate as run_simulation
    from forensics.simulate.scenarios import ScenarioError

    if list_ or scenario == "list":
        for sc in SCENARIOS.values():
            out.print(f"{sc.name:20s} {sc.summary}", highlight=False)
        raise typer.Exit(EXIT_OK)
    if scenario is None:
        raise UsageError("name a scenario (forensics simulate --list shows them)")
    if scenario not in SCENARIOS:
        raise UsageError(f"unknown scenario {scenario!r}; known: {', '.join(SCENARIOS)}")
    if out_dir is None:
        raise UsageError("--out DIR is required")
    if out_dir.exists() and any(out_dir.iterdir()):
        raise UsageError(f"--out {out_dir} is not empty")
    kv: dict[str, str] = {}
    for item in params:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"--param {item!r}: expected KEY=VALUE")
        kv[key.strip()] = value.strip()
    if ranks is not None and ranks < 1:
        raise UsageError("--ranks must be >= 1")
    try:
        truth = run_simulation(scenario, out_dir, ranks=ranks, steps=steps, seed=seed, size_mb=size, params=kv, nccl_version=nccl_version,
                                 truth_path=truth_path)
    except (ScenarioError, KeyError) as exc:
        raise UsageError(str(exc)) from exc
    culprits = sorted({r for f in truth["faults"] for r in f["ranks"]})
    out.print(
        f"{scenario}: {truth['job']['world_size']} ranks on {truth['job']['nodes']} node(s), {len(truth['job']['steps'])} step(s); "
        f"culprit rank(s): {culprits or 'none'}. Wrote {out_dir}; ground truth in {truth_path or out_dir / 'truth.json'}",
        highlight=False,
    )


def main() -> None:
    """Entry point: user errors become one line on stderr and exit code 2, never a traceback."""
    # Polars spreads over all cores by default; parser processes already do that.
    os.environ.setdefault("POLARS_MAX_THREADS", str(os.cpu_count() or 1))
    try:
        code = app(standalone_mode=False)
        sys.exit(code if isinstance(code, int) else EXIT_OK)
    except ForensicsError as exc:
        err.print(f"[red]error[/]: {exc}", highlight=False)
        sys.exit(EXIT_ERROR)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except typer.Abort:
        err.print("[red]aborted[/]", highlight=False)
        sys.exit(EXIT_ERROR)
    except _usage_exceptions() as exc:  # unknown option, missing argument, bad value
        exc.show(file=sys.stderr)  # type: ignore[attr-defined]
        sys.exit(EXIT_ERROR)


def _usage_exceptions() -> tuple[type[Exception], ...]:
    """Click's usage-error base class: typer >= 0.20 vendors click, older typer uses click itself."""
    found: list[type[Exception]] = []
    try:
        from typer._click.exceptions import ClickException as VendoredClickException

        found.append(VendoredClickException)
    except ImportError:
        pass
    try:
        from click.exceptions import ClickException

        found.append(ClickException)
    except ImportError:
        pass
    return tuple(found)

if __name__ == "__main__":
    main()
