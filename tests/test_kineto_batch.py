"""Many small traces are parsed in batches (one frame build for many files): a batch must give each
file exactly what parsing it alone gives, rows, status and message, and keep every file's own
source row."""

from __future__ import annotations

import gzip
import shutil
from pathlib import Path

import polars as pl
import pytest
from forensics.parsers import discovery, kineto
from forensics.parsers.result import ParseContext
from polars.exceptions import PanicException

from forensics.base import frames as fr
from tests.conftest import shared_path

# Real traces of several eras and shapes; the eight DLRM ranks share pids, thread ids and
# correlation ids, so anything matched across files instead of within one would show.
SAMPLES = [
    ("param_dlrm_8rank", f"worker{i}_step_12.{stamp}.pt.trace.json.gz")
    for i, stamp in enumerate(
        ["1694128201545", "1694128201556", "1694128201554", "1694128201557",
         "1694128201547", "1694128201549", "1694128201553", "1694128201553"]
    )
] + [
    ("hta", "rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz"),
    ("deepseek_profile_data", "train.json.gz"),
    ("hta", "nccl_data.json.gz"),
    ("kineto_tb_plugin", "worker0.1623143089861.pt.trace.json.gz"),
]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = tmp_path_factory.mktemp("batch") / "run"
    run.mkdir()
    for i, (folder, name) in enumerate(SAMPLES):
        shutil.copy(shared_path("kineto", folder, name), run / f"{i:02d}_{name}")
    raw = gzip.decompress(shared_path("kineto", *SAMPLES[0]).read_bytes())
    (run / "03a_cut.pt.trace.json").write_bytes(raw[: len(raw) // 2])  # partial
    (run / "03b_garbage.pt.trace.json").write_bytes(b'{"traceEvents": [' + b"\x00" * 64)  # failed
    return run


def _files(run: Path) -> list[Path]:
    return sorted(run.iterdir())


def test_a_batch_gives_each_file_what_parsing_it_alone_gives(run_dir: Path):
    alone = []
    batch = kineto.KinetoBatch()
    early = {}
    for path in _files(run_dir):
        ctx = ParseContext(run_dir=run_dir, rel_path=path.name)
        alone.append((path.name, kineto.parse(path, ctx)))
        got = batch.add(path, ctx)
        if got is not None:
            early[path.name] = got
    results, frames = batch.finish()
    batched = iter(results)
    statuses = set()
    for name, single in alone:
        res = early.get(name) or next(batched)
        statuses.add(res.status)
        assert (res.status, res.message, res.rank, res.host, res.rank_guessed) == (
            single.status, single.message, single.rank, single.host, single.rank_guessed), name
    assert statuses == {"ok", "partial", "failed"}
    for frame in ("kernels", "cpu_ops", "steps", "comms", "ranks", "process_groups"):
        expected = fr.concat(frame, [r.frames[frame] for _, r in alone if r.status in ("ok", "partial")])
        assert expected.height > 0 or frame == "process_groups"
        assert frames[frame].equals(expected), frame


def test_every_file_keeps_its_source_row_and_duplicate_ranks_drop_their_rows(tmp_path: Path, run_dir: Path):
    from forensics.pipeline import collect_frames

    run = tmp_path / "run"
    shutil.copytree(run_dir, run)
    # a second copy of rank 0 (not the same bytes: a different gzip header) claims rank 0 again
    again = gzip.decompress((run / _files(run_dir)[0].name).read_bytes())
    (run / "zz_rank0_again.pt.trace.json").write_bytes(again)
    found = discovery.discover(run)
    parsed = [item for unit in discovery.units(found, 1) for item in discovery.parse_unit(unit, run)]
    assert sum(item.shared is not None for item in parsed) >= 2  # the batch path was taken
    parsed_by = {item.file.rel_path: item for item in parsed}
    discovery._reject_duplicate_ranks(parsed)
    sources, frames = collect_frames(parsed)
    assert sorted(sources["path"].to_list()) == sorted(p.name for p in run.iterdir())
    dup = parsed_by["zz_rank0_again.pt.trace.json"].result
    assert dup.status == "failed" and "already claimed" in (dup.message or "")
    for frame in ("kernels", "cpu_ops", "ranks"):
        assert "zz_rank0_again.pt.trace.json" not in frames[frame]["source"].to_list()
    used = sources.filter(pl.col("status").is_in(["ok", "partial"]))["path"].to_list()
    assert sorted(frames["ranks"]["source"].to_list()) == sorted(used)


@pytest.mark.parametrize("bug", [ValueError("boom"), PanicException("boom: index out of bounds")],
                         ids=["exception", "rust_panic"])
def test_a_failing_build_costs_only_the_file_that_breaks_it(tmp_path: Path, run_dir: Path,
                                                            monkeypatch: pytest.MonkeyPatch, bug: BaseException):
    """A bug met while building a batch's frames: the files are parsed one by one, so only the
    file that triggers it fails. A Polars panic (pyo3's PanicException, a BaseException) is such a bug too."""
    run = tmp_path / "run"
    run.mkdir()
    names = [p.name for p in _files(run_dir)[:3]]
    for name in names:
        shutil.copy(run_dir / name, run / name)
    real = kineto._ranks

    def broken(files, kernels, cpu_ops):
        if any(f.rel_path == names[1] for f in files):
            raise bug
        return real(files, kernels, cpu_ops)

    monkeypatch.setattr(kineto, "_ranks", broken)
    unit = discovery.discover(run)
    got = {item.file.rel_path: item.result for item in discovery.parse_unit(unit, run)}
    assert got[names[0]].status == "ok" and got[names[2]].status == "ok"
    assert got[names[1]].status == "failed" and "boom" in (got[names[1]].message or "")
    assert f"internal parser error (please report): {type(bug).__name__}: boom" in (got[names[1]].message or "")


def test_a_ctrl_c_that_polars_turned_into_a_panic_stops_the_parse(tmp_path: Path, run_dir: Path,
                                                                  monkeypatch: pytest.MonkeyPatch):
    """Rust code that unwraps a Python call's result turns a Ctrl-C into a panic naming the KeyboardInterrupt:
    that one is the user stopping the run, not a bug in one file, so it is not caught."""
    run = tmp_path / "run"
    run.mkdir()
    for p in _files(run_dir)[:2]:
        shutil.copy(p, run / p.name)
    interrupt = PanicException("called `Result::unwrap()` on an `Err` value: "
                               "PyErr { type: <class 'KeyboardInterrupt'> }")

    def broken(files, kernels, cpu_ops):
        raise interrupt

    monkeypatch.setattr(kineto, "_ranks", broken)
    with pytest.raises(PanicException):
        discovery.parse_unit(discovery.discover(run), run)


def test_units_keep_path_order_and_put_big_files_alone():
    def f(name: str, size: int) -> discovery.DiscoveredFile:
        return discovery.DiscoveredFile(Path(name), name, "kineto", size)

    big = discovery.SMALL_FILE_BYTES + 1
    files = [f("a", 10), f("b", 10), f("c", big), f("d", 10)] + [f(f"e{i}", 10) for i in range(20)]
    units = discovery.units(files, 1)
    assert [x.rel_path for u in units for x in u] == [x.rel_path for x in files]
    assert [x.rel_path for x in units[1]] == ["c"]
    assert max(len(u) for u in units) <= -(-len(files) // 4)


def _pg_trace(rank: int, lists: list[list]) -> dict:
    """A trace of one NCCL kernel naming the undeclared group [0, 2], declaring a group for each of ``lists``."""
    kernel = {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage)",
              "pid": 0, "tid": 7, "ts": 100.0, "dur": 5.0,
              "args": {"device": 0, "stream": 7, "correlation": 1, "Collective name": "allreduce",
                       "Process Group Name": "9", "Process Group Ranks": "[0, 2]", "Group size": 2}}
    groups = [{"pg_name": str(i), "pg_desc": "g", "backend_config": "cuda:nccl", "pg_size": len(ranks), "ranks": ranks}
              for i, ranks in enumerate(lists)]
    return {"distributedInfo": {"rank": rank, "world_size": 4, "pg_config": groups}, "traceEvents": [kernel]}


def test_member_lists_are_read_once_per_unit_exactly_as_written(tmp_path: Path):
    """The unit's member lists are converted once per distinct list (``_MemberLists``): a list equal to another
    under ``==`` but not of ints (floats) stays unknown, a bool reads as ``int`` reads it, and the same list in two
    files has one id."""
    import json

    lists = [[0, 1], [0.0, 1.0], [True, 3], [0, 1], "0,1"]
    batch = kineto.KinetoBatch()
    for rank in (0, 2):
        path = tmp_path / f"rank{rank}.pt.trace.json"
        path.write_text(json.dumps(_pg_trace(rank, lists)))
        assert batch.add(path, ParseContext(run_dir=tmp_path, rel_path=path.name)) is None
    _, frames = batch.finish()
    pgs = frames["process_groups"]
    for rank in (0, 2):
        rows = pgs.filter(pl.col("rank") == rank).to_dicts()
        assert [r["pg_ranks"] for r in rows] == [[0, 1], None, [1, 3], [0, 1], None, [0, 2]]
        assert [r["pg_id"] for r in rows] == [fr.pg_id([0, 1]), None, fr.pg_id([1, 3]), fr.pg_id([0, 1]), None,
                                              fr.pg_id([0, 2])]
        assert [r["declared"] for r in rows] == [True] * 5 + [False]
    assert frames["kernels"]["pg_id"].to_list() == [fr.pg_id([0, 2])] * 2
