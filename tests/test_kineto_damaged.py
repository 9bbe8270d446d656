"""Damaged Kineto input: truncated traces are salvaged, corrupt ones fail with one line.

The expected number of salvaged events is computed here independently of the parser: the
uncompressed JSON is walked with ``json.JSONDecoder.raw_decode``, one event at a time, recording
the byte offset where each event's closing brace ends; a trace cut at byte N keeps exactly the
events ending at or before N. For gzip, the bytes a truncated file still holds come from a plain
``zlib.decompressobj``.
"""

from __future__ import annotations

import gzip
import json
import zlib
from pathlib import Path

import pytest
from forensics.parsers.discovery import classify, discover_and_parse
from forensics.parsers.kineto import parse
from forensics.parsers.result import ParseContext

from tests.conftest import shared_path

SMALL = ("param_dlrm_8rank", "worker0_step_12.1694128201545.pt.trace.json.gz")
NS_TRACE = ("hta", "nccl_data.json.gz")


def event_ends(text: bytes) -> tuple[int, list[int]]:
    """(offset just after `[` of traceEvents, byte offsets where each event ends)."""
    doc = text.decode("utf-8")
    assert doc.isascii()  # byte offsets == character offsets
    dec = json.JSONDecoder()
    i = doc.index("[", doc.index('"traceEvents"')) + 1
    start = i
    ends = []
    while True:
        while doc[i] in " \t\r\n,":
            i += 1
        if doc[i] == "]":
            return start, ends
        _, i = dec.raw_decode(doc, i)
        ends.append(i)


def _parse_file(path: Path):
    return parse(path, ParseContext(path.parent, path.name))


def _kept(res) -> int:
    return sum(res.frames[n].height for n in ("kernels", "cpu_ops"))


def _tabulated(text: bytes, upto: int | None = None) -> int:
    """How many of the first events are ones the parser tabulates (GPU or host ranges)."""
    doc = json.loads(text)
    cats = {"kernel", "gpu_memcpy", "gpu_memset", "cpu_op", "user_annotation", "gpu_user_annotation",
            "cuda_runtime", "cuda_driver", "python_function", "Kernel", "Memcpy", "Memset", "Operator", "Runtime"}
    events = doc["traceEvents"] if upto is None else doc["traceEvents"][:upto]
    return sum(1 for e in events if e.get("cat") in cats)


@pytest.fixture(scope="module")
def plain_trace(tmp_path_factory) -> tuple[Path, bytes]:
    raw = gzip.decompress(shared_path("kineto", *SMALL).read_bytes())
    path = tmp_path_factory.mktemp("plain") / "worker0.pt.trace.json"
    path.write_bytes(raw)
    return path, raw


@pytest.mark.parametrize("fraction", [0.05, 0.31, 0.5, 0.77, 0.999])
def test_plain_trace_cut_mid_write_keeps_every_complete_event(tmp_path: Path, plain_trace, fraction: float):
    src, raw = plain_trace
    start, ends = event_ends(raw)
    cut = start + int((ends[-1] - start) * fraction)
    path = tmp_path / "cut.pt.trace.json"
    path.write_bytes(raw[:cut])
    res = _parse_file(path)
    complete = sum(1 for e in ends if e <= cut)
    assert res.status == "partial"
    assert f"truncated at byte {cut:,}" in res.message and f"kept {complete:,} complete events" in res.message
    assert "\n" not in res.message
    assert _kept(res) == _tabulated(raw, complete)
    assert res.rank == 0  # distributedInfo is before the events


def test_cut_exactly_after_an_event_and_after_its_comma(tmp_path: Path, plain_trace):
    _, raw = plain_trace
    start, ends = event_ends(raw)
    for n, cut in ((100, ends[99]), (200, ends[199] + 1)):
        path = tmp_path / f"cut{n}.json"
        path.write_bytes(raw[:cut])
        res = _parse_file(path)
        assert res.status == "partial" and f"kept {n:,} complete events" in res.message
        assert _kept(res) == _tabulated(raw, n)


def test_cut_after_the_array_keeps_every_event(tmp_path: Path, plain_trace):
    _, raw = plain_trace
    _, ends = event_ends(raw)
    cut = raw.index(b"]", ends[-1]) + 3  # inside the trailing metadata
    path = tmp_path / "cut.json"
    path.write_bytes(raw[:cut])
    res = _parse_file(path)
    assert res.status == "partial" and f"kept {len(ends):,} complete events" in res.message
    assert _kept(res) == _tabulated(raw)


@pytest.mark.parametrize("fraction", [0.1, 0.5, 0.9])
def test_gzip_trace_cut_mid_write(tmp_path: Path, fraction: float):
    gz = shared_path("kineto", *NS_TRACE).read_bytes()
    raw = gzip.decompress(gz)
    _, ends = event_ends(raw)
    cut_gz = gz[: int(len(gz) * fraction)]
    held = zlib.decompressobj(31).decompress(cut_gz)  # what the cut file still holds
    complete = sum(1 for e in ends if e <= len(held))
    path = tmp_path / "rank0.json.gz"
    path.write_bytes(cut_gz)
    res = _parse_file(path)
    assert res.status == "partial"
    assert f"truncated at byte {len(held):,}" in res.message and "gzip stream truncated" in res.message
    assert f"kept {complete:,} complete events" in res.message
    assert _kept(res) == _tabulated(raw, complete)
    # discovery still recognises the cut file and reports it as partial
    f = classify(path, path.name)
    assert (f.kind, f.status) == ("kineto", None)


def test_corrupt_gzip_fails_cleanly(tmp_path: Path):
    gz = bytearray(shared_path("kineto", *SMALL).read_bytes())
    gz[20:60] = bytes(b ^ 0x5A for b in gz[20:60])
    path = tmp_path / "rank0.json.gz"
    path.write_bytes(bytes(gz))
    res = _parse_file(path)
    assert res.status == "failed" and "gzip" in res.message and "\n" not in res.message


def test_corrupt_gzip_mid_stream_salvages_what_came_before(tmp_path: Path):
    gz = bytearray(shared_path("kineto", *NS_TRACE).read_bytes())
    mid = len(gz) // 2
    gz[mid : mid + 64] = bytes(64)
    path = tmp_path / "rank0.json.gz"
    path.write_bytes(bytes(gz))
    res = _parse_file(path)
    assert res.status == "partial" and "corrupt gzip data" in res.message
    assert _kept(res) > 0


@pytest.mark.parametrize(
    "content,reason",
    [
        (b"", "empty file"),
        (b"   \n", "empty file"),
        (b"hello, this is not json", "not JSON"),
        (b'{"schemaVersion": 1, "deviceProperties": [', "not valid JSON"),
        (b'{"foo": 1}', "without a traceEvents array"),
        (b'{"traceEvents": {"ph": "X"}}', "traceEvents is a dict"),
        (b"[1, 2, 3]", "not a list of event objects"),
        (b'"just a string"', "not JSON"),
    ],
)
def test_bad_documents_fail_with_one_line_reason(tmp_path: Path, content: bytes, reason: str):
    path = tmp_path / "trace.json"
    path.write_bytes(content)
    res = _parse_file(path)
    assert res.status == "failed", res.message
    assert reason in res.message and "\n" not in res.message


def test_empty_event_list_is_ok(tmp_path: Path):
    path = tmp_path / "trace.json"
    path.write_bytes(b'{"schemaVersion": 1, "traceEvents": []}')
    res = _parse_file(path)
    assert res.status == "ok" and res.frames["kernels"].height == 0


def test_bare_event_array_and_odd_values(tmp_path: Path):
    events = [
        {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_SendRecv", "pid": "0", "tid": "stream 3", "ts": 10.5,
         "dur": 1,
         "args": {"grid": [2], "correlation": "17"}},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": None, "ts": 1, "dur": 2},
        {"ph": "X", "cat": "cpu_op", "ts": 1, "dur": 2},  # no name: malformed, counted
        {"ph": "X", "cat": "kernel", "name": "k", "ts": "soon"},  # no numeric ts: malformed, counted
        "not an event",
    ]
    path = tmp_path / "trace.json"
    path.write_bytes(json.dumps(events).encode())
    res = _parse_file(path)
    assert res.status == "ok" and "3 malformed events skipped" in res.message
    k = res.frames["kernels"].row(0, named=True)
    assert (k["class"], k["collective"], k["device"], k["stream"], k["correlation"], k["grid_x"], k["grid_y"]) == (
        "comm", "sendrecv", 0, 3, 17, 2, None,
    )
    assert k["start_ns"] == 10500 and k["end_ns"] == 11500
    assert res.frames["cpu_ops"].height == 1


def test_decompression_is_bounded(tmp_path: Path):
    src = shared_path("kineto", *SMALL)
    res = parse(src, ParseContext(src.parent, src.name, max_decompressed_bytes=200_000))
    assert res.status == "partial" and "exceeds the limit of 200000 bytes" in res.message
    bomb = tmp_path / "bomb.json.gz"
    bomb.write_bytes(gzip.compress(b"[" + b" " * 5_000_000 + b"]"))
    res = parse(bomb, ParseContext(tmp_path, bomb.name, max_decompressed_bytes=1_000_000))
    assert res.status in ("failed", "partial") and "limit" in res.message


def test_truncated_trace_in_a_run_dir_is_a_partial_source(tmp_path: Path, plain_trace):
    _, raw = plain_trace
    run = tmp_path / "run"
    run.mkdir()
    (run / "rank0.pt.trace.json").write_bytes(raw[: len(raw) // 2])
    (run / "rank1.pt.trace.json.gz").write_bytes(b"\x1f\x8b\x08\x00garbage" * 10)
    results = {r.file.rel_path: r.result for r in discover_and_parse(run, workers=1)}
    assert results["rank0.pt.trace.json"].status == "partial"
    assert results["rank1.pt.trace.json.gz"].status == "failed"
    assert "gzip" in results["rank1.pt.trace.json.gz"].message


def test_many_random_cuts(tmp_path: Path, plain_trace):
    """Cut anywhere: before the first complete event -> failed; after it -> partial with exactly the
    complete events; after the last byte of content -> ok."""
    import random

    _, raw = plain_trace
    start, ends = event_ends(raw)
    rnd = random.Random(20261122)
    path = tmp_path / "cut.json"
    for cut in [rnd.randrange(0, len(raw)) for _ in range(40)] + [1, start - 1, start, start + 1]:
        path.write_bytes(raw[:cut])
        res = _parse_file(path)
        complete = sum(1 for e in ends if e <= cut)
        if cut < start or complete == 0:  # nothing usable before the first complete event
            assert res.status == "failed", (cut, res.message)
        else:
            assert res.status == "partial", (cut, res.message)
            assert f"kept {complete:,} complete events" in res.message, (cut, res.message)


def test_braces_and_commas_inside_strings(tmp_path: Path):
    """`},` inside names of instant, flow-like and kernel events must not split or cut events."""
    events = [
        {"ph": "i", "cat": "cpu_instant_event", "name": "odd },{ name", "pid": 1, "tid": 1, "ts": 5,
         "args": {"x": "},"}},
        {"ph": "X", "cat": "kernel", "name": "void k<{1},{2}>(int) },", "pid": 0, "tid": 7, "ts": 10, "dur": 2,
         "args": {"stream": 7, "correlation": 3}},
        {"ph": "f", "id": 3, "pid": 0, "tid": 7, "ts": 10, "cat": "ac2g", "name": "ac2g", "bp": "e"},
    ] * 3000
    doc = json.dumps({"traceEvents": events, "baseTimeNanoseconds": 1000}, indent=1).encode()
    path = tmp_path / "trace.json"
    path.write_bytes(doc)
    res = _parse_file(path)
    assert res.status == "ok", res.message
    k = res.frames["kernels"]
    assert k.height == 3000 and set(k.get_column("name")) == {"void k<{1},{2}>(int) },"}
    assert k.get_column("start_ns")[0] == 10_000 + 1000
    assert "6,000 flow/instant/metadata events not tabulated" in res.message
    # and cut in the middle, at a `},` inside a string
    cut = doc.index(b"odd },{", len(doc) // 2) + 5
    path.write_bytes(doc[:cut])
    res = _parse_file(path)
    _, ends = event_ends(doc)
    assert res.status == "partial" and f"kept {sum(1 for e in ends if e <= cut):,} complete events" in res.message


def test_unhashable_category_or_phase_and_non_object_args_are_counted_not_raised(tmp_path: Path):
    ok = {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 1, "dur": 2}
    events = [
        ok,
        {"ph": "X", "cat": ["kernel"], "name": "k", "ts": 1},  # list category: malformed
        {"ph": ["X"], "cat": "mystery", "name": "k", "ts": 1},  # list phase, unknown category: malformed
        # args that are not an object on a collective op: the op is kept, its collective args are null
        {"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "pid": 1, "tid": 1, "ts": 5, "dur": 1, "args": [1]},
        ok,
    ]
    path = tmp_path / "trace.json"
    path.write_bytes(json.dumps({"traceEvents": events}).encode())
    res = _parse_file(path)
    assert res.status == "ok" and "2 malformed events skipped" in res.message, res.message
    assert res.frames["cpu_ops"].height == 3
    comms = res.frames["comms"]
    assert comms.height == 1 and comms.row(0, named=True)["collective"] is None
    assert comms.row(0, named=True)["start_ns"] == 5000


def test_event_larger_than_a_chunk_and_events_after_it(tmp_path: Path):
    """An event bigger than the read window widens it for itself only; every event is kept."""
    small = {"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 1, "tid": 1, "ts": 1, "dur": 1}
    huge = {"ph": "X", "cat": "cpu_op", "name": "big", "pid": 1, "tid": 1, "ts": 2, "dur": 1,
            "args": {"Input Dims": [[i, i + 1] for i in range(60_000)]}}  # ~1 MB of text
    events = [small] * 5000 + [huge] + [small] * 5000 + [huge, huge] + [small] * 20
    path = tmp_path / "trace.json"
    path.write_bytes(json.dumps({"traceEvents": events}).encode())
    res = _parse_file(path)
    assert res.status == "ok", res.message
    names = res.frames["cpu_ops"].get_column("name")
    assert names.len() == 10_023 and (names == "big").sum() == 3


def test_fast_and_per_event_paths_agree(tmp_path: Path):
    """A chunk with one odd value goes through the per-event loop; both paths give the same frames."""
    from forensics.parsers.kineto_extract import Extractor
    from forensics.parsers.kineto_stream import read_trace

    src = shared_path("kineto", *SMALL)
    chunks: list[list] = []
    read_trace(src, 1 << 40, chunks.append)
    fast, slow = Extractor(), Extractor()
    for chunk in chunks:
        fast.feed(chunk)
        slow._feed_rows(chunk)
    assert fast.malformed == slow.malformed == 0 and fast.skipped == slow.skipped
    f_gpu, s_gpu = fast.gpu_frame(), slow.gpu_frame()
    f_cpu, s_cpu = fast.cpu_frame(), slow.cpu_frame()
    assert f_gpu is not None and f_gpu.height > 0 and f_gpu.equals(s_gpu)
    assert f_cpu is not None and f_cpu.height > 0 and f_cpu.equals(s_cpu)
    assert fast.comm_frame(f_cpu).equals(slow.comm_frame(s_cpu))


def _past_int32_trace() -> bytes:
    """A kernel whose grid x is 2^32 and block z -2^31 - 1, a sound kernel, a send whose Src Rank is 2^32."""
    big = 1 << 32
    kernel = {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 10, "dur": 2,
              "args": {"device": 0, "stream": 7, "grid": [big, 1, 1], "block": [128, 1, -(1 << 31) - 1]}}
    sound = {**kernel, "ts": 20, "args": {"device": 0, "stream": 7, "grid": [2, 1, 1], "block": [128, 1, 1]}}
    send = {"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "pid": 1, "tid": 1, "ts": 5, "dur": 30,
            "args": {"Collective name": "send", "Group size": 2, "Src Rank": big, "Dst Rank": 1, "Seq": 1}}
    return json.dumps({"distributedInfo": {"rank": 0}, "traceEvents": [send, kernel, sound]}).encode()


PAST_INT32 = _past_int32_trace()
PAST_INT32_NOTE = "3 values past Int32 read as null (block_z, grid_x, src_rank)"


@pytest.mark.parametrize("reader", ["compiled", "typed", "stream"])
def test_values_past_int32_are_read_as_null_and_counted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, reader: str):
    """A grid, block or rank too large for the frames' Int32 columns is damage: the value becomes null and the
    source's message counts it (the event is kept), whichever reader read the file; never a parser error."""
    from forensics.parsers import kineto, kineto_extract
    from forensics.parsers.kineto_typed import TypedRejected

    if reader == "compiled" and kineto_extract.kineto_columns is None:
        pytest.skip("built without a C compiler or Python's headers")
    if reader != "compiled":
        monkeypatch.setattr(kineto_extract, "kineto_columns", None)
    if reader == "stream":
        def rejected(*_args):
            raise TypedRejected("forced")
        monkeypatch.setattr(kineto, "read_trace_typed", rejected)
    path = tmp_path / "trace.json"
    path.write_bytes(PAST_INT32)
    res = _parse_file(path)
    assert res.status == "ok" and PAST_INT32_NOTE in res.message, res.message
    assert ("stream reader" in res.message) == (reader == "stream")
    kernels = res.frames["kernels"].sort("start_ns")
    assert kernels.select("grid_x", "grid_y", "block_x", "block_z").rows() == [(None, 1, 128, None), (2, 1, 128, 1)]
    comms = res.frames["comms"]
    assert comms.select("src_rank", "dst_rank", "group_size").rows() == [(None, 1, 2)]


def _metadata_past_int32(dist: dict, props: list | None = None, collective_ranks: str | None = None) -> bytes:
    """A small trace whose metadata (``distributedInfo``, ``deviceProperties``) or a collective's ``Process Group
    Ranks`` holds a value past Int32."""
    events = [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 11, "tid": 12, "ts": 990, "dur": 3, "args": {}},
              {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 1000, "dur": 2,
               "args": {"device": 0, "stream": 7}}]
    if collective_ranks is not None:
        events.append({"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "pid": 11, "tid": 12, "ts": 1000,
                       "dur": 20, "args": {"Collective name": "allreduce", "Process Group Ranks": collective_ranks,
                                           "Seq": 1}})
    doc: dict = {"distributedInfo": dist, "traceEvents": events}
    if props is not None:
        doc["deviceProperties"] = props
    return json.dumps(doc).encode()


BIG = 1 << 32
METADATA_PAST_INT32 = {
    "rank": (_metadata_past_int32({"rank": BIG}), "1 value past Int32 read as null (rank); rank 3 from the file name"),
    "world_size": (_metadata_past_int32({"rank": 0, "world_size": BIG}),
                   "1 value past Int32 read as null (world_size)"),
    "sm_count": (_metadata_past_int32({"rank": 0}, [{"id": 0, "name": "H100", "numSms": BIG}]),
                 "1 value past Int32 read as null (sm_count)"),
    "pg_config": (_metadata_past_int32({"rank": 0, "pg_config": [{"pg_name": "0", "pg_size": BIG, "ranks": [0, BIG]}]}),
                  "2 values past Int32 read as null (pg_ranks, pg_size)"),
    "collective": (_metadata_past_int32({"rank": 0}, collective_ranks=f"[0, {BIG}]"),
                   "1 value past Int32 read as null (pg_ranks)"),
}


@pytest.mark.parametrize("case", sorted(METADATA_PAST_INT32))
@pytest.mark.parametrize("reader", ["compiled", "python"])
def test_metadata_past_int32_is_read_as_absent_and_counted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           case: str, reader: str):
    """A rank, world size, SM count, group size or member past Int32 is damage: read as absent (a member list as
    unknown) and counted in the source's message; the file parses (it failed as an internal parser error)."""
    from forensics.parsers import kineto_extract

    if reader == "compiled" and kineto_extract.kineto_columns is None:
        pytest.skip("built without a C compiler or Python's headers")
    if reader == "python":
        monkeypatch.setattr(kineto_extract, "kineto_columns", None)
    data, note = METADATA_PAST_INT32[case]
    path = tmp_path / "rank3.pt.trace.json"
    path.write_bytes(data)
    res = _parse_file(path)
    assert res.status == "ok" and note in res.message, res.message
    ranks = res.frames["ranks"]
    assert ranks.get_column("rank").to_list() == [3 if case == "rank" else 0]
    assert ranks.get_column("world_size").to_list() == [None]
    assert ranks.get_column("sm_count").to_list() == [None]
    groups = res.frames["process_groups"]
    if case == "pg_config":
        assert groups.select("pg_size", "pg_id").rows() == [(None, None)], groups
        assert groups.get_column("pg_ranks").to_list() == [None]
    if case == "collective":  # a group no member list names is not a row of its own, as before
        assert groups.height == 0 and res.frames["comms"].get_column("pg_id").to_list() == [None]
