"""Flight Recorder dumps: safe loading, every format variant, frames, and the hang verdict on real and simulated
jobs."""

from __future__ import annotations

import pickletools
import re
from datetime import datetime, timezone
from pathlib import Path

import orjson
import polars as pl
import pytest
from conftest import shared_path
from forensics.parsers import flight_recorder, fr_pickle
from forensics.parsers.discovery import discover
from forensics.parsers.result import ParseContext

from forensics.base import frames as fr
from forensics.facts import hang
from forensics.pipeline import analyze, analyze_frames, load
from forensics.simulate import flight_recorder as sim
from forensics.simulate.fr_pickle import dumps

CASES = ("gpu_error_1st", "lock_gil_1st")
CLASS_OF_FAULT = {"GPU_ERROR": "device", "LOCK_GIL": "host"}


def _case(name: str) -> Path:
    return shared_path("flight_recorder", "nvrx_fault_injection", name)


def _injected(case: Path) -> dict[str, set[int]]:
    """The injected ranks by class, read from the case's own fault_injection.log (not from our parser)."""
    out: dict[str, set[int]] = {}
    for m in re.finditer(r"Rank (\d+), fault_type: (\w+)", (case / "fault_injection.log").read_text()):
        out.setdefault(CLASS_OF_FAULT[m[2]], set()).add(int(m[1]))
    return out


def _parse(path: Path, rel: str | None = None):
    return flight_recorder.parse(path, ParseContext(path.parent, rel or path.name))


def _hang(findings, key: str):
    return [f for f in findings if f.detector == "hang_verdict" and f.key == key]


def _culprits(findings) -> dict[str, set[int]]:
    out = {}
    for cls in ("device", "host"):
        ranks = {r for f in _hang(findings, f"stuck_{cls}") for r in f.ranks}
        if ranks:
            out[cls] = ranks
    return out


# --- the real shared dumps ------------------------------------------------------------------------


@pytest.mark.parametrize("case", CASES)
def test_real_dumps_use_only_allowed_opcodes_and_the_writer_reproduces_them(case):
    paths = sorted(_case(case).glob("_dump_*"))
    assert len(paths) == 16
    for path in paths:
        data = path.read_bytes()
        used = {op.name for op, _, _ in pickletools.genops(data)}
        assert used <= fr_pickle.ALLOWED, (path.name, used - fr_pickle.ALLOWED)
        # the simulator's standard-library writer gives torch's bytes back exactly
        assert dumps(fr_pickle.loads(data)) == data, path.name


@pytest.mark.parametrize("case", CASES)
def test_real_dumps_are_found_by_content_and_parsed(case):
    files = [f for f in discover(_case(case)) if f.rel_path.startswith("_dump_")]
    assert len(files) == 16 and {f.kind for f in files} == {"flight_recorder"}
    for f in files:
        res = _parse(f.path)
        assert res.status == "ok", res.message
        assert res.rank == int(f.rel_path.rsplit("_", 1)[1])
        dump = res.frames["fr_dumps"].row(0, named=True)
        assert dump["version"] == "2.9" and dump["comm_lib_version"] == "2.27.3" and dump["format"] == "pickle"
        status = res.frames["fr_pg_status"]
        assert status["pg_name"].null_count() == 0 and status.height == dump["pg_count"]
        raw = fr_pickle.loads(f.path.read_bytes())
        assert res.frames["fr_entries"].height == len(raw["entries"]) == dump["entries"]
        if raw["entries"]:
            first = raw["entries"][0]
            row = res.frames["fr_entries"].head(1).join(res.frames["fr_signatures"], on="sig").row(0, named=True)
            assert (row["collective_seq"], row["pg_name"], row["pg_desc"], row["in_sizes"]) == (
                first["collective_seq_id"], *first["process_group"], first["input_sizes"])
            assert row["timeout_ns"] == first["timeout_ms"] * 1_000_000 and row["state"] == first["state"]


@pytest.mark.parametrize("case", CASES)
def test_real_cases_name_exactly_the_injected_ranks(case):
    analysis = analyze(_case(case))
    assert _culprits(analysis.findings) == _injected(_case(case))
    f = _hang(analysis.findings, f"stuck_{next(iter(_injected(_case(case))))}")[0]
    assert f.gpu_seconds_lost and f.gpu_seconds_lost > 0
    assert any(inc.root_cause == f.id and inc.gpu_hours_lost for inc in analysis.incidents)


def _hang_evidence(frames: fr.JobFrames) -> list[tuple]:
    return [(f.key, f.process_group, f.victims, f.evidence) for f in analyze_frames(Path("."), frames).findings
            if f.detector == "hang_verdict"]


@pytest.mark.parametrize("case", CASES)
def test_hang_evidence_does_not_depend_on_the_order_of_the_dumps_rows(case):
    """The evidence (cut at 12 culprit and 12 victim rows) is the same whatever the order of the frames' rows: the
    culprits in the group whose blocked collective was enqueued first first, then by rank; the victims by rank."""
    _, frames = load(_case(case), workers=1)
    base = _hang_evidence(frames)
    fr_frames = ("fr_dumps", "fr_pg_status", "fr_entries", "fr_signatures")
    for seed in (1, 2, 3):
        shuffled = {name: frames[name].sample(fraction=1.0, shuffle=True, seed=seed) for name in fr_frames}
        assert _hang_evidence(fr.JobFrames({**{n: frames[n] for n in frames.present}, **shuffled},
                                           present=frames.present)) == base, seed
    [(_, _, victims, evidence)] = [row for row in base if row[0].startswith("stuck_")]
    culprits = [e for e in evidence if e["role"] == "culprit"]
    blocked = hang.blocked_collectives(hang.vote(hang.counters_from_dumps(frames["fr_pg_status"])),
                                       frames["fr_entries"], None, frames["fr_signatures"])
    enqueued = dict(blocked.drop_nulls("created_ns").select("pg_name", "created_ns").iter_rows())
    keys = [(e["pg_name"] not in enqueued, enqueued.get(e["pg_name"], 0), e["rank"]) for e in culprits]
    assert len(culprits) > 1 and keys == sorted(keys) and not keys[0][0]
    assert [e["rank"] for e in evidence if e["role"] == "victim"] == sorted(victims) and 0 < len(victims) <= 12


def _json_rewrite(src: Path, dst: Path) -> None:
    """The case as torch's dump_json would have written it, under other file names (with a host in them)."""
    dst.mkdir()
    for path in src.glob("_dump_*"):
        rank = int(path.name.rsplit("_", 1)[1])
        doc = sim.to_json_doc(fr_pickle.loads(path.read_bytes()))
        (dst / f"nccl_trace_rank_gpu-node{rank // 8}_{rank}.json").write_bytes(orjson.dumps(doc))


@pytest.mark.parametrize("case", CASES)
def test_json_rewrite_of_the_real_cases_gives_the_same_culprits(tmp_path, case):
    _json_rewrite(_case(case), tmp_path / "json")
    analysis = analyze(tmp_path / "json")
    assert _culprits(analysis.findings) == _injected(_case(case))
    src = analysis.sources.filter(pl.col("kind") == "flight_recorder")
    assert src.height == 16 and set(src["status"].to_list()) == {"ok"}
    assert {(r, h) for r, h in src.select("rank", "host").iter_rows()} == {(r, f"gpu-node{r // 8}") for r in range(16)}
    culprit = _hang(analysis.findings, "stuck_" + next(iter(_injected(_case(case)))))[0]
    assert set(culprit.hosts) == {f"gpu-node{r // 8}" for r in culprit.ranks}


# --- safety ---------------------------------------------------------------------------------------


def _malicious(marker: Path) -> bytes:
    """A dump-looking pickle whose entries would run `touch MARKER` through os.system when unpickled naively."""
    cmd = f"touch {marker}".encode()
    call = b"cos\nsystem\n(X" + len(cmd).to_bytes(4, "little") + cmd + b"tR"
    return (b"\x80\x02}(X\x07\x00\x00\x00versionX\x03\x00\x00\x002.9X\t\x00\x00\x00pg_status}X\x07\x00\x00\x00entries]("
            + call + b"eu.")


def test_a_pickle_that_would_run_a_command_is_refused_and_runs_nothing(tmp_path):
    marker = tmp_path / "pwned"
    run = tmp_path / "run"
    run.mkdir()
    (run / "nccl_trace_rank_0").write_bytes(_malicious(marker))
    ok = sim.dump_doc(sim.healthy(4), 1, "2.9", False)
    (run / "nccl_trace_rank_1").write_bytes(dumps(ok))
    analysis = analyze(run)
    rows = {r["path"]: r for r in analysis.sources.iter_rows(named=True)}
    assert rows["nccl_trace_rank_0"]["kind"] == "flight_recorder" and rows["nccl_trace_rank_0"]["status"] == "failed"
    assert "GLOBAL opcode at offset" in rows["nccl_trace_rank_0"]["message"]
    assert rows["nccl_trace_rank_1"]["status"] == "ok"  # nothing else lost
    # the second lock alone (no opcode scan) refuses the class too
    import io

    with pytest.raises(fr_pickle.UnsafeDump, match="refused to load class os.system"):
        fr_pickle._NoClasses(io.BytesIO(_malicious(marker))).load()
    assert not marker.exists()


@pytest.mark.parametrize("data, reason", [
    (b"\x80\x02" + b"](" * 40 + b"e" * 40 + b".", "nested deeper"),
    (b"\x80\x02}(X\x07\x00\x00\x00versionX\x00\x00\x00\x40abc", "above the"),
    (b"\x80\x02}(X\x07\x00\x00\x00versionX\x03\x00\x00\x002.9u", "truncated"),
    (b"\x80\x02}(X\x07\x00\x00\x00versionX\x03\x00\x00\x002.9u.junk", "after STOP"),
    (b"\x80\x02}(X\x07\x00\x00\x00version\x8b\x01\x00\x00\x00\x05u.", "LONG4 opcode"),
    (b"\x80\x02}(X\x07\x00\x00\x00version\x93u.", "STACK_GLOBAL opcode"),
    (b"\x80\x02}(X\x07\x00\x00\x00versionK\x01ub.", "BUILD opcode"),
    (b"\x80\x02}(X\x07\x00\x00\x00versionK\x01\x81u.", "NEWOBJ opcode"),
    (b"\x80\x02}(X\x07\x00\x00\x00versionP1\nu.", "PERSID opcode"),
    (b"\x80\x02}(X\x07\x00\x00\x00version\x82\x01u.", "EXT1 opcode"),
    # a flipped byte of a memo put: the C unpickler would try to allocate 32 GB for its memo
    (b"\x80\x02}r\xf0\xff\xff\xff(X\x07\x00\x00\x00versionK\x01u.", "memo index 4294967280"),
    (b"\x80\x04\x95\x68\x68\x68\x68\x68\x68\x68\x08}.", "FRAME at offset 2 runs past"),  # would ask for 8 EB
])
def test_caps_and_refused_opcodes_fail_the_source_with_the_reason(tmp_path, data, reason):
    path = tmp_path / "nccl_trace_rank_3"
    path.write_bytes(data)
    res = _parse(path)
    assert res.status == "failed" and reason in res.message and "nccl_trace_rank_3" in res.message


@pytest.mark.parametrize("field, value, named", [
    ("collective_seq_id", "7", "collective_seq_id"), ("input_sizes", [["a"]], "input_sizes"),
    ("state", "exploded", "unknown state"), ("process_group", ("1",), "process_group"),
    ("retired", 3, "retired"), ("time_created_ns", 1.5, "time_created_ns"),
])
def test_a_field_of_the_wrong_type_fails_the_dump_naming_it(tmp_path, field, value, named):
    doc = sim.dump_doc(sim.healthy(4), 1, "2.10", True)
    doc["entries"][0][field] = value
    path = tmp_path / "comm_lib_trace_rank_1"
    path.write_bytes(dumps(doc))
    res = _parse(path)
    assert res.status == "failed" and named in res.message


def test_top_level_shape_errors_fail_the_dump(tmp_path):
    for i, doc in enumerate(({"version": 2}, {"version": "2.9", "entries": {}}, [1, 2],
                             {"version": "2.9", "pg_status": {"x": {}}, "entries": []})):
        path = tmp_path / f"rank_{i}.json"
        path.write_bytes(orjson.dumps(doc))
        assert _parse(path).status == "failed", doc


# --- versions and variants ---------------------------------------------------------------------------


@pytest.mark.parametrize("version", sim.VERSIONS)
@pytest.mark.parametrize("fmt", ["pickle", "json"])
def test_every_version_and_encoding_reads_the_same_counters(tmp_path, version, fmt):
    groups = sim.healthy(8)
    doc = sim.dump_doc(groups, 5, version, stacks=(fmt == "pickle"))
    data = dumps(doc) if fmt == "pickle" else orjson.dumps(sim.to_json_doc(doc))
    path = tmp_path / sim.file_name(5, fmt, version, None)
    path.write_bytes(data)
    assert discover(path)[0].kind == "flight_recorder"
    res = _parse(path)
    assert res.status == "ok" and res.rank == 5, res.message
    status = res.frames["fr_pg_status"].sort("pg_id")
    mine = [g for g in groups if 5 in g.ranks]
    assert status["last_enqueued"].to_list() == [g.enq[5] for g in mine]
    assert status["last_completed"].to_list() == [g.comp[5] for g in mine]
    assert status["origin"][0] == ("entries" if version == "1.1" else "pg_status")
    e = res.frames["fr_entries"]
    assert e.height == len(doc["entries"])
    assert e["started_ns"].null_count() == sum(x["time_discovered_started_ns"] is None for x in doc["entries"])
    stacks = e.join(res.frames["fr_signatures"], on="sig", how="left")["stack"]
    assert stacks.len() == e.height and (stacks.null_count() == 0) == (fmt == "pickle")
    if version == "2.10":
        done = e.filter(pl.col("state") == "completed")
        assert done.height and set(done["duration_ns"].to_list()) == {1_250_000}


def test_shapes_are_stored_once_and_every_entry_joins_its_own(tmp_path):
    """fr_signatures: one row per distinct (sizes, dtypes, stack), the same id in every batch; each entry's joined
    shape is the dump's own value."""
    groups = sim.healthy(8)
    docs = {r: sim.dump_doc(groups, r, "2.10", stacks=True) for r in range(4)}
    for r, doc in docs.items():
        (tmp_path / f"comm_lib_trace_rank_{r}").write_bytes(dumps(doc))
    batches = []
    for ranks in ((0, 1), (2, 3)):
        batch = flight_recorder.FlightRecorderBatch()
        for r in ranks:
            name = f"comm_lib_trace_rank_{r}"
            assert batch.add(tmp_path / name, ParseContext(tmp_path, name)) is None
        batches.append(batch.finish()[1])
    sigs = fr.concat("fr_signatures", [b["fr_signatures"] for b in batches])
    entries = fr.concat("fr_entries", [b["fr_entries"] for b in batches])
    assert sigs["sig"].n_unique() == sigs.height  # kept once across batches
    distinct = {orjson.dumps([e["input_sizes"], e["output_sizes"], e["input_dtypes"], e["output_dtypes"],
                              e.get("frames")]) for d in docs.values() for e in d["entries"]}
    assert sigs.height == len(distinct) < entries.height
    joined = entries.join(sigs, on="sig", how="left").sort("rank", "record_id")
    raw = [e for r in range(4) for e in sorted(docs[r]["entries"], key=lambda e: e["record_id"])]
    assert joined["in_sizes"].to_list() == [e["input_sizes"] for e in raw]
    assert joined["out_dtypes"].to_list() == [e["output_dtypes"] for e in raw]
    assert joined["stack"].to_list() == [[f"{f['name']} ({f['filename']}:{f['line']})" for f in e["frames"]]
                                         for e in raw]
    assert joined["op"].cast(pl.String).to_list() == [e["profiling_name"].split(":", 1)[-1] for e in raw]


def test_an_empty_or_absent_entries_list_is_a_dump_too(tmp_path):
    groups = sim.healthy(4, blocked=False)
    doc = sim.dump_doc(groups, 2, "2.9", False)
    assert doc["entries"] == []
    (tmp_path / "_dump_2").write_bytes(dumps(doc))
    (tmp_path / "_dump_3.json").write_bytes(orjson.dumps(sim.to_json_doc(sim.dump_doc(groups, 3, "2.9", False))))
    for name, rank in (("_dump_2", 2), ("_dump_3.json", 3)):
        res = _parse(tmp_path / name)
        assert res.status == "ok" and res.rank == rank and res.frames["fr_dumps"]["entries"][0] == 0
        assert res.frames["fr_pg_status"].height == 4  # default, tensor, pipeline and data parallel groups


def test_rank_and_host_from_the_file_name_checked_against_the_content(tmp_path):
    assert flight_recorder.rank_host_from_name("dumps/nccl_trace_rank_container-node02_5") == (5, "container-node02")
    assert flight_recorder.rank_host_from_name("_dump_12") == (12, None)
    assert flight_recorder.rank_host_from_name("comm_lib_trace_rank_gpu7.cluster.org_3.json") == (3, "gpu7")
    # torchcomms' hook and the debug server's per-rank pickles
    assert flight_recorder.rank_host_from_name("torchcomm_fr_trace_7") == (7, None)
    assert flight_recorder.rank_host_from_name("per_rank/rank_3") == (3, None)
    groups = sim.healthy(8, blocked=False)
    path = tmp_path / "nccl_trace_rank_6"  # holds rank 5's dump
    path.write_bytes(dumps(sim.dump_doc(groups, 5, "2.9", False)))
    res = _parse(path)
    assert res.rank == 5 and "the file name says rank 6" in res.message


# --- the simulated hang scenarios --------------------------------------------------------------------


@pytest.mark.parametrize("scenario, fmt, version, stacks", [
    ("gpu_error", "pickle", "2.9", False), ("gpu_error", "json", "2.10", False),
    ("host_stuck", "pickle", "2.10", True), ("host_stuck", "json", "2.2", False), ("host_stuck", "pickle", "1.1", True),
    ("two_groups", "pickle", "2.9", False), ("two_groups", "json", "2.9", False),
    ("size_mismatch", "pickle", "2.10", False), ("pipeline_behind", "pickle", "2.9", False),
    ("pipeline_behind", "json", "2.10", False), ("missing_dump", "pickle", "2.9", False),
])
def test_simulated_hangs_match_their_truth(tmp_path, scenario, fmt, version, stacks):
    truth = sim.write(scenario, tmp_path, fmt=fmt, version=version, stacks=stacks, host_names=fmt == "json")
    findings = [f for f in analyze(tmp_path).findings if f.detector == "hang_verdict"]
    exp = truth["expected"]
    assert _culprits(findings) == {c: set(exp[c]) for c in ("device", "host") if exp[c]}
    undecided = _hang(findings, "undecided")
    assert bool(undecided) == bool(exp["missing_dumps"])
    if undecided:
        assert undecided[0].metrics["missing_ranks"] == ", ".join(map(str, exp["missing_dumps"]))
    mismatch = [f for f in findings if f.key.startswith("mismatch") and f.key != "mismatch_state"]
    # a device-stuck rank's last entries stay scheduled where its peers' completed: fr_trace's state mismatch
    # (2.9 dumps keep only active entries: the peers' completed ones are not in them to compare)
    state = [f for f in findings if f.key == "mismatch_state"]
    assert sorted(r for f in state for r in f.ranks) == (sorted(exp["device"]) if version != "2.9" else [])
    if exp["mismatch"]:
        assert [(f.key, list(f.ranks)) for f in mismatch] == [("mismatch_size", exp["mismatch"]["ranks"])]
    else:
        assert not mismatch
    if truth["healthy"]:
        assert findings == []
    if stacks and exp["host"]:
        assert f"Stacks: rank(s) {exp['host'][0]} differ" in _hang(findings, "stuck_host")[0].summary


def test_a_gpu_fault_on_the_culprits_gpu_is_the_root_of_the_hang(tmp_path):
    truth = sim.write("gpu_error", tmp_path, host_names=True)
    culprit = truth["expected"]["device"][0]
    host = truth["hosts"][str(culprit)]
    stamp = datetime.fromtimestamp(sim.EPOCH_NS // 1_000_000_000 - 5, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")
    # the culprit's NCCL log ties its rank to its GPU (Flight Recorder dumps do not name the GPU)
    (tmp_path / f"rank{culprit}.out").write_text(
        f"{host}:1234:1234 [1] NCCL INFO ncclCommInitRank comm 0x55d8408b1702 rank {culprit} nranks 16 cudaDev 1 "
        "nvmlDev 1 busId 18000 commId 0x3bcacf498f8d17ea - Init COMPLETE\n")
    (tmp_path / f"{host}.dmesg").write_text(
        f"{stamp}+00:00 {host} kernel: NVRM: Xid (PCI:0000:18:00): 79, "
        "pid=1234, GPU has fallen off the bus.\n")
    analysis = analyze(tmp_path)
    hang_f = _hang(analysis.findings, "stuck_device")[0]
    inc = next(i for i in analysis.incidents if hang_f.id in i.findings)
    assert inc.root_cause != hang_f.id
    root = next(f for f in analysis.findings if f.id == inc.root_cause)
    assert root.detector in ("gpu_hw_error", "node_health") and host in root.hosts


# --- report view and timeline --------------------------------------------------------------------------


def test_who_is_stuck_where_view_marks_the_culprits_and_the_timeline_each_ranks_last_completed(tmp_path):
    from forensics.reports import perfetto
    from forensics.reports.view_hang import hang_view

    truth = sim.write("host_stuck", tmp_path, version="2.10")
    culprit = truth["expected"]["host"][0]
    analysis = analyze(tmp_path)
    view = hang_view(analysis)
    assert view.empty_reason is None
    table = view.tables[0][1]
    marked = table.filter(pl.col("culprit") == "CULPRIT")
    assert set(marked["rank"].to_list()) == {culprit} and "stuck on the host" in set(marked["state"].to_list())
    assert table.filter(pl.col("rank") != culprit)["culprit"].to_list() == [""] * (table.height - marked.height)
    events = [e for e in perfetto.trace_events(analysis)["traceEvents"] if e.get("cat") == "flight_recorder"]
    assert sorted(e["pid"] for e in events) == list(range(16))
    mark = next(e for e in events if e["pid"] == culprit)
    # the culprit's latest completion over its groups: its tensor-parallel group's last collective before the hang
    tp = next(g for g in truth["process_groups"] if g["kind"] == "TP" and culprit in g["ranks"])
    expected = next(g for g in sim.healthy(16) if g.name == tp["pg_name"]).comp[culprit]
    assert mark["args"] == {"pg_name": tp["pg_name"], "seq": expected, "time": "completed"}


def test_the_view_says_why_it_is_empty_without_dumps(tmp_path):
    from forensics.reports.view_hang import hang_view

    (tmp_path / "x.log").write_text("nothing\n")
    assert hang_view(analyze(tmp_path)).empty_reason == "no Flight Recorder dumps in the inputs"


def test_the_dumps_of_two_cases_side_by_side_are_judged_apart():
    root = shared_path("flight_recorder", "nvrx_fault_injection")
    analysis = analyze(root)
    for case in CASES:
        found = {}
        for f in analysis.findings:
            if f.detector == "hang_verdict" and f.key.endswith(f":{case}"):
                found.setdefault(f.key.split(":")[0].removeprefix("stuck_"), set()).update(f.ranks)
        assert found == _injected(_case(case)), case


def test_the_cli_simulates_the_flight_recorder_scenarios(tmp_path):
    from conftest import run_cli

    res = run_cli("simulate", "fr_host_stuck", "--out", str(tmp_path / "run"), "-p", "format=json", "-p",
                  "version=2.10")
    assert res.returncode == 0, res.stderr
    truth = orjson.loads((tmp_path / "run" / "truth.json").read_bytes())
    assert truth["scenario"] == "fr_host_stuck" and len(list((tmp_path / "run" / "fr").iterdir())) == 16
    assert _culprits(analyze(tmp_path / "run").findings) == {"host": set(truth["expected"]["host"])}
    bad = run_cli("simulate", "fr_gpu_error", "--out", str(tmp_path / "bad"), "-p", "bogus=1")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
