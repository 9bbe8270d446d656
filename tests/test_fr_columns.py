"""The compiled Flight Recorder reader (parsers/fr_columns.c) against the Python reader: the same frames and
messages on every dump the tests know, on a few hundred mutated and truncated ones (no crash: the same result or
a clean hand-over to the Python reader), and the same refusal of a pickle that would run a command. Without the
extension everything still works (the Python reader alone)."""

from __future__ import annotations

import pickle
import random
import struct
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
from conftest import shared_path
from forensics.parsers import flight_recorder, fr_pickle
from forensics.parsers.result import ParseContext

from forensics.pipeline import analyze
from forensics.simulate import flight_recorder as sim
from forensics.simulate.fr_pickle import dumps

try:
    from forensics.parsers import fr_columns
except ImportError:  # built without a C compiler or Python's headers: only the last test applies
    fr_columns = None
needs_compiled = pytest.mark.skipif(fr_columns is None, reason="built without a C compiler or Python's headers")
NOTE = "; read by the Python reader (the compiled one refused it: "


def _batch(paths: list[Path], root: Path, compiled: bool, monkeypatch: pytest.MonkeyPatch):
    """(per file: its early failure or None, per accepted file: its message, the frames) of one batch."""
    monkeypatch.setattr(flight_recorder, "fr_columns", fr_columns if compiled else None)
    batch = flight_recorder.FlightRecorderBatch()
    early = [_add(batch, p, root) for p in paths]
    results, frames = batch.finish()
    return early, [r.message for r in results], frames


def _add(batch: flight_recorder.FlightRecorderBatch, path: Path, root: Path) -> str | None:
    early = batch.add(path, ParseContext(root, path.relative_to(root).as_posix()))
    return early.message if early else None


def _same(paths: list[Path], root: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[int, int]:
    """Both readers on ``paths`` (one batch each); returns (files the compiled reader handed over, accepted)."""
    c_early, c_msgs, c_frames = _batch(paths, root, True, monkeypatch)
    p_early, p_msgs, p_frames = _batch(paths, root, False, monkeypatch)
    assert c_early == p_early  # refusals are the Python reader's own words either way
    assert [m.split(NOTE)[0] for m in c_msgs] == p_msgs
    for name, frame in p_frames.items():
        assert c_frames[name].equals(frame, null_equal=True), name
    return sum(NOTE in m for m in c_msgs), len(p_msgs)


def _sim_dumps(tmp_path: Path) -> list[Path]:
    for i, scenario in enumerate(sim.SCENARIOS):
        for j, version in enumerate(sim.VERSIONS):
            for fmt in ("pickle", "json"):
                stacks = (i + j) % 2 == 1  # every version with and without stacks, over the scenarios
                sim.write(scenario, tmp_path / f"{scenario}-{version}-{fmt}-{stacks}", fmt=fmt, version=version,
                          stacks=stacks, host_names=stacks)
    return sorted(p for p in tmp_path.rglob("*") if p.is_file() and p.name != "truth.json")


@needs_compiled
def test_the_simulators_dumps_read_alike(tmp_path, monkeypatch):
    paths = _sim_dumps(tmp_path)
    handed_over, accepted = _same(paths, tmp_path, monkeypatch)
    assert handed_over == 0 and accepted == len(paths) > 700  # every version, pickle and JSON, with stacks


@needs_compiled
@pytest.mark.parametrize("case", ("gpu_error_1st", "lock_gil_1st"))
def test_the_real_dumps_read_alike(case, monkeypatch):
    root = shared_path("flight_recorder", "nvrx_fault_injection", case)
    paths = sorted(root.glob("_dump_*"))
    assert _same(paths, root, monkeypatch) == (0, 16)


_ODD = [None, 1.5, 2.0, True, "7", b"x", [1], (1, 2), {"a": 1}, -(1 << 63), 1 << 62, -1, "", "completed", [["a"]], 3]


def _odd_doc(rnd: random.Random, python_pickler: bool) -> dict:
    """A small simulated dump, with up to two entry fields set to odd values or removed."""
    doc = sim.dump_doc(sim.healthy(4), 1, rnd.choice(sim.VERSIONS), rnd.random() < 0.5)
    entries = doc.get("entries") or [{}]
    for _ in range(rnd.randint(0, 2)):
        entry = rnd.choice(entries)
        key = rnd.choice([*entry, "extra"])
        if rnd.random() < 0.15:
            entry.pop(key, None)
        else:
            entry[key] = rnd.choice(_ODD)
    if python_pickler:  # with an integer for LONG1 of 9 bytes, sometimes
        doc["entries"] = [*doc.get("entries", []), {**entries[0], "record_id": rnd.choice([1 << 64, 5, 6, 7])}]
    return doc


def _damaged(rnd: random.Random, data: bytearray, kind: int) -> bytearray:
    if kind == 1:  # flip a byte or two
        for _ in range(rnd.randint(1, 2)):
            data[rnd.randrange(2, len(data))] = rnd.randrange(256)
    elif kind == 2:  # truncate
        data = data[:rnd.randrange(2, len(data))]
    elif kind == 3:  # splice in an opcode, allowed or not
        at = rnd.randrange(2, len(data))
        data[at:at] = bytes([rnd.choice(b"cR(tue.ahjqrK\x8a\x94\x95}]N\x88")])
    return data


def _mutants(seed: int, n: int) -> list[bytes]:
    """Pickles of small simulated dumps with a random field made odd, or bytes flipped, cut or spliced; half
    written as torch writes them, half by Python's pickler (memoized containers, bytes)."""
    rnd = random.Random(seed)
    out = []
    for i in range(n):
        kind, python_pickler = i % 4, i % 8 >= 4
        doc = _odd_doc(rnd, python_pickler) if kind == 0 else sim.dump_doc(sim.healthy(4), 1, "2.10", i % 3 == 0)
        try:
            data = bytearray(pickle.dumps(doc, protocol=2) if python_pickler else dumps(doc))
        except (TypeError, struct.error):  # a value torch's layout cannot hold
            data = bytearray(pickle.dumps(doc, protocol=2))
        out.append(bytes(_damaged(rnd, data, kind)))
    return out


@needs_compiled
def test_mutated_and_truncated_dumps_read_alike_or_are_handed_over(tmp_path, monkeypatch):
    root = tmp_path / "m"
    root.mkdir()
    paths, refused = [], 0
    for i, data in enumerate(_mutants(26, 400)):
        path = root / f"comm_lib_trace_rank_{i}"
        path.write_bytes(data)
        paths.append(path)
        refused += isinstance(fr_columns.read(data, flight_recorder._COMPILED_FLAT, flight_recorder._SHAPE, {}), str)
    # one file a batch as well as all in one: a refused file must cost only itself
    _, accepted = _same(paths, root, monkeypatch)
    assert 50 < accepted < len(paths) and refused > 100
    for path in paths[::7]:
        _same([path], root, monkeypatch)


@needs_compiled
def test_an_unusual_value_is_read_by_the_python_reader_and_says_so(tmp_path, monkeypatch):
    doc = sim.dump_doc(sim.healthy(4), 1, "2.10", False)
    doc["entries"][0]["duration_ms"] = 3  # an int where torch writes a float: Arrow takes it, the compiled reader not
    path = tmp_path / "comm_lib_trace_rank_1"
    path.write_bytes(dumps(doc))
    handed_over, accepted = _same([path], tmp_path, monkeypatch)
    assert (handed_over, accepted) == (1, 1)


@needs_compiled
def test_a_pickle_that_would_run_a_command_runs_nothing_in_the_compiled_reader(tmp_path, monkeypatch):
    marker = tmp_path / "pwned"
    cmd = f"touch {marker}".encode()
    call = b"cos\nsystem\n(X" + len(cmd).to_bytes(4, "little") + cmd + b"tR"
    data = (b"\x80\x02}(X\x07\x00\x00\x00versionX\x03\x00\x00\x002.9X\t\x00\x00\x00pg_status}X\x07\x00\x00\x00"
            b"entries](" + call + b"eu.")
    assert isinstance(fr_columns.read(data, flight_recorder._COMPILED_FLAT, flight_recorder._SHAPE, {}), str)
    run = tmp_path / "run"
    run.mkdir()
    (run / "nccl_trace_rank_0").write_bytes(data)
    (run / "nccl_trace_rank_1").write_bytes(dumps(sim.dump_doc(sim.healthy(4), 1, "2.9", False)))
    monkeypatch.setattr(flight_recorder, "fr_columns", fr_columns)
    rows = {r["path"]: r for r in analyze(run).sources.iter_rows(named=True)}
    assert rows["nccl_trace_rank_0"]["status"] == "failed"
    assert "GLOBAL opcode at offset" in rows["nccl_trace_rank_0"]["message"]  # the Python reader's words
    assert rows["nccl_trace_rank_1"]["status"] == "ok" and NOTE not in rows["nccl_trace_rank_1"]["message"]
    assert not marker.exists()


@needs_compiled
def test_caps_hold_in_the_compiled_reader():
    flat, shape = flight_recorder._COMPILED_FLAT, flight_recorder._SHAPE
    deep = b"\x80\x02" + b"](" * (fr_pickle.MAX_DEPTH + 1) + b"e" * (fr_pickle.MAX_DEPTH + 1) + b"."
    long = b"\x80\x02X" + (fr_pickle.MAX_STRING_BYTES + 1).to_bytes(4, "little") + b"a" * 8 + b"."
    wide = b"\x80\x02\x8a\x09" + b"\x01" * 9 + b"."
    for data in (deep, long, wide, b"\x80\x02", b"\x80\x01N.", b"\x80\x02h\x05.", b"\x80\x02N.junk"):
        assert isinstance(fr_columns.read(data, flat, shape, {}), str), data
    ok = dumps(sim.dump_doc(sim.healthy(4), 1, "2.9", False))
    assert not isinstance(fr_columns.read(ok, flat, shape, {}), str)
    assert fr_pickle.loads(ok)["version"] == "2.9"


def test_without_the_extension_the_python_reader_reads_everything(tmp_path):
    sim.write("gpu_error", tmp_path, version="2.10", stacks=True)
    code = ("import sys; sys.modules['forensics.parsers.fr_columns'] = None\n"  # its import now fails
            "from forensics.parsers import flight_recorder as f; assert f.fr_columns is None\n"
            "from forensics.pipeline import analyze\n"
            f"a = analyze(__import__('pathlib').Path({str(tmp_path)!r}))\n"
            "print(sorted(r for x in a.findings if x.key == 'stuck_device' for r in x.ranks))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    truth = orjson.loads((tmp_path / "truth.json").read_bytes())
    assert orjson.loads(out.strip().splitlines()[-1]) == truth["expected"]["device"]
