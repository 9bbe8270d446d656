"""The compiled Kineto reader (parsers/kineto_columns.c) against the typed reader it hands odd files to: the same
columns, rows and counts from every trace the tests know (real, bundled, simulated), the same frames and messages
from whole batches, a refusal (never a crash, never a different reading) for a few hundred mutated and truncated
traces, and the refusal said in the source's message. Without the extension the typed reader reads everything."""

from __future__ import annotations

import gzip
import json
import random
import subprocess
import sys
from pathlib import Path

import pytest
from forensics.parsers import kineto, kineto_extract
from forensics.parsers.kineto_extract import Extractor
from forensics.parsers.kineto_typed import TypedRejected
from forensics.parsers.result import ParseContext

from forensics.pipeline import analyze
from forensics.simulate import simulate
from tests.conftest import ROOT, SAMPLE_DATA, shared_path
from tests.decoder_check import compare_compiled, trace_files
from tests.test_kineto_damaged import PAST_INT32, PAST_INT32_NOTE
from tests.test_kineto_typed import ACCEPTED, REJECTED, SCENARIOS

try:
    from forensics.parsers import kineto_columns
except ImportError:  # built without a C compiler or Python's headers: only the last test applies
    kineto_columns = None
needs_compiled = pytest.mark.skipif(kineto_columns is None, reason="built without a C compiler or Python's headers")
pytestmark = pytest.mark.usefixtures("_compiled_on")
NOTE = "; read by the typed reader (the compiled one refused it: "
REAL = [p.relative_to(SAMPLE_DATA).as_posix() for p in trace_files(SAMPLE_DATA / "kineto")]
BUNDLED = [p.relative_to(ROOT).as_posix() for p in trace_files(ROOT / "sample_traces")]


@pytest.fixture
def _compiled_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """The compiled reader in use whatever FORENSICS_KINETO_READER says (the tests switch it off themselves)."""
    monkeypatch.setattr(kineto_extract, "kineto_columns", kineto_columns)


def _write(tmp_path: Path, name: str, data: bytes) -> Path:
    path = tmp_path / (name.replace(" ", "_").replace("'", "").replace("/", "_") + ".json.gz")
    path.write_bytes(gzip.compress(data, compresslevel=1))
    return path


def _batch(paths: list[Path], root: Path, compiled: bool, monkeypatch: pytest.MonkeyPatch):
    """(per file: its early failure or None, the results' status and message, the frames) of one batch."""
    monkeypatch.setattr(kineto_extract, "kineto_columns", kineto_columns if compiled else None)
    batch = kineto.KinetoBatch()
    early = []
    for p in paths:
        got = batch.add(p, ParseContext(root, p.relative_to(root).as_posix()))
        early.append((got.status, got.message) if got else None)
    results, frames = batch.finish()
    return early, [(r.status, r.message, r.rank) for r in results], frames


def _same(paths: list[Path], root: Path, monkeypatch: pytest.MonkeyPatch) -> int:
    """Both ways on ``paths`` (one batch each): the same frames, the same messages but for the compiled reader's
    note; returns the files it refused."""
    c_early, c_res, c_frames = _batch(paths, root, True, monkeypatch)
    p_early, p_res, p_frames = _batch(paths, root, False, monkeypatch)
    assert c_early == p_early
    assert [(s, m.split(NOTE)[0], r) for s, m, r in c_res] == p_res
    assert c_frames.keys() == p_frames.keys()
    for name, frame in p_frames.items():
        assert c_frames[name].equals(frame, null_equal=True), name
    return sum(NOTE in m for _, m, _ in c_res)


@needs_compiled
@pytest.mark.parametrize("rel", REAL)
def test_real_traces_read_compiled_and_identically(rel: str):
    assert compare_compiled(shared_path(*rel.split("/"))) == ("compiled", [])


@needs_compiled
@pytest.mark.parametrize("rel", BUNDLED)
def test_bundled_samples_read_compiled_and_identically(rel: str):
    assert compare_compiled(ROOT / rel) == ("compiled", [])


@needs_compiled
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_simulated_traces_read_compiled_and_identically(tmp_path: Path, scenario: str):
    simulate(scenario, tmp_path / "run", steps=2)
    files = trace_files(tmp_path / "run" / "profiler")
    assert files
    for path in files:
        assert compare_compiled(path) == ("compiled", []), path


@needs_compiled
def test_whole_batches_give_the_same_frames_and_messages(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    simulate("ddp_straggler", tmp_path / "run", steps=2)
    sim = tmp_path / "run" / "profiler"
    assert _same(trace_files(sim), sim, monkeypatch) == 0
    real = [shared_path(*rel.split("/")) for rel in REAL]
    assert _same(real, SAMPLE_DATA, monkeypatch) == 0
    for path in real[:6]:
        assert _same([path], SAMPLE_DATA, monkeypatch) == 0


def _ev(**kw) -> dict:
    base = {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 11, "tid": 12, "ts": 990, "dur": 3, "args": {}}
    return {**base, **kw}


def _doc(events: list) -> bytes:
    return json.dumps({"schemaVersion": 1, "distributedInfo": {"rank": 0}, "traceEvents": events}).encode()


_RANKS = "[" + ", ".join(map(str, range(300))) + "]"
_COMM_ARGS = {"Collective name": "allreduce", "In msg nelems": 1024, "Out msg nelems": "stream 7", "dtype": 3.5,
              "Group size": 2.0, "Process Group Name": True, "Process Group Description": None,
              "Process Group Ranks": _RANKS, "Seq": (1 << 63) + 5, "Src Rank": "-3", "Dst Rank": False,
              "Process Group ID": -(1 << 63)}
# Read by the compiled reader, identically to the typed reader (beyond tests/test_kineto_typed.py's ACCEPTED).
COMPILED = {
    "escapes in names and unread strings": _doc([_ev(name="a\"b\\c/\u00e9\u4e2d\n\t"), _ev(name="caf\u00e9"),
                                                 _ev(args={"note": "\\u0041 \u00ff", "x": [{"y": "\u2603"}]})]),
    "escaped names written ASCII": json.dumps({"traceEvents": [_ev(name="\u00e9\u4e2d\u2603 x")]},
                                              ensure_ascii=True).encode(),
    "non-ASCII names written raw": json.dumps({"traceEvents": [_ev(name="\u00e9\u4e2d\U0001F600")]},
                                              ensure_ascii=False).encode(),
    "collective args of every type": _doc([_ev(name="record_param_comms", args=_COMM_ARGS),
                                           _ev(cat="kernel", name="nccl", args={**_COMM_ARGS, "device": 1})]),
    "numbers": _doc([_ev(ts=1.5e3, dur=2e-1), _ev(ts=12345678901234567, dur=0), _ev(ts=-0.0, dur=1E+2),
                     _ev(ts=0.1234567890123456789, dur=3.0000000000000001), _ev(ts=-17, dur=123456.789e-3),
                     _ev(cat="kernel", ts=5, args={"blocks per SM": 7, "grid": [1 << 30, -1, 0]})]),
    "ids": _doc([_ev(pid="stream 7", tid="x -12"), _ev(pid="abc", tid=""), _ev(pid="- 5", tid=None),
                 _ev(pid="99999999999999999999", tid="-9223372036854775808"), _ev(cat="kernel", pid="3", tid="7")]),
    "whitespace everywhere": b' { "traceEvents" : [ { "ph" : "X" , "cat" : "kernel" , "name" : "k" , "ts" : 1 ,'
                             b' "args" : { "grid" : [ 1 , 2 ] } } \n,\r\n\t{ } , { "args" : null } ] } ',
    "empty args and objects": _doc([{}, _ev(args={}), _ev(args=None), {"args": {"grid": []}}]),
    "untabulated oddities": _doc([{"cat": "x", "name": 5.5 if False else None, "pid": "p", "ts": None,
                                   "args": {"Collective name": [1, 2], "Input Dims": {"a": 1}}}]),
    "shapes": _doc([_ev(name="aten::mm", args={"Input Dims": [[2, 3], [3, 4]], "Input type": ["float", ""]}),
                    _ev(name="aten::bmm", args={"Input Dims": "x"}), _ev(name="aten::addmm", args={"Input Dims": 5})]),
    "a big event over several chunks": _doc([_ev(args={"blob": "x" * 300_000}), _ev(ts=5)]),
    "grid, block and ranks past Int32": PAST_INT32,
}
# Refused by the compiled reader although the typed reader reads them (their reading is the typed reader's).
REFUSED_ONLY = {
    "escaped key": _doc([_ev()]).replace(b'"ts"', b'"\\u0074s"'),
    "escaped category": _doc([_ev(cat="cpu_\u006fp")]).replace(b'"cpu_op"', b'"cpu_\\u006fp"'),
    "surrogate pair escape": _doc([_ev(name="\U0001F600")]),
    "duplicate key": _doc([_ev()]).replace(b'"dur": 3', b'"dur": 3, "dur": 4'),
}


@needs_compiled
@pytest.mark.parametrize("name", sorted(ACCEPTED))
def test_the_typed_readers_common_shapes_read_compiled_and_identically(tmp_path: Path, name: str):
    assert compare_compiled(_write(tmp_path, name, ACCEPTED[name])) == ("compiled", [])


@needs_compiled
@pytest.mark.parametrize("name", sorted(COMPILED))
def test_odd_but_valid_shapes_read_compiled_and_identically(tmp_path: Path, name: str):
    assert compare_compiled(_write(tmp_path, name, COMPILED[name])) == ("compiled", [])


@needs_compiled
def test_values_past_int32_give_the_same_frames_and_messages(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    paths = [_write(tmp_path, "past", PAST_INT32), _write(tmp_path, "common", ACCEPTED["common"])]
    assert _same(paths, tmp_path, monkeypatch) == 0
    results = _batch(paths, tmp_path, True, monkeypatch)[1]
    assert [PAST_INT32_NOTE in message for _, message, _ in results] == [True, False]


@needs_compiled
@pytest.mark.parametrize("name", sorted(REJECTED) + sorted(REFUSED_ONLY))
def test_what_the_typed_reader_rejects_the_compiled_one_refuses(tmp_path: Path, name: str):
    how, diff = compare_compiled(_write(tmp_path, name, REJECTED.get(name) or REFUSED_ONLY[name]))
    assert how.startswith("refused: ") and diff == [], how


@needs_compiled
def test_a_refused_file_is_read_by_the_typed_reader_and_its_message_says_so(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch):
    paths = [_write(tmp_path, name, data) for name, data in REFUSED_ONLY.items()]
    paths.append(_write(tmp_path, "common", ACCEPTED["common"]))
    assert _same(paths, tmp_path, monkeypatch) == len(REFUSED_ONLY)
    monkeypatch.setattr(kineto_extract, "kineto_columns", kineto_columns)
    res = kineto.parse(paths[0], ParseContext(tmp_path, paths[0].name))
    assert NOTE + "an escaped event key" in res.message and res.frames["cpu_ops"].height == 1
    stream = kineto.parse(_write(tmp_path, "nan", REJECTED["NaN"]), ParseContext(tmp_path, "nan.json.gz"))
    assert "read by the stream reader" in stream.message and NOTE not in stream.message


_PALETTE = b'{}[],:"\\ 0123456789.eE+-truefalsnNaI\x00\x1f\x7f\xc3\xa9\xff\xed\xa0\x80u'


def _mutant(rnd: random.Random, data: bytes) -> bytes:
    out = bytearray(data)
    kind = rnd.randrange(4)
    if kind == 0:  # cut
        return bytes(out[: rnd.randrange(len(out))])
    for _ in range(rnd.randint(1, 3)):
        at = rnd.randrange(len(out))
        if kind == 1:  # overwrite
            out[at] = rnd.choice(_PALETTE)
        elif kind == 2:  # insert
            out[at:at] = bytes([rnd.choice(_PALETTE)])
        else:  # delete
            del out[at : at + rnd.randint(1, 4)]
    return bytes(out)


@needs_compiled
def test_mutated_and_truncated_traces_read_alike_or_are_handed_over(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    rnd = random.Random(29)
    seeds = [ACCEPTED["common"], COMPILED["collective args of every type"], COMPILED["numbers"], COMPILED["ids"],
             COMPILED["escapes in names and unread strings"], COMPILED["shapes"]]
    root = tmp_path / "m"
    root.mkdir()
    paths, how = [], []
    for i in range(360):
        path = _write(root, f"t{i}", _mutant(rnd, seeds[i % len(seeds)]))
        got, diff = compare_compiled(path)
        assert diff == [], (got, path.read_bytes())
        how.append(got.split(":")[0])
        paths.append(path)
    assert how.count("compiled") > 40 and how.count("refused") > 100
    for i in range(0, len(paths), 40):  # and through the whole parser, a batch at a time
        _same(paths[i : i + 40], root, monkeypatch)


@needs_compiled
def test_random_bytes_and_every_cut_never_crash():
    rnd = random.Random(7)
    text = ACCEPTED["common"][ACCEPTED["common"].index(b"[") + 1 :]
    events = [0]
    for n in range(len(text)):  # every cut of the event array, not final: whole events only, then the end
        ex = Extractor()
        got = kineto_columns.read(bytearray(text[:n]), 0, True, False, ex.names, ex._intern, set(), set(), 0, 0)
        assert isinstance(got, tuple) and got[0] <= n and got[2] >= events[-1]
        assert got[1] == (text[got[0] - 1 : got[0]] == b"]" and got[0] > 1)
        events.append(got[2])
    assert events[-1] == 7
    for _ in range(2000):
        junk = bytearray(rnd.randbytes(rnd.randrange(64)))
        ex = Extractor()
        kineto_columns.read(junk, 0, rnd.random() < 0.5, rnd.random() < 0.5, ex.names, ex._intern, set(), set(), 0, 0)


@needs_compiled
def test_an_event_larger_than_the_cap_is_refused(tmp_path: Path):
    from forensics.parsers.kineto_typed import read_trace_compiled

    path = _write(tmp_path, "big", COMPILED["a big event over several chunks"])
    ex = Extractor()
    with pytest.raises(TypedRejected, match="no whole event within"):
        read_trace_compiled(path, 1 << 30, ex.feed_text, chunk_bytes=1 << 12, max_event=1 << 16)


def test_without_the_extension_the_typed_reader_reads_everything(tmp_path: Path):
    simulate("ddp_straggler", tmp_path / "run", steps=2)
    code = ("import sys, json; sys.modules['forensics.parsers.kineto_columns'] = None\n"  # its import now fails
            "from forensics.parsers import kineto_extract as k; assert k.kineto_columns is None\n"
            "from forensics.pipeline import analyze\n"
            f"a = analyze(__import__('pathlib').Path({str(tmp_path / 'run')!r}))\n"
            "print(json.dumps(sorted([x.key, sorted(x.ranks)] for x in a.findings)))\n"
            "print(json.dumps(sorted(a.sources['message'].to_list())))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    findings, messages = map(json.loads, out.strip().splitlines()[-2:])
    assert findings  # the straggler found
    assert not any("compiled" in m for m in messages)
    here = analyze(tmp_path / "run")
    assert findings == sorted([x.key, sorted(x.ranks)] for x in here.findings)
    assert messages == sorted(here.sources["message"].to_list())
