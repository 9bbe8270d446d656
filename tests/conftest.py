from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from forensics.base.findings import Finding, Skipped
from forensics.base.frames import JobFrames
from forensics.detectors import run_detectors
from forensics.facts.context import JobContext

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
SAMPLE_DATA = SHARED / "sample_data"
SCHEMA_PATH = ROOT / "forensics" / "schema" / "findings.schema.json"
# The detectors the tree holds (a module or package each; ``_`` modules are shared parts): a loop over the
# registry expects at least these.
DETECTOR_MODULES = sorted(p.stem for p in (ROOT / "forensics" / "detectors").iterdir()
                          if not p.name.startswith("_") and (p.suffix == ".py" or (p / "__init__.py").exists()))


def shared_path(*parts: str, root: Path = SAMPLE_DATA) -> Path:
    """A file under ../shared/sample_data (or under ``root``). A missing file fails the test, never skips it:
    CI always has ../shared, so an absent file is a broken checkout or a renamed sample, not an optional extra."""
    path = root.joinpath(*parts)
    if not path.exists():
        pytest.fail(f"shared data missing: {path} (tests need the ../shared folder next to the repository)",
                    pytrace=False)
    return path


@pytest.fixture(autouse=True)
def _compare_decoders(monkeypatch: pytest.MonkeyPatch):
    """With FORENSICS_COMPARE_DECODERS=1, every Kineto trace a test parses in its own process is read by both the
    typed decoder and the stream reader (tests/decoder_check.py), and the test fails where the two differ."""
    if os.environ.get("FORENSICS_COMPARE_DECODERS") == "1":
        from forensics.parsers import kineto

        from tests.decoder_check import compare

        typed = kineto.read_trace_typed

        def checked(path: Path, limit: int, sink: Any, *args: Any, **kwargs: Any) -> Any:
            how, diff = compare(path, limit)
            assert not diff, f"{path}: the typed decoder and the stream reader differ in {diff} ({how})"
            return typed(path, limit, sink, *args, **kwargs)

        monkeypatch.setattr(kineto, "read_trace_typed", checked)
    yield


@pytest.fixture(scope="session")
def findings_validator():
    import jsonschema

    schema = json.loads(SCHEMA_PATH.read_text())
    return jsonschema.Draft202012Validator(schema)


def assert_valid_findings(validator, path_or_doc) -> dict:
    doc = json.loads(Path(path_or_doc).read_text()) if not isinstance(path_or_doc, dict) else path_or_doc
    errors = sorted(validator.iter_errors(doc), key=lambda e: list(e.path))
    assert not errors, "\n".join(f"{list(e.path)}: {e.message}" for e in errors[:10])
    return doc


def run_cli(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    """The CLI as a user runs it: a fresh interpreter, output captured as text."""
    return subprocess.run([sys.executable, "-m", "forensics.cli", *args], capture_output=True, text=True, cwd=cwd)


def write_old_outputs(folder: Path) -> dict[str, bytes]:
    """An earlier run's output set in ``folder``, to check that a failed or interrupted run leaves it intact."""
    folder.mkdir(parents=True, exist_ok=True)
    files = {"findings.json": b'{"old": 1}', "summary.md": b"# old\n", "report.html": b"<html>old</html>"}
    for name, data in files.items():
        (folder / name).write_bytes(data)
    return files


def folder_files(folder: Path) -> dict[str, bytes]:
    """Every file directly in ``folder`` by name, with its bytes ({} when the folder does not exist)."""
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())} if folder.exists() else {}


def require_ray() -> Any:
    """The ray module. Ray is in the [test] extra (CI installs it): without it a test of the Ray engine fails, never
    skips, so that a CI run without the engine cannot pass."""
    try:
        import ray
    except ImportError:
        pytest.fail("ray is not installed: `pip install -e '.[test]'` installs it (tests of the Ray engine need it)",
                    pytrace=False)
    return ray


@pytest.fixture(scope="module")
def ray_session():
    """One local Ray cluster (2 CPUs) per test module that asks for it; the tests fail without ray."""
    ray = require_ray()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


# Detector tests (tests/detectors/test_<name>.py)
RunDetector = Callable[..., tuple[list[Finding], list[Skipped]]]


@pytest.fixture
def run_detector(request: pytest.FixtureRequest) -> RunDetector:
    """The detector a test module is named for (``tests/detectors/test_<name>.py``) run alone over frames, with
    settings overridden by keyword: ``run_detector(frames, min_z=4)`` -> (findings, skipped)."""
    name = request.module.__name__.rpartition(".")[2].removeprefix("test_")

    def run(frames: JobFrames, **settings: Any) -> tuple[list[Finding], list[Skipped]]:
        overrides = {name: {k: str(v) for k, v in settings.items()}} if settings else None
        return run_detectors(JobContext(frames), overrides=overrides, only=[name])

    return run
