"""The simulator writes big jobs with bounded memory: between steps no rank holds trace text (it waits in
one spool file, compressed), and each trace is still one gzip stream of its text, as before the spool.

Expectations are recomputed here with the standard library (gzip, zlib), not by the simulator's code."""

from __future__ import annotations

import gzip
import io
from pathlib import Path
from typing import Any

import pytest

import forensics.simulate as sim
from forensics.simulate.kineto import Spool
from forensics.simulate.model import ProcessGroup, start_stride

SMALL = {"layers": "1"}


def test_no_rank_holds_trace_text_between_steps(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    held: list[int] = []
    programs = sim._Recorder.programs

    def checked(self: Any, res: Any) -> None:
        programs(self, res)
        held.append(sum(len(w._pending) + len(w._buf) for w in self.writers))

    monkeypatch.setattr(sim._Recorder, "programs", checked)
    sim.simulate("ddp_clean", tmp_path / "r", ranks=16, steps=3, params=SMALL)
    assert held == [0, 0, 0]
    # the spool is gone: the profiler folder holds one trace per rank and nothing else
    assert sorted(p.name.split(".")[-1] for p in (tmp_path / "r" / "profiler").iterdir()) == ["gz"] * 16


def _one_stream(text: bytes, level: int = 6) -> bytes:
    buf = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buf, mtime=0, compresslevel=level) as gz:
        gz.write(text)
    return buf.getvalue()


@pytest.mark.parametrize("level", [1, 6])
def test_each_trace_is_one_gzip_stream_of_its_text(tmp_path: Path, level: int):
    sim.simulate("pp_small_m", tmp_path / "r", ranks=8, steps=2, compresslevel=level)
    traces = sorted((tmp_path / "r" / "profiler").iterdir())
    assert len(traces) == 8
    for p in traces:
        data = p.read_bytes()
        assert data == _one_stream(gzip.decompress(data), level), p.name


def test_spool_gives_back_each_chunk(tmp_path: Path):
    spool = Spool(tmp_path)
    chunks = [b"", b"x" * 100_000, bytes(range(256)) * 7, b'{"ph": "X"}']
    where = [spool.put(c) for c in chunks]
    assert [spool.get(w) for w in reversed(where)] == chunks[::-1]
    spool.close()
    assert list(tmp_path.iterdir()) == []  # an anonymous temporary file


@pytest.mark.parametrize(("ranks", "expected"), [((0, 2, 4, 6), (0, 2)), ((3, 4, 6), (3, -1)), ((5,), (5, 1)),
                                                  ((7, 3), (7, -4))])
def test_group_start_and_stride(ranks: tuple[int, ...], expected: tuple[int, int]):
    assert start_stride(ranks) == expected
    g = ProcessGroup("1", "d", ranks, "dp")
    assert g.start_stride == expected
    assert g.ranks_text == "[" + ", ".join(map(str, ranks)) + "]"
