"""Many small NCCL logs (one a rank) are parsed as a batch (one frame build and one rank fill for all of
them): a batch must give each file exactly what parsing it alone gives, rows, status, message, rank and
host, and never let one file's processes fill another file's ranks."""

from __future__ import annotations

import shutil
from pathlib import Path

import polars as pl
import pytest
from forensics.parsers import discovery, nccl_log
from forensics.parsers.nccl_log import batch
from forensics.parsers.result import ParseContext, ParseResult

from forensics.pipeline import load
from tests.conftest import shared_path


def _alone(folder: Path, names: list[str]) -> list[ParseResult]:
    return [nccl_log.parse(folder / n, ParseContext(folder, n)) for n in names]


def _batch(folder: Path, names: list[str]) -> tuple[list[ParseResult], dict[str, pl.DataFrame]]:
    batch = nccl_log.NcclBatch()
    for n in names:
        assert batch.add(folder / n, ParseContext(folder, n)) is None
    return batch.finish()


def _same_as_alone(folder: Path, names: list[str]) -> None:
    alone = _alone(folder, names)
    results, frames = _batch(folder, names)
    assert len(results) == len(names)
    for name, one, got in zip(names, alone, results):
        assert (got.status, got.message, got.rank, got.host) == (one.status, one.message, one.rank, one.host), name
        for frame, df in one.frames.items():
            mine = frames[frame].filter(pl.col("source") == name)
            assert mine.equals(df), f"{name}: {frame}"
    for frame, df in frames.items():  # no row of the batch is in none of the files
        assert df.height == sum(r.frames[frame].height for r in alone), frame


def test_a_batch_of_real_logs_gives_each_file_what_parsing_it_alone_gives():
    folder = shared_path("nccl_logs")
    names = sorted(p.name for p in folder.glob("*.log"))
    assert len(names) >= 20
    _same_as_alone(folder, names)


# Two files of one simulated node: the same host, pids and devices in both, other ranks (two jobs'
# logs side by side, or a rerun). A rank filled by (host, pid, cudaDev) across files would mix them.
RANK_LOG = """\
n1:100:100 [0] NCCL INFO ncclCommInitRank comm 0x1 rank {r} nranks 8 cudaDev 0 nvmlDev 0 busId 18000 commId 0xa - Init COMPLETE
n1:100:100 [0] NCCL INFO Channel 00/0 : {r}[0] -> {n}[1] via P2P/CUMEM/read
n1:100:100 [0] NCCL INFO NET/IB : GPU Direct RDMA Disabled for HCA 0 'mlx5_0'
n1:100:100 [0] NCCL INFO NCCL_IB_HCA set by environment to mlx5_0
saving checkpoint at iteration 10 to /ckpt/run in torch format
"""  # noqa: E501 -- verbatim log lines (test data)


def test_files_of_the_same_processes_keep_their_own_ranks(tmp_path: Path):
    names = []
    for r in (0, 5):
        name = f"rank{r}.log"
        (tmp_path / name).write_text(RANK_LOG.format(r=r, n=r + 1))
        names.append(name)
    _same_as_alone(tmp_path, names)
    results, frames = _batch(tmp_path, names)
    assert [res.rank for res in results] == [0, 5]
    # checkpoints are no longer the NCCL parser's (parsers/frameworks.py; their rank: tests/test_checkpoints.py)
    assert "checkpoints" not in frames
    for frame in ("nccl_net", "nccl_env"):
        got = frames[frame].select("source", "rank").rows()
        assert sorted(set(got)) == [("rank0.log", 0), ("rank5.log", 5)], frame


def test_an_unreadable_log_fails_alone_and_the_others_are_parsed(tmp_path: Path):
    (tmp_path / "a.log").write_text(RANK_LOG.format(r=0, n=1))
    (tmp_path / "b.log").write_bytes(b"\x1f\x8b\x08\x00broken gzip")
    batch = nccl_log.NcclBatch()
    assert batch.add(tmp_path / "a.log", ParseContext(tmp_path, "a.log")) is None
    early = batch.add(tmp_path / "b.log", ParseContext(tmp_path, "b.log"))
    assert early is not None and early.status == "failed"
    results, frames = batch.finish()
    assert len(results) == 1 and results[0].rank == 0
    assert set(frames["nccl_comms"]["source"].to_list()) == {"a.log"}


def test_a_run_folder_of_logs_is_parsed_as_one_batch_with_the_same_frames(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch):
    folder = shared_path("nccl_logs")
    run = tmp_path / "run"
    run.mkdir()
    names = sorted(p.name for p in folder.glob("*.log"))[:6]
    for n in names:
        shutil.copy(folder / n, run / n)
    builds = []
    real = batch._frames
    monkeypatch.setattr(batch, "_frames", lambda files: builds.append(len(files)) or real(files))
    sources, frames = load(run, workers=1)
    assert builds == [len(names)]  # one frame build for the six files
    alone = _alone(run, names)
    for n, one in zip(names, alone):
        row = sources.filter(pl.col("path") == n).row(0, named=True)
        assert (row["status"], row["message"], row["rank"], row["host"]) == (one.status, one.message, one.rank,
                                                                             one.host)
    for frame in ("nccl_comms", "nccl_net", "nccl_channels", "nccl_env", "nccl_events", "collective_timeouts"):
        expected = pl.concat([r.frames[frame] for r in alone])
        assert frames[frame].equals(expected), frame


def test_nccl_logs_have_a_batch_parser():
    assert discovery.BATCH_PARSERS["nccl_log"] == "forensics.parsers.nccl_log:NcclBatch"


def test_parsed_in_process_a_job_is_one_unit_within_the_size_caps():
    def f(name: str, size: int) -> discovery.DiscoveredFile:
        return discovery.DiscoveredFile(Path(name), name, "nccl_log", size)

    small = [f(f"r{i}", 10) for i in range(9)]
    assert [len(u) for u in discovery.units(small, 0)] == [9]  # in this process: one batch per kind
    assert len(discovery.units(small, 1)) > 1  # for workers: several units to share out
    big = discovery.SMALL_FILE_BYTES + 1
    many = [f(f"m{i}", 10) for i in range(discovery.UNIT_MAX_FILES + 1)] + [f("big", big), f("z", 10)]
    got = discovery.units(many, 0)
    assert [len(u) for u in got] == [discovery.UNIT_MAX_FILES, 1, 1, 1]
    assert [x.rel_path for u in got for x in u] == [x.rel_path for x in many]


def test_units_for_workers_are_capped_by_the_worker_unit_size():
    def f(name: str, size: int) -> discovery.DiscoveredFile:
        return discovery.DiscoveredFile(Path(name), name, "kineto", size)

    # 1 MB traces: a worker's unit stops at WORKER_UNIT_MAX_BYTES, a unit parsed in this process at UNIT_MAX_BYTES
    size = 1 << 20
    files = [f(f"t{i:03}", size) for i in range(64)]
    for n_workers, cap in ((0, discovery.UNIT_MAX_BYTES), (2, discovery.WORKER_UNIT_MAX_BYTES)):
        got = discovery.units(files, n_workers)
        assert [x.rel_path for u in got for x in u] == [x.rel_path for x in files]
        assert max(len(u) for u in got) == cap // size
    assert discovery.WORKER_UNIT_MAX_BYTES < discovery.UNIT_MAX_BYTES
