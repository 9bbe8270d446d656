"""forensics triage: job discovery, the per-job function, the dataset and its pages, incremental runs."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote

import pyarrow.parquet as pq
import pytest

from forensics.base.errors import UsageError
from forensics.fleet.jobs import find_jobs, fingerprint
from forensics.fleet.state import (
    JobSummary,
    dataset,
    dump_state,
    job_ranking,
    load_state,
    recurring_culprits,
    state_config,
)
from forensics.fleet.triage import JobTask, analyze_job, run_triage
from tests.conftest import ROOT

SAMPLES = ROOT / "sample_traces"
ODD = "odd|job`<b>[x]"  # a job name made of the characters Markdown and HTML give meaning to


def _inc(iid: str, sev: str, hosts: list[str], gpus: list[str], hours: float | None) -> dict:
    return {"id": iid, "title": f"title {iid}", "severity": sev, "root_cause_detector": "gpu_hw_error",
            "culprit_hosts": hosts, "culprit_gpus": gpus, "culprit_ranks": [1], "gpu_hours_lost": hours,
            "confidence": "high", "verdict": f"verdict {iid}"}


def _sum(job: str, incidents: list[dict], status: str = "ok", counts: dict | None = None) -> JobSummary:
    return JobSummary(job, f"/fleet/{job}", f"fp-{job}", status, None if status == "ok" else "broken",
                      incidents=incidents, counts=counts or {}, files=["report.html"] if status == "ok" else [])


# --- the dataset ---------------------------------------------------------------------------------


def test_dataset_one_row_per_job_and_incident_clean_and_failed_jobs_one_row_each():
    rows = dataset([
        _sum("b", [_inc("i1", "critical", ["n1"], ["n1/0000:01:00.0"], 2.0), _inc("i2", "info", ["n2"], [], None)]),
        _sum("a", []),
        _sum("c", [], status="failed"),
    ])
    assert rows["job_id"].to_list() == ["a", "b", "b", "c"]
    assert rows["incident_id"].to_list() == [None, "i1", "i2", None]
    assert rows["incident_rank"].to_list() == [None, 1, 2, None]
    assert rows["status"].to_list() == ["ok", "ok", "ok", "failed"]
    assert rows["reason"].to_list() == [None, None, None, "broken"]
    assert rows["job_gpu_hours_lost"].to_list() == [None, 2.0, 2.0, None]  # the job's sum, on each of its rows
    assert rows["report"].to_list() == ["jobs/a/report.html", "jobs/b/report.html", "jobs/b/report.html", None]
    assert rows.filter(rows["incident_id"] == "i1")["culprit_gpus"].to_list() == [["n1/0000:01:00.0"]]


def test_jobs_ranked_by_gpu_hours_lost_then_severity():
    data = dataset([
        _sum("small", [_inc("s", "critical", ["n1"], [], 0.5)], counts={"critical": 1}),
        _sum("big", [_inc("b1", "warning", ["n2"], [], 3.0), _inc("b2", "info", ["n2"], [], 1.0)],
             counts={"warning": 1, "info": 1}),
        _sum("clean", []),
        _sum("broken", [], status="failed"),
        _sum("nocost", [_inc("n", "critical", ["n3"], [], None)], counts={"critical": 1}),
    ])
    table = job_ranking(data, {"big"})
    assert table["job_id"].to_list() == ["big", "small", "broken", "nocost", "clean"]
    assert table["job_gpu_hours_lost"].to_list() == [4.0, 0.5, None, None, None]
    assert table["worst"].to_list() == ["warning", "critical", "failed", "critical", "clean"]
    assert table["new"].to_list() == [True, False, False, False, False]


def test_recurring_culprits_are_root_causes_in_two_or_more_jobs():
    gpu = "n1/0000:01:00.0"
    data = dataset([
        _sum("j1", [_inc("a", "critical", ["n1"], [gpu], 1.0), _inc("b", "warning", ["n9"], [], 0.5)]),
        _sum("j2", [_inc("c", "critical", ["n1"], [gpu], 2.0)]),
        _sum("j3", [_inc("d", "warning", ["n1"], ["n1/0000:02:00.0"], None), _inc("e", "info", ["n9"], [], None)]),
        _sum("j4", [_inc("f", "info", ["n7"], [], 1.0), _inc("g", "info", ["n7"], [], 1.0)]),  # one job, twice
    ])
    table = recurring_culprits(data)
    got = {(r["kind"], r["culprit"]): (r["jobs"], r["incidents"]) for r in table.iter_rows(named=True)}
    assert got == {("host", "n1"): (3, 3), ("gpu", gpu): (2, 2), ("host", "n9"): (2, 2)}
    first = table.row(0, named=True)
    assert (first["kind"], first["culprit"]) == ("host", "n1")
    assert [(e["job_id"], e["incident_id"]) for e in first["evidence"]] == [("j1", "a"), ("j2", "c"), ("j3", "d")]


def test_state_is_reused_only_with_the_same_version_and_settings():
    cfg = state_config("1.0", {"straggler": {"z": "1"}})
    raw = dump_state(cfg, [_sum("a", []), JobSummary("b", "/fleet/b", "fp", "failed", "lost", retry=True)])
    state = load_state(raw, state_config("1.0", {"straggler": {"z": "1"}}))
    assert list(state.jobs) == ["/fleet/a"] and state.note is None  # a lost job is tried again next time
    assert state.jobs["/fleet/a"] == _sum("a", [])
    assert load_state(raw, state_config("1.1", {"straggler": {"z": "1"}})).jobs == {}
    assert "settings" in (load_state(raw, state_config("1.0", {})).note or "")
    assert load_state(b"{not json", cfg).jobs == {} and load_state(None, cfg).note is None


# --- job discovery -------------------------------------------------------------------------------


def _job(path: Path, sample: str = "ddp_straggler") -> Path:
    """A job folder: one NCCL log of a bundled sample (content-sniffed as a source)."""
    path.mkdir(parents=True, exist_ok=True)
    log = next((SAMPLES / sample / "logs").iterdir())
    shutil.copy(log, path / log.name)
    return path


def test_jobs_one_root_its_subfolders_several_roots_themselves_or_a_given_depth(tmp_path: Path):
    fleet = tmp_path / "fleet"
    _job(fleet / "b" / "logs")  # a job's parts in subfolders stay one job
    _job(fleet / "a")
    (fleet / "empty" / "sub").mkdir(parents=True)
    (fleet / "notes.txt").write_text("not a job\n")
    found = find_jobs([fleet])
    assert [(j.job_id, j.path) for j in found.jobs] == [("a", str(fleet / "a")), ("b", str(fleet / "b"))]
    assert {(Path(s.path).name, s.reason.split(" (")[0]) for s in found.skipped} == {
        ("empty", "no trace or log in it or below it"), ("notes.txt", "a file above the job folders")}
    several = find_jobs([fleet / "b", fleet / "a"])
    assert [j.job_id for j in several.jobs] == ["b", "a"]  # each root is a job, named by its folder
    nested = tmp_path / "nested"
    for day, job in (("2026-11-24", "j1"), ("2026-11-24", "j2"), ("2026-11-25", "j1")):
        _job(nested / day / job / "logs")
    assert [j.job_id for j in find_jobs([nested], depth=2).jobs] == ["2026-11-24/j1", "2026-11-24/j2", "2026-11-25/j1"]
    with pytest.raises(UsageError, match="no job found"):
        find_jobs([fleet / "empty"])
    with pytest.raises(UsageError, match="no such directory"):
        find_jobs([tmp_path / "nope"])


def test_symlinks_followed_inside_the_roots_loops_and_duplicates_reported(tmp_path: Path):
    fleet, store = tmp_path / "fleet", tmp_path / "store"
    _job(fleet / "day1" / "real")
    _job(store / "x" / "kept")
    (fleet / "day1" / "again").symlink_to(fleet / "day1" / "real")  # a second path to one job
    (fleet / "day1" / "loop").symlink_to(fleet)  # its own ancestor
    (fleet / "day2").symlink_to(store / "x")  # a whole day through a link, inside the roots
    (fleet / "day3").symlink_to(tmp_path / "elsewhere")  # dangling
    _job(tmp_path / "outside" / "job")
    (fleet / "day4").symlink_to(tmp_path / "outside")
    found = find_jobs([fleet, store], depth=2)
    assert [j.job_id for j in found.jobs] == ["fleet/day1/real", "store/x/kept"]
    why = {Path(s.path).relative_to(tmp_path).as_posix(): s.reason for s in found.skipped}
    assert why["fleet/day1/again"].startswith("symlink to ") and "analysed once" in why["fleet/day1/again"]
    assert why["fleet/day1/loop"].startswith("symlink loop")
    assert "reached already" in why["fleet/day2"]
    assert why["fleet/day3"].startswith("symlink whose target is gone")
    assert why["fleet/day4"].startswith("symlink to a folder outside the given roots")
    only_fleet = find_jobs([fleet], depth=2)  # store is not a root now: its link is not followed
    assert [(j.job_id, j.path) for j in only_fleet.jobs] == [("day1/real", str(fleet / "day1" / "real"))]
    assert any(s.path == str(fleet / "day2") and "outside the given roots" in s.reason for s in only_fleet.skipped)
    linked_root = tmp_path / "link_to_fleet"
    linked_root.symlink_to(fleet)
    assert [j.job_id for j in find_jobs([linked_root, store], depth=2).jobs] == ["link_to_fleet/day1/real",
                                                                                 "store/x/kept"]


def test_fingerprint_follows_paths_sizes_and_mtimes(tmp_path: Path):
    job = _job(tmp_path / "j")
    first = fingerprint(job)
    assert fingerprint(job) == first
    f = next(job.iterdir())
    st = f.stat()
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    touched = fingerprint(job)
    assert touched != first
    (job / "sub").mkdir()
    (job / "sub" / "extra.log").write_text("x")
    assert fingerprint(job) not in (first, touched)


# --- the per-job function ------------------------------------------------------------------------


def test_a_job_whose_analysis_raises_is_a_failed_row_with_the_last_traceback_line(tmp_path: Path, monkeypatch):
    import forensics.fleet.triage as triage

    def boom(*args, **kwargs):
        raise ZeroDivisionError("division by zero in a detector")

    monkeypatch.setattr(triage, "analyze", boom)  # the pipeline's analyze, as triage imported it
    res = analyze_job(JobTask("j", str(_job(tmp_path / "j")), "fp"))
    assert res.status == "failed" and res.files == []
    assert res.reason is not None and res.reason.startswith("internal error (a bug, please report it): "
                                                             "ZeroDivisionError: division by zero in a detector at ")



def test_a_rust_panic_costs_the_job_and_a_ctrl_c_inside_one_stops_the_batch(tmp_path: Path, monkeypatch):
    """pyo3's PanicException is a BaseException: a Polars panic is a bug that costs its job; one that wraps a
    KeyboardInterrupt (a Ctrl-C landing in a Python call made from Rust) is the user stopping the batch."""
    from polars.exceptions import PanicException

    import forensics.fleet.triage as triage

    def panic(message: str):
        def analyze(*args, **kwargs):
            raise PanicException(message)
        return analyze

    job = JobTask("j", str(_job(tmp_path / "j")), "fp")
    monkeypatch.setattr(triage, "analyze", panic("index out of bounds: the len is 0"))
    res = analyze_job(job)
    assert res.status == "failed" and res.reason is not None
    assert "PanicException: index out of bounds: the len is 0 at test_triage.py:" in res.reason
    ctrl_c = "PyErr { type: <class 'KeyboardInterrupt'>, value: KeyboardInterrupt() }"
    monkeypatch.setattr(triage, "analyze", panic(ctrl_c))
    with pytest.raises(PanicException):
        analyze_job(job)

# --- the command ---------------------------------------------------------------------------------


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "forensics.cli", *args], capture_output=True, text=True, cwd=ROOT)


def _stable(doc: dict) -> dict:
    """Without generated_at; the kernel-log parser lists tied record counts in no fixed order: compare
    those messages as word sets."""
    doc.pop("generated_at", None)
    doc["run"].pop("generated_at", None)
    for src in doc["run"]["sources"]:
        if src.get("message"):
            src["message"] = sorted(re.split(r"[ ,()]+", src["message"]))
    return doc


class _Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.hrefs: list[str] = []
        self.text: list[str] = []
        self.scripts = 0

    def handle_starttag(self, tag: str, attrs: list) -> None:
        self.hrefs += [v for k, v in attrs if tag == "a" and k == "href"]
        self.scripts += tag == "script"

    def handle_data(self, data: str) -> None:
        self.text.append(data)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("fleet") / "jobs"
    shutil.copytree(SAMPLES / "xid79", root / "xid79")
    shutil.copytree(SAMPLES / "ddp_straggler", root / ODD)
    (root / "broken").mkdir()
    (root / "broken" / "rank0.pt.trace.json").write_bytes(b"")  # a trace, empty: the job fails, the batch goes on
    (root / "nothing").mkdir()
    (root / "nothing" / "notes.txt").write_text("no trace here\n")
    return root


def test_triage_writes_dataset_pages_and_each_jobs_reports_as_analyze_does(fleet: Path, tmp_path: Path):
    out = tmp_path / "t"
    res = _cli("triage", str(fleet), "--out", str(out), "-q", "--workers", "2")
    assert res.returncode == 0, res.stderr
    table = pq.read_table(out / "triage.parquet").to_pylist()
    doc = json.loads((out / "triage.json").read_text())
    assert doc["rows"] == table  # same data
    for name in ("xid79", ODD):
        single = _cli("analyze", str(fleet / name), "--out", str(tmp_path / "a"), "-q", "--fail-on", "never")
        assert single.returncode == 0, single.stderr
        expected = json.loads((tmp_path / "a" / "findings.json").read_text())
        got = json.loads((out / "jobs" / name / "findings.json").read_text())
        assert _stable(got) == _stable(json.loads((tmp_path / "a" / "findings.json").read_text()))
        assert (out / "jobs" / name / "summary.md").read_text() == (tmp_path / "a" / "summary.md").read_text()
        assert (out / "jobs" / name / "report.html").exists()
        rows = [r for r in table if r["job_id"] == name]
        assert [r["incident_id"] for r in rows] == [i["id"] for i in expected["incidents"]]
        detector = {f["id"]: f["detector"] for f in expected["findings"]}
        assert [r["root_cause_detector"] for r in rows] == [detector[i["root_cause"]] for i in expected["incidents"]]
        assert [r["gpu_hours_lost"] for r in rows] == [i["gpu_hours_lost"] for i in expected["incidents"]]
        assert [r["culprit_hosts"] for r in rows] == [i["hosts"] for i in expected["incidents"]]
        assert {r["ranks"] for r in rows} == {len(expected["run"]["ranks"])}
        assert {r["report"] for r in rows} == {f"jobs/{name}/report.html"}
        assert {r["status"] for r in rows} == {"ok"}
    broken = [r for r in table if r["job_id"] == "broken"]
    assert len(broken) == 1 and broken[0]["status"] == "failed" and broken[0]["reason"] == "no readable trace or log"
    assert {r["job_id"] for r in table} == {"xid79", ODD, "broken"}
    assert [s["path"] for s in doc["skipped"]] == [str(fleet / "nothing")]
    # both jobs ran on hgx-5200: a drain candidate, with both incidents as evidence
    (cand,) = [c for c in doc["recurring_culprits"] if c["kind"] == "host"]
    assert cand["culprit"] == "hgx-5200" and sorted(e["job_id"] for e in cand["evidence"]) == sorted(["xid79", ODD])
    md = (out / "triage.md").read_text()
    assert ODD not in md and r"odd\|job\`\<b\>\[x\]" in md  # escaped, never a cell border, code, tag or link
    page = (out / "triage.html").read_text()
    links = _Links()
    links.feed(page)
    assert "<b>" not in page and ODD in "".join(links.text)
    assert links.scripts == 2 and page.count("Plotly.newPlot") == 1  # plotly.js once, one figure
    reports = {unquote(h) for h in links.hrefs}
    assert reports == {f"jobs/{n}/report.html" for n in ("xid79", ODD, "broken")}
    assert all((out / h).is_file() for h in reports)


def test_second_run_analyses_only_new_or_changed_jobs(fleet: Path, tmp_path: Path):
    jobs = tmp_path / "jobs"
    shutil.copytree(fleet, jobs, symlinks=True)
    out = tmp_path / "t"

    def run(*extra: str) -> tuple[set[str], dict]:
        res = _cli("triage", str(jobs), "--out", str(out), "-q", "--workers", "1", *extra)
        assert res.returncode == 0, res.stderr
        doc = json.loads((out / "triage.json").read_text())
        return {j["job_id"] for j in doc["jobs"] if j["new"]}, doc

    assert run()[0] == {"xid79", ODD, "broken"}
    before = (out / "jobs" / "xid79" / "report.html").stat().st_mtime_ns
    again, doc = run()
    assert again == set() and doc["overview"]["unchanged"] == 3
    assert (out / "jobs" / "xid79" / "report.html").stat().st_mtime_ns == before  # not rewritten
    (jobs / ODD / "logs" / "extra.log").write_text("a new file changes the job\n")  # a new path: no clock needed
    shutil.rmtree(jobs / "xid79")
    changed, doc = run()
    assert changed == {ODD} and {j["job_id"] for j in doc["jobs"]} == {ODD, "broken"}
    assert not (out / "jobs" / "xid79").exists()  # a job gone: its reports go too
    assert run("--rebuild")[0] == {ODD, "broken"}
    assert not list(out.glob(".triage-staging*"))


def test_in_process_run_keeps_a_crashing_job_as_a_failed_row(fleet: Path, tmp_path: Path, monkeypatch):
    import forensics.fleet.triage as triage

    real = triage.analyze

    def crash_one(path, *args, **kwargs):
        if path.name == "xid79":
            raise KeyError("culprit")
        return real(path, *args, **kwargs)

    monkeypatch.setattr(triage, "analyze", crash_one)
    run = run_triage(find_jobs([fleet]), tmp_path / "t", workers=1)
    by = {s.job_id: s for s in run.summaries}
    assert by["xid79"].status == "failed" and "KeyError: 'culprit'" in (by["xid79"].reason or "")
    assert by[ODD].status == "ok" and by[ODD].incidents
    run.cleanup()


def test_ray_engine_without_ray_installed_is_a_usage_error(monkeypatch):
    from forensics.fleet.triage import run_ray

    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    with pytest.raises(UsageError, match=r"pip install 'trace-forensics\[ray\]'"):
        run_ray([], lambda i, r: None, None)
    res = _cli("triage", str(SAMPLES), "--out", "/tmp/unused-triage-out", "--ray-address", "x:1")
    assert res.returncode == 2 and "--ray-address needs --engine ray" in res.stderr


def test_interrupted_run_leaves_out_as_it_was(tmp_path: Path):
    import signal

    jobs = tmp_path / "jobs"
    for name in "abcdefghijkl":  # enough jobs that the run cannot end between the first staged one and the signal
        _job(jobs / name)
    out = tmp_path / "t"
    assert _cli("triage", str(jobs), "--out", str(out), "-q", "--workers", "1").returncode == 0
    before = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    proc = subprocess.Popen([sys.executable, "-m", "forensics.cli", "triage", str(jobs), "--out", str(out), "-q",
                             "--workers", "1", "--rebuild"], cwd=ROOT, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not list(out.glob(".triage-staging*/jobs/*")) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)  # until the first job's reports are staged
    assert proc.poll() is None, "the run ended before it could be interrupted"
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    assert not list(out.glob(".triage-staging*"))


def test_a_ctrl_c_that_surfaces_twice_still_removes_the_staging_folder(tmp_path: Path, monkeypatch):
    """pola-rs/polars#23988: a Ctrl-C that stops a Polars query raises KeyboardInterrupt once from Polars
    and once more at Python's next call, which can be the cleanup's own first line."""
    import forensics.fleet.triage as triage

    jobs = tmp_path / "jobs"
    _job(jobs / "a")

    def interrupted(*_args, **_kwargs):
        raise KeyboardInterrupt

    real, calls = triage.TriageRun.cleanup, []

    def second_surfacing_first(self) -> None:
        calls.append(1)
        if len(calls) == 1:
            raise KeyboardInterrupt
        real(self)

    monkeypatch.setattr(triage, "analyze", interrupted)
    monkeypatch.setattr(triage.TriageRun, "cleanup", second_surfacing_first)
    with pytest.raises(KeyboardInterrupt):
        run_triage(find_jobs([jobs]), tmp_path / "t", workers=1)
    assert len(calls) == 2
    assert (tmp_path / "t").is_dir() and not list((tmp_path / "t").glob(".triage-staging*"))
