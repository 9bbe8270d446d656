"""The committed sample_traces/ are exactly what sample_traces/regenerate.sh produces today."""

from __future__ import annotations

import gzip
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

SAMPLES = ROOT / "sample_traces"


def _gen_lines() -> list[list[str]]:
    lines = [ln.strip() for ln in (SAMPLES / "regenerate.sh").read_text().splitlines()]
    return [shlex.split(ln)[1:] for ln in lines if ln.startswith("gen ")]


def _content(p: Path) -> bytes:
    # compare decompressed bytes: gzip output may differ between zlib builds, the JSON must not
    return gzip.decompress(p.read_bytes()) if p.suffix == ".gz" else p.read_bytes()


@pytest.mark.parametrize("args", _gen_lines(), ids=lambda a: a[0])
def test_sample_is_up_to_date(tmp_path: Path, args: list[str]):
    name, cli_args = args[0], args[1:]
    out, truth = tmp_path / name, tmp_path / f"{name}.truth.json"
    res = subprocess.run([sys.executable, "-m", "forensics.cli", "simulate", *cli_args, "--seed", "0", "--out",
                          str(out), "--truth", str(truth)],
                         capture_output=True, text=True, cwd=ROOT)
    assert res.returncode == 0, res.stderr
    committed = SAMPLES / name
    mine = sorted(p.relative_to(out) for p in out.rglob("*") if p.is_file())
    theirs = sorted(p.relative_to(committed) for p in committed.rglob("*") if p.is_file())
    assert mine == theirs, "rerun sh sample_traces/regenerate.sh"
    for rel in mine:
        assert _content(out / rel) == _content(committed / rel), (f"{name}/{rel} is stale: rerun sh "
                                                                  f"sample_traces/regenerate.sh")
    assert truth.read_bytes() == (SAMPLES / f"{name}.truth.json").read_bytes()


def test_samples_stay_small():
    total = sum(p.stat().st_size for p in SAMPLES.rglob("*") if p.is_file())
    assert total < 4_000_000
