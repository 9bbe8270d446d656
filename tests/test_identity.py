"""Log processes joined to global ranks, GPUs and trace ranks."""

from __future__ import annotations

import polars as pl

from forensics.base.bus_ids import normalize_bus_id
from forensics.base.frames import JobFrames
from forensics.facts import identity
from tests.detectors.nccl_fixtures import HEALTHY, frames_from


def test_init_lines_give_rank_and_bus_id(tmp_path):
    ids = identity.log_identities(frames_from(tmp_path, HEALTHY))
    got = {(r["host"], r["pid"], r["cuda_dev"]): (r["rank"], r["bus_id"]) for r in ids.iter_rows(named=True)}
    assert got == {
        ("nodeA", 100, 0): (0, "0000:18:00.0"),
        ("nodeA", 101, 1): (1, "0000:2a:00.0"),
        ("nodeB", 200, 0): (2, "0000:18:00.0"),
        ("nodeB", 201, 1): (3, "0000:2a:00.0"),
    }


def test_channel_lines_and_host_offset_fill_missing_ranks(tmp_path):
    text = (
        "h:10:1 [0] NCCL INFO Channel 00/0 : 8[0] -> 9[1] via P2P/IPC/read\n"
        "h:11:1 [1] NCCL INFO Channel 00/0 : 9[1] -> 10[2] via P2P/IPC/read\n"
        "\nh:13:1 [3] misc/socket.cc:49 NCCL WARN socketProgress: Connection closed by remote peer x<1>\n"
    )
    ids = identity.log_identities(frames_from(tmp_path, text)).sort("cuda_dev")
    assert ids["rank"].to_list() == [8, 9, 11]
    assert ids["how"].to_list() == ["channel", "channel", "host-offset"]


def test_trace_ranks_are_joined_on_host_pid_device(tmp_path):
    frames = frames_from(tmp_path, HEALTHY)
    ranks = pl.DataFrame({"rank": [0, 1, 2, 3], "host": ["nodeA", "nodeA", "nodeB", "nodeB"],
                          "pid": [100, 101, 200, 201], "device": [0, 1, 0, 1]})
    job = JobFrames({n: frames[n] for n in frames.present} | {"ranks": ranks})
    ids = identity.identities(job)
    assert (ids["rank"] == ids["trace_rank"]).all()
    # a log without init lines gets its ranks from the trace (same host and device)
    text = "nodeB:200:1 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB ; OOB eth0:1.2.3.4<0>\n"
    f2 = frames_from(tmp_path, text, "b.log")
    ids2 = identity.identities(JobFrames({n: f2[n] for n in f2.present} | {"ranks": ranks}))
    assert ids2.row(0, named=True)["rank"] == 2


def test_bus_id_spellings_of_every_writer_become_one():
    # kernel logs and nvidia-smi: colon forms, any domain width, function optional
    norm = normalize_bus_id
    assert norm("0000:3b:00") == "0000:3b:00.0"
    assert norm("00000000:3B:00.0") == "0000:3b:00.0"
    assert norm("0018:01:00") == "0018:01:00.0"
    assert norm("01:00") == "0000:01:00.0"
    assert norm(" 0000:3b:00.1 ") == "0000:3b:00.1"
    assert norm("...") is None and norm(None) is None and norm("zz") is None and norm("") is None
    assert norm("0000:3b:00.9") is None  # functions are 0-7
    # a bare number is an address only when its writer says how to read it
    assert norm("3b000") is None
    # NCCL `busId`: hex digits of dddd:bb:dd.f without separators
    assert norm("a4000", bare="packed") == "0000:a4:00.0"
    assert norm("1000", bare="packed") == "0000:01:00.0"
    assert norm("0xc7000", bare="packed") == "0000:c7:00.0"
    assert norm("18c7001", bare="packed") == "0018:c7:00.1"
    # older nccl-tests: `[0x4c]` is the bus number; newer ones print the colon form
    assert norm("0x4c", bare="bus") == "0000:4c:00.0"
    assert norm("4", bare="bus") == "0000:04:00.0"
    assert norm("4c0", bare="bus") is None
    assert norm("0000:4c:00", bare="bus") == "0000:4c:00.0"


def test_traced_processes_no_log_names_are_rows_of_their_own(tmp_path):
    # the log knows nodeB pid 200 (rank 2 by init line); the trace also has ranks 0 and 1 on nodeA
    text = "nodeB:200:1 [0] NCCL INFO ncclCommInitRank comm 0x1 rank 2 nranks 4 cudaDev 0 busId 18000 commId 0xa - Init COMPLETE\n"
    f = frames_from(tmp_path, text)
    ranks = pl.DataFrame({"rank": [0, 1, 2], "host": ["nodeA", "nodeA", "nodeB"], "pid": [10, 11, 200],
                          "device": [0, 1, 0]}, schema_overrides={"rank": pl.Int32, "device": pl.Int32})
    ids = identity.job_identities(JobFrames({n: f[n] for n in f.present} | {"ranks": ranks}))
    got = [(r["host"], r["pid"], r["cuda_dev"], r["rank"], r["bus_id"], r["how"], r["trace_rank"])
           for r in ids.iter_rows(named=True)]
    assert got == [
        ("nodeB", 200, 0, 2, "0000:18:00.0", "init", 2),  # log processes first
        ("nodeA", 10, 0, 0, None, "trace", 0),
        ("nodeA", 11, 1, 1, None, "trace", 1),
    ]
    assert list(ids.columns) == ["host", "pid", "cuda_dev", "rank", "bus_id", "how", "trace_rank"]
