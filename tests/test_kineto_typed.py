"""The typed Kineto decoder (msgspec) against the stream reader it falls back to: the same frames from every
trace, the stream reader for whatever the typed decoder rejects, and the fallback said in the source's message."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from forensics.parsers import kineto, kineto_extract
from forensics.parsers.kineto_typed import TypedRejected
from forensics.parsers.result import ParseContext

from forensics.simulate import simulate
from tests.conftest import ROOT, SAMPLE_DATA, shared_path
from tests.decoder_check import compare, trace_files

REAL = [p.relative_to(SAMPLE_DATA).as_posix() for p in trace_files(SAMPLE_DATA / "kineto")]
BUNDLED = [p.relative_to(ROOT).as_posix() for p in trace_files(ROOT / "sample_traces")]
SCENARIOS = ["ddp_straggler", "pp_megatron_imbalance", "old_nccl", "compiled", "graph_capture", "symm_tp",
             "fsdp2_prefetch", "hsdp_slow_nic", "item_sync", "xid79"]


def test_the_shared_kineto_traces_are_all_there():
    assert len(REAL) >= 17  # the listing above is what the parametrised tests run over
    shared_path("kineto", "hta", "df_index_resolver.json.gz")


@pytest.mark.parametrize("rel", REAL)
def test_real_traces_decode_typed_and_identically(rel: str):
    how, diff = compare(shared_path(*rel.split("/")))
    assert (how, diff) == ("typed", [])


@pytest.mark.parametrize("rel", BUNDLED)
def test_bundled_samples_decode_typed_and_identically(rel: str):
    how, diff = compare(ROOT / rel)
    assert (how, diff) == ("typed", [])


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_simulated_traces_decode_typed_and_identically(tmp_path: Path, scenario: str):
    simulate(scenario, tmp_path / "run", steps=2)
    files = trace_files(tmp_path / "run")
    assert files
    for path in files:
        assert compare(path) == ("typed", []), path


def _doc(events: list, **meta) -> dict:
    return {"schemaVersion": 1, "distributedInfo": {"rank": 0, "world_size": 1}, "traceEvents": events, **meta}


def _kernel(i: int, **args) -> dict:
    base = {"device": 0, "stream": 7, "correlation": 100 + i, "External id": 10 + i, "grid": [4, 1, 1],
            "block": [128, 1, 1], "blocks per SM": 0.5}
    return {"ph": "X", "cat": "kernel", "name": f"k{i % 3}", "pid": 0, "tid": 7, "ts": 1000.0 + i, "dur": 2.5,
            "args": {**base, **args}}


def _op(i: int, **extra) -> dict:
    return {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 11, "tid": 12, "ts": 990 + i, "dur": 3,
            "args": {"External id": 10 + i, "Input Dims": [[2, 3], [3, 4]], "Input type": ["float", "float"]},
            **extra}


def _comm(i: int) -> dict:
    return {"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "pid": 11, "tid": 12, "ts": 995 + i, "dur": 1,
            "args": {"External id": 50 + i, "Collective name": "allreduce", "In msg nelems": 1024,
                     "Out msg nelems": 1024, "dtype": "Float", "Group size": 2, "Process Group Name": "0",
                     "Process Group Description": "default_pg", "Process Group Ranks": "[0, 1]", "Seq": i}}


FLOW = {"ph": "f", "id": 1, "pid": 0, "tid": 7, "ts": 1000, "cat": "ac2g", "name": "ac2g", "bp": "e"}
INSTANT = {"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "pid": 11, "tid": 12, "ts": 999, "s": "t",
           "args": {"Device Type": 1, "Bytes": 512, "Device Id": 0}}
COMMON = [_op(0), _kernel(0), FLOW, _comm(1), _kernel(1, **{"Collective name": "allreduce", "In msg nelems": 8}),
          INSTANT, {"ph": "M", "name": "process_name", "pid": 11, "args": {"name": "python"}}]

# Read by the typed decoder, identically to the stream reader.
ACCEPTED = {
    "common": json.dumps(_doc(COMMON), indent=1).encode(),
    "bare array": json.dumps(COMMON).encode(),
    "metadata after the events": json.dumps(_doc(COMMON, baseTimeNanoseconds=1_700_000_000_000_000_000,
                                                 traceName="x")).encode(),
    "legacy ids": json.dumps(_doc([{"ph": "X", "cat": "Kernel", "name": "k", "pid": 0, "tid": "stream 7", "ts": 5,
                                    "dur": 1, "args": {"correlation": 3, "external id": 4}},
                                   {"ph": "X", "cat": "Operator", "name": "op", "pid": "11", "tid": "thread 12",
                                    "ts": 4, "dur": 3, "args": {"external id": 4}}])).encode(),
    "short and long grids, no device": json.dumps(_doc([_kernel(0, grid=[4], block=[]), _kernel(1, grid=[1, 2, 3, 4]),
                                                        {**_kernel(2), "args": {"correlation": 1}},
                                                        _kernel(3, **{"graph id": 5, "graph node id": 9})])).encode(),
    "ns floats and big ints": json.dumps(_doc([{**_kernel(0), "ts": 1669783687464181.123, "dur": 0.001},
                                               {**_op(1), "ts": 1669783687464181999}])).encode(),
    "null names of untabulated events": json.dumps(_doc([{"ph": "i", "cat": None, "name": None}, _op(0)])).encode(),
    "many chunks": json.dumps(_doc([_kernel(i) for i in range(6000)] + [_op(i) for i in range(6000)])).encode(),
    "empty": json.dumps(_doc([])).encode(),
}

# Left to the stream reader, which reads them its own way.
REJECTED = {
    "NaN": json.dumps(_doc(COMMON)).replace('"dur": 2.5', '"dur": NaN', 1).encode(),
    "Infinity in an instant's args": json.dumps(_doc([INSTANT | {"args": {"x": "INF"}}, _op(0)]))
    .replace('"INF"', "Infinity").encode(),
    "truncated": json.dumps(_doc(COMMON)).encode()[:-40],
    "stray bytes after the document": json.dumps(_doc(COMMON)).encode() + b"\x00garbage",
    "stray bytes between events": json.dumps(_doc(COMMON)).replace('}, {"ph": "f"', '}, ]] {"ph": "f"').encode(),
    "not UTF-8 in a key nobody reads": json.dumps(_doc([_op(0, note="\udcff")]), ensure_ascii=False)
    .encode("utf-8", "surrogateescape"),
    "string id": json.dumps(_doc([_kernel(0, correlation="17")])).encode(),
    "null ts": json.dumps(_doc([{**_op(0), "ts": None}])).encode(),
    "null dur": json.dumps(_doc([{**_op(0), "dur": None}])).encode(),
    "bool id": json.dumps(_doc([_kernel(0, stream=True)])).encode(),
    "65-bit id": json.dumps(_doc([_kernel(0, correlation=1 << 64)])).encode(),
    "65-bit pid": json.dumps(_doc([{**_op(0), "pid": 1 << 63}])).encode(),
    "float id": json.dumps(_doc([_kernel(0, correlation=3.0)])).encode(),
    "instant of a tabulated category": json.dumps(_doc([{**_op(0), "ph": "i"}])).encode(),
    "no name": json.dumps(_doc([{k: v for k, v in _op(0).items() if k != "name"}])).encode(),
    "nested collective arg": json.dumps(_doc([{**_comm(0), "args": {"Collective name": ["all", "reduce"]}}])).encode(),
    "args not an object": json.dumps(_doc([{**_op(0), "args": [1]}])).encode(),
    "event not an object": json.dumps(_doc([_op(0), 7])).encode(),
    "a key the frames read, of another type, on an untabulated event":
    json.dumps(_doc([INSTANT | {"args": {"device": "cuda:0"}}, _op(0)])).encode(),
    "too deep": json.dumps(_doc([_op(0, deep="DEEP")])).replace('"DEEP"', "[" * 1000 + "]" * 1000).encode(),
}


def _write(tmp_path: Path, name: str, data: bytes) -> Path:
    path = tmp_path / (name.replace(" ", "_").replace("'", "") + ".json.gz")
    path.write_bytes(gzip.compress(data))
    return path


@pytest.mark.parametrize("name", sorted(ACCEPTED))
def test_typed_decoder_reads_common_shapes_identically(tmp_path: Path, name: str):
    assert compare(_write(tmp_path, name, ACCEPTED[name])) == ("typed", [])


@pytest.mark.parametrize("name", sorted(REJECTED))
def test_typed_decoder_leaves_odd_documents_to_the_stream_reader(tmp_path: Path, name: str):
    how, diff = compare(_write(tmp_path, name, REJECTED[name]))
    assert how.startswith("rejected: ") and diff == [], how


def _frames(path: Path, force_stream: bool, monkeypatch: pytest.MonkeyPatch):
    if force_stream:
        def reject(*_a, **_k):
            raise TypedRejected("forced")
        monkeypatch.setattr(kineto, "read_trace_typed", reject)
        monkeypatch.setattr(kineto_extract, "kineto_columns", None)  # it would read the file first
    res = kineto.parse(path, ParseContext(path.parent, path.name))
    monkeypatch.undo()
    return res


@pytest.mark.parametrize("rel", [("hta", "nccl_data.json.gz"), ("kineto_tb_plugin",
                                 "worker0.1623143089861.pt.trace.json.gz"), ("tracelens", "eager_trace.json.gz")])
def test_frames_equal_whichever_reader(rel: tuple[str, str], monkeypatch: pytest.MonkeyPatch):
    path = shared_path("kineto", *rel)
    typed, stream = _frames(path, False, monkeypatch), _frames(path, True, monkeypatch)
    assert typed.message == stream.message.replace("; read by the stream reader (forced)", "")
    assert "stream reader" in stream.message and "stream reader" not in typed.message
    assert typed.frames.keys() == stream.frames.keys()
    for name, df in typed.frames.items():
        assert df.height == stream.frames[name].height, name
        assert df.equals(stream.frames[name], null_equal=True), name


def test_a_rejected_file_is_read_by_the_stream_reader_and_its_message_says_so(tmp_path: Path):
    path = _write(tmp_path, "nan", REJECTED["NaN"])
    res = kineto.parse(path, ParseContext(path.parent, path.name))
    assert res.status == "ok"
    assert "read by the stream reader (typed decoding" in res.message
    assert res.frames["kernels"].height == 2 and res.frames["kernels"]["end_ns"].null_count() == 0
    kernels = res.frames["kernels"].sort("correlation")
    # the NaN duration reads as none (the kernel ends where it starts), the other as written
    assert (kernels["end_ns"] - kernels["start_ns"]).to_list() == [0, 2500]
    good = kineto.parse(_write(tmp_path, "common", ACCEPTED["common"]), ParseContext(tmp_path, "common.json.gz"))
    assert "stream reader" not in good.message
