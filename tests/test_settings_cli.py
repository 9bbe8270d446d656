"""Settings as data: declarations, `--set` validation through the CLI, `forensics rules`, docs/detectors.md."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

from forensics.base.settings import parse_value, specs
from forensics.cli import app
from forensics.detectors import build_settings, load_all
from tests.conftest import DETECTOR_MODULES, ROOT, run_cli

REGISTRY = load_all()


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_every_setting_is_declared_with_a_doc_and_a_valid_default(name):
    declared = specs(REGISTRY[name].config)  # raises for a field not made with setting()
    assert declared
    for spec in declared:
        assert spec.doc and "\n" not in spec.doc, f"{name}.{spec.name}: one line of doc"
        assert parse_value(name, spec, str(spec.default)) == spec.default
        if spec.type in (int, float) and not spec.choices:
            assert spec.low is not None, f"{name}.{spec.name}: a number needs a valid range"


def test_overrides_are_applied_with_their_declared_type():
    got = build_settings({"straggler": {"min_z": "4"}, "nccl_algorithm": {"min_bytes_for_gap": "4096"}})
    assert got["straggler"].min_z == 4.0 and isinstance(got["straggler"].min_z, float)
    assert got["nccl_algorithm"].min_bytes_for_gap == 4096 and isinstance(got["nccl_algorithm"].min_bytes_for_gap, int)
    assert got["busy_wait"] == REGISTRY["busy_wait"].config()


BAD_SETS = [
    # (--set argument, what the one error line must name)
    ("nosuch.x=1", ["nosuch", "unknown detector", "straggler"]),
    ("straggler.nosuch=1", ["straggler.nosuch", "min_z"]),
    ("straggler.min_z=abc", ["straggler.min_z", "a number in [0, inf]"]),
    ("gpu_hw_error.max_evidence=2.5", ["gpu_hw_error.max_evidence", "an integer in [1, inf]"]),
    ("straggler.min_step_share=1.5", ["straggler.min_step_share", "a number in [0, 1]"]),
    ("busy_wait.min_wait=-0.1", ["busy_wait.min_wait", "a number in [0, 1]"]),
    ("straggler.min_z=nan", ["straggler.min_z", "a number in [0, inf]"]),
    ("straggler.min_z=inf", ["straggler.min_z", "a number in [0, inf]"]),
    ("gpu_hw_error.policy=strcit", ["gpu_hw_error.policy", "one of default, strict, lenient"]),
    ("pipeline_bubble.schedule=zb2", ["pipeline_bubble.schedule", "one of 1f1b, zb-h1, zb"]),
    ("nccl_transport.bad_iface_pattern=docker(", ["nccl_transport.bad_iface_pattern", "a regular expression"]),
    ("straggler.min_z", ["DETECTOR.SETTING=VALUE"]),
]


@pytest.mark.parametrize(("arg", "names"), BAD_SETS, ids=[a for a, _ in BAD_SETS])
def test_bad_set_is_exit_2_with_one_line_naming_the_key_and_what_is_allowed(tmp_path: Path, arg, names):
    run = tmp_path / "run"
    run.mkdir()
    (run / "notes.txt").write_text("nothing\n")
    res = run_cli("analyze", str(run), "--out", str(tmp_path / "out"), "-q", "--set", arg)
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in res.stderr, res.stderr
    for part in names:
        assert part in lines[0], (part, lines[0])
    assert not (tmp_path / "out").exists(), "settings are checked before anything is parsed or written"


def test_triage_validates_set_too(tmp_path: Path):
    (tmp_path / "jobs" / "a").mkdir(parents=True)
    res = run_cli("triage", str(tmp_path / "jobs"), "--out", str(tmp_path / "t"), "-q", "--set",
                  "gpu_hw_error.policy=strcit")
    assert res.returncode == 2 and "gpu_hw_error.policy" in res.stderr and not (tmp_path / "t").exists()


def test_readme_set_example_works_verbatim(tmp_path: Path):
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    # complete commands (the usage synopsis with [OPTIONS] and DET.KEY placeholders is not one)
    examples = re.findall(r"`(forensics analyze [^`\[]*--set [a-z_]+\.[a-z_]+=[^`]*)`", readme)
    assert examples, "README shows no complete `forensics analyze ... --set ...` example"
    for example in examples:
        argv = shlex.split(example)[1:]
        res = run_cli(*argv, "--out", str(tmp_path / "o"), "-q", "--fail-on", "never")
        assert res.returncode == 0, (example, res.stderr)
        assert (tmp_path / "o" / "findings.json").exists()
    # every other `--set DET.KEY=VALUE` with a concrete value names a real setting (a|b|c: each choice)
    for det, key, values in re.findall(r"--set ([a-z_]+)\.([a-z_]+)=([^`\s]+)", readme):
        for value in values.split("|"):
            build_settings({det: {key: value}})


def _invoke(*args: str):
    res = CliRunner().invoke(app, list(args))
    assert res.exit_code == 0, res.output
    return res.output


def test_rules_prints_every_detector_and_setting_as_plain_text():
    text = _invoke("rules")
    assert len(DETECTOR_MODULES) >= 14 and set(REGISTRY) >= set(DETECTOR_MODULES)
    for name, spec in REGISTRY.items():
        assert re.search(rf"^{name}$", text, re.M), name
        for s in specs(spec.config):
            assert re.search(rf"^\s+{s.name}\s", text, re.M), f"{name}.{s.name} missing from the settings table"
    for markup in ("``", ":mod:`", ":func:`", ":class:`"):
        assert markup not in text, markup


def test_rules_for_one_detector_and_unknown_detector():
    one = _invoke("rules", "nccl_timeout")
    assert "late_detection_ratio" in one and "straggler" not in one
    res = run_cli("rules", "nosuch")
    assert res.returncode == 2 and "nosuch" in res.stderr


def test_rules_markdown_has_every_detector_and_setting():
    md = _invoke("rules", "--format", "md")
    assert set(REGISTRY) >= set(DETECTOR_MODULES)
    for name, spec in REGISTRY.items():
        assert f"## {name}\n" in md
        for s in specs(spec.config):
            assert f"| `{s.name}` |" in md
    assert ":mod:`" not in md and "``" not in md
