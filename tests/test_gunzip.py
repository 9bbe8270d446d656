"""Gunzip through zlib-ng's drop-in ``zlib`` when installed, the standard library's otherwise
(``parsers/bounded_read.py``): both must read every stream alike, damaged ones included, so that a file's frames
and the message about it do not depend on which one ran."""

from __future__ import annotations

import random
import subprocess
import sys
import zlib
from pathlib import Path

import pytest
from forensics.parsers import bounded_read
from forensics.parsers.kineto import parse
from forensics.parsers.kineto_stream import decompressed_blocks
from forensics.parsers.result import ParseContext

from tests.conftest import ROOT

zlib_ng = pytest.importorskip("zlib_ng.zlib_ng")  # a dependency; absent only where it has no wheel

TRACE = ROOT / "sample_traces" / "ddp_straggler" / "profiler" / "hgx-5200_163657.1773478800000.pt.trace.json.gz"


def _blocks(path: Path) -> tuple[list[bytes], str | None]:
    """Every block ``decompressed_blocks`` yields, and what it raised (type and message)."""
    out: list[bytes] = []
    try:
        for block in decompressed_blocks(path, 1 << 30):
            out.append(block)
    except Exception as exc:  # noqa: BLE001 - the comparison is of whatever either raises
        return out, f"{type(exc).__name__}: {exc}"
    return out, None


def _mutants(data: bytes, count: int) -> list[bytes]:
    rng = random.Random(29)
    out = []
    for k in range(count):
        d = bytearray(data)
        for _ in range(rng.randint(1, 3)):
            d[rng.randrange(10, len(d))] = rng.randrange(256)
        out.append(bytes(d[: rng.randrange(len(d))]) if k % 3 == 0 else bytes(d))
    return out


def test_the_module_is_zlib_ng_unless_forced_or_missing(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("FORENSICS_GUNZIP", raising=False)
    assert bounded_read._inflate_module() is zlib_ng
    monkeypatch.setenv("FORENSICS_GUNZIP", "zlib")
    assert bounded_read._inflate_module() is zlib
    monkeypatch.delenv("FORENSICS_GUNZIP")
    monkeypatch.setitem(sys.modules, "zlib_ng", None)  # as on a platform without its wheel: ImportError
    assert bounded_read._inflate_module() is zlib


def test_the_environment_variable_reaches_a_fresh_process():
    code = "from forensics.parsers import bounded_read as b; print(b.INFLATE.__name__)"
    env = {"FORENSICS_GUNZIP": "zlib", "PATH": "/usr/bin:/bin"}
    got = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert got.stdout.strip() == "zlib"


def test_both_modules_yield_the_same_blocks_and_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    data = TRACE.read_bytes()
    twice = data + data  # a second gzip member
    cases = [data, twice, data[: len(data) // 2], *_mutants(data, 90)]
    errors = 0
    for i, case in enumerate(cases):
        path = tmp_path / f"t{i}.json.gz"
        path.write_bytes(case)
        monkeypatch.setattr(bounded_read, "INFLATE", zlib)
        want = _blocks(path)
        monkeypatch.setattr(bounded_read, "INFLATE", zlib_ng)
        got = _blocks(path)
        assert got == want, i
        errors += want[1] is not None
    assert errors > len(cases) // 2  # the damaged cases did reach the error paths
    assert b"".join(_blocks(tmp_path / "t1.json.gz")[0]) == zlib.decompress(data, 31) * 2


def test_both_modules_give_the_same_frames_and_message(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    data = bytearray(TRACE.read_bytes())
    mid = len(data) // 2
    data[mid : mid + 64] = bytes(64)
    for name, content in (("good", TRACE.read_bytes()), ("damaged", bytes(data))):
        path = tmp_path / f"{name}.json.gz"
        path.write_bytes(content)
        results = []
        for module in (zlib, zlib_ng):
            monkeypatch.setattr(bounded_read, "INFLATE", module)
            results.append(parse(path, ParseContext(path.parent, path.name)))
        std, ng = results
        assert (std.status, std.message) == (ng.status, ng.message), name
        assert std.frames.keys() == ng.frames.keys()
        for key in std.frames:
            assert std.frames[key].equals(ng.frames[key]), (name, key)
    assert "corrupt gzip data" in (std.message or "")


def test_a_corrupt_head_reads_alike(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    data = bytearray(TRACE.read_bytes())
    data[20:60] = bytes(b ^ 0x5A for b in data[20:60])
    path = tmp_path / "bad.json.gz"
    path.write_bytes(bytes(data))
    got = []
    for module in (zlib, zlib_ng):
        monkeypatch.setattr(bounded_read, "INFLATE", module)
        got.append(bounded_read.read_head(path, 4096))
    assert got[0] == got[1] and got[0][1] is not None and got[0][1].startswith("corrupt gzip")
