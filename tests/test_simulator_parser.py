"""Our own Kineto parser reads simulated traces with exactly the counts the simulator reports."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from forensics.simulate import simulate


@pytest.mark.parametrize(
    "scenario,ranks,params",
    [
        ("ddp_straggler", 4, {"layers": "2"}),
        ("fsdp_clean", 4, {"layers": "2"}),         # all-gather / reduce-scatter with In != Out
        ("ddp_clean", 4, {"layers": "1", "window_skew": "1", "seq_args": "0"}),  # late windows, no Seq
        ("pp_interleaved", 4, {"layers": "1"}),     # send/recv kernels on their own streams
        ("old_nccl", 2, {"layers": "1"}),           # ncclKernel_* names, cudaLaunchKernel, fp32
        ("collective_timeout", 4, {"layers": "1"}),  # a truncated rank and 600 s kernels
    ],
)
def test_kineto_parser_counts_match_truth(tmp_path: Path, scenario: str, ranks: int, params: dict[str, str]):
    from forensics.parsers.kineto import parse
    from forensics.parsers.result import ParseContext

    run = tmp_path / scenario
    truth = simulate(scenario, run, ranks=ranks, steps=2, params=params)
    groups = {g["pg_name"]: g for g in truth["process_groups"]}
    for row in truth["ranks"]:
        c = row["counts"]
        res = parse(run / row["trace"], ParseContext(run, row["trace"]))
        assert res.status == "ok", res.message
        assert (res.rank, res.host) == (row["rank"], row["host"])
        f = res.frames
        k = f["kernels"]
        assert k.height == c["kernel"] + c.get("gpu_memcpy", 0) + c.get("gpu_memset", 0)
        assert k.filter(pl.col("class") == "comm").height == c.get("nccl_kernels", 0)
        assert k.filter(pl.col("class") == "memcpy").height == c.get("gpu_memcpy", 0)
        assert f["cpu_ops"].height == sum(c.get(cat, 0) for cat in ("cpu_op", "user_annotation", "cuda_runtime",
                                                                    "cuda_driver"))
        assert f["steps"].height == c.get("steps", 0)
        assert f["comms"].height == c.get("comms", 0)
        assert f["comms"]["kernel_correlation"].null_count() == 0
        rk = f["ranks"].row(0, named=True)
        assert (rk["world_size"], rk["pid"], rk["nccl_version"],
                rk["sm_count"]) == (truth["job"]["world_size"], row["pid"], truth["job"]["nccl_version"], 132)
        mine = sorted(name for name, g in groups.items() if row["rank"] in g["ranks"])
        assert sorted(f["process_groups"]["pg_name"].to_list()) == mine
        comm = k.filter(pl.col("class") == "comm")
        colls = set(comm["collective"].to_list())
        assert colls <= {"allreduce", "allgather", "reduce_scatter", "send",
                         "recv"} and (not comm.height or None not in colls)
        dp = comm.filter(pl.col("collective").is_in(["allreduce", "allgather", "reduce_scatter"]))
        assert dp["pg_desc"].null_count() == 0
        assert dp["seq"].null_count() == (dp.height if params.get("seq_args") == "0" else 0)
        assert sorted(f["steps"]["step"].to_list()) == row["profiled_steps"]
