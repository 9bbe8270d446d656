"""Issue 25, item 2: a detector declares what it finds, and adding one is one module plus its tests.

The detector below is written here, in the test directory, and registered only for this test: nothing else in
the tree names it. It must be run by the pipeline, linked by the incident rule that matches its declared kind,
shown in the report and listed by ``forensics rules``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest
from typer.testing import CliRunner

from forensics.base.findings import Finding, FindingKind, Role, Severity, When
from forensics.base.frames import FRAME_SPECS, JobFrames
from forensics.cli import app
from forensics.detectors import REGISTRY, DetectorDoc, detector, load_all, run_detectors
from forensics.facts.context import JobContext
from tests.conftest import DETECTOR_MODULES, ROOT

NAME = "probe_gpu_fault"
TITLE = "Probe: GPU fault on the rank the watchdog names"
#: the rule vocabulary's kind ``gpu_fault``: a rule matches it by kind, whatever the detector
PROBE_KIND = FindingKind("gpu_fault", "a GPU fault found by the probe", Role.FAULT, "Replace the probe's GPU.")


DOC = DetectorDoc(
    summary="A probe written in the test directory to prove that adding a detector touches no other file.",
    detects="A GPU fault on the traced rank that reported no timeout, placed at the first profiled step.",
    matters="It proves the declaration API: registered, run, linked by its kind, shown in the report and listed.",
    measures="It reads the steps and the collective timeouts of the job and names the silent traced rank.",
    todo="Nothing: it is a test fixture, registered only while its test runs.",
)


@dataclass(frozen=True)
class ProbeConfig:
    """No settings."""


@pytest.fixture()
def probe():
    """Register the probe detector for one test, then remove it (the other tests see the real registry)."""
    load_all()

    def detect(ctx: JobContext, cfg: ProbeConfig) -> list[Finding]:
        steps = ctx.frames["steps"]
        start = int(steps["start_ns"].min())  # type: ignore[arg-type]
        # the traced rank that reported no timeout: the one the others waited for
        reported = set(ctx.frames["collective_timeouts"]["rank"].drop_nulls().to_list())
        ranks = tuple(sorted(set(steps["rank"].drop_nulls().to_list()) - reported))
        return [Finding(NAME, Severity.CRITICAL, TITLE, "A probe's fault.", PROBE_KIND.remediation, ranks=ranks,
                        kind=PROBE_KIND.name, when=When.span(start, start, "the first profiled step"))]

    detect.__module__ = __name__
    detector(NAME, doc=DOC, settings=ProbeConfig, requires=("steps", "collective_timeouts"),
             kinds=(PROBE_KIND,))(detect)
    try:
        yield REGISTRY[NAME]
    finally:
        del REGISTRY[NAME]


def test_a_detector_written_here_is_run_linked_shown_and_listed(probe, tmp_path):
    runner = CliRunner()
    out = tmp_path / "out"
    res = runner.invoke(app, ["analyze", str(ROOT / "sample_traces" / "xid79"), "--out", str(out), "-q",
                              "--fail-on", "never", "--workers", "1"])
    assert res.exit_code == 0, res.output
    doc = json.loads((out / "findings.json").read_text())
    by_id = {f["id"]: f for f in doc["findings"]}
    (mine,) = [f for f in doc["findings"] if f["detector"] == NAME]
    assert mine["kind"] == "gpu_fault" and mine["when"]["start_ns"] is not None
    # linked by the rule that matches its declared kind: the timeout hangs under it
    links = [(k["rule"], by_id[k["consequence"]]["kind"]) for i in doc["incidents"] for k in i["links"]
             if k["cause"] == mine["id"]]
    assert ("gpu_fault_kills_rank", "timeout") in links, doc["incidents"]
    assert TITLE in (out / "summary.md").read_text() and TITLE in (out / "report.html").read_text()
    listed = runner.invoke(app, ["rules"])
    assert listed.exit_code == 0 and f"\n{NAME}\n" in "\n" + listed.stdout
    mine_listed = listed.stdout.split(f"{NAME}\n", 1)[1]
    assert "gpu_fault (fault, stage 0): a GPU fault found by the probe" in mine_listed


def test_a_finding_of_an_undeclared_kind_stops_the_run():
    load_all()

    def detect(ctx: JobContext, cfg: ProbeConfig) -> list[Finding]:
        return [Finding("probe_liar", Severity.INFO, "t", "s", "r", kind="timeout")]

    detect.__module__ = __name__
    detector("probe_liar", doc=DOC, settings=ProbeConfig, kinds=(PROBE_KIND,))(detect)
    try:
        with pytest.raises(ValueError, match="undeclared kind 'timeout'"):
            run_detectors(JobContext(JobFrames({})), only=["probe_liar"])
    finally:
        del REGISTRY["probe_liar"]


def test_every_detector_declares_kinds_with_meaning_and_remediation():
    registry = load_all()
    assert len(DETECTOR_MODULES) >= 14 and set(registry) >= set(DETECTOR_MODULES)
    for name, spec in registry.items():
        assert spec.kinds, name
        for k in spec.kinds:
            assert k.meaning and k.remediation and isinstance(k.role, Role), (name, k)


def test_a_kind_declared_twice_must_play_the_same_role():
    load_all()
    clash = FindingKind("timeout", "not a hang", Role.SYMPTOM, "nothing")

    def detect(ctx: JobContext, cfg: ProbeConfig) -> list[Finding]:
        return []

    detect.__module__ = __name__
    with pytest.raises(ValueError, match="declares kind 'timeout'"):
        detector("probe_clash", doc=DOC, settings=ProbeConfig, kinds=(clash,))(detect)
    assert "probe_clash" not in REGISTRY


#: a detector's own modules (its package of parts) and the simulator's ground truth may name it
OWN = {"gpu_hw_error": ("forensics/detectors/gpu_hw_error/",)}
TRUTH = ("forensics/simulate/",)
ROLE_WORDS = {r.value for r in Role}  # "hang" is a role and, since the Flight Recorder, a detector
FRAMES = set(FRAME_SPECS)  # "last_words" is a frame and a detector: the parsers and frame specs name the frame

def _names_in(path) -> set[str]:
    import ast

    tree = ast.parse(path.read_text(encoding="utf-8"))
    docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                  if isinstance(n, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and n.body
                  and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    return {n.value for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docstrings}


def test_no_module_outside_a_detector_names_it():
    """Rules, views, the verdict and triage learn detectors from their declarations, never from their names."""
    names = set(load_all())
    offenders = []
    files = [p for d in ("forensics", "parsers", "reports") for p in sorted((ROOT / d).rglob("*.py"))]
    assert len(files) > 50
    for path in files:
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith(TRUTH):
            continue
        for text in _names_in(path):
            for name in names:
                own = rel in (f"forensics/detectors/{name}.py",) or rel.startswith(OWN.get(name, ("//",)))
                own = own or (rel == "forensics/base/findings.py" and text in ROLE_WORDS)  # the role vocabulary
                own = own or text in FRAMES  # a frame of the same name (the precise test below still applies)
                if not own and (text == name or text.startswith(name + ":") or text.startswith(name + ".")):
                    offenders.append(f"{rel}: {text!r}")
    assert offenders == []


def _detector_comparisons(path) -> set[str]:
    """String constants compared with a ``.detector`` attribute (``f.detector == "x"``, ``... in ("x", "y")``)."""
    import ast

    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(isinstance(x, ast.Attribute) and x.attr == "detector" for x in sides):
                out |= {c.value for x in sides for c in ast.walk(x)
                        if isinstance(c, ast.Constant) and isinstance(c.value, str)}
    return out


def test_no_module_outside_a_detector_compares_a_finding_with_its_name():
    names = set(load_all())
    files = [p for d in ("forensics", "parsers", "reports") for p in sorted((ROOT / d).rglob("*.py"))]
    offenders = []
    for path in files:
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith(TRUTH):
            continue
        for name in _detector_comparisons(path) & names:
            if not (rel == f"forensics/detectors/{name}.py" or rel.startswith((f"forensics/detectors/{name}/",
                                                                              *OWN.get(name, ())))):
                offenders.append(f"{rel}: {name}")
    assert offenders == []
