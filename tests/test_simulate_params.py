"""`forensics simulate` validates every argument and parameter: exit 2 with one line naming the valid range
(issue #13, item 9), never a traceback and never a silent substitute (`--steps 0` used to make 4 steps)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from forensics.simulate import SCENARIOS, build_job, check_run_args
from forensics.simulate.scenarios import ScenarioError
from tests.conftest import ROOT


@pytest.mark.parametrize("scenario,kw,message", [
    ("pp_clean", {"params": {"pp": "0"}}, "pp=0: outside the valid range 1..8"),
    ("pp_clean", {"params": {"tp": "-1"}}, "tp=-1: outside the valid range 1..8"),
    ("pp_clean", {"params": {"pp": "3"}}, "not a multiple of pp*tp = 3"),
    ("pp_clean", {"params": {"chunks": "0"}}, "chunks=0: outside the valid range 1..16"),
    ("pp_imbalance", {"params": {"stage": "4"}}, "stage=4: outside the valid range 0..3"),
    ("ddp_clean", {"params": {"layers": "x"}}, "layers='x': expected an integer in 1..256"),
    ("ddp_clean", {"params": {"noise": "nan"}}, "noise=nan: outside the valid range [0, 1]"),
    ("ddp_clean", {"params": {"noise": "-0.1"}}, "noise=-0.1: outside the valid range [0, 1]"),
    ("ddp_clean", {"params": {"dp_mode": "zero3"}}, "dp_mode='zero3': expected one of ddp, fsdp"),
    ("ddp_clean", {"params": {"bogus": "1"}}, "--param bogus: not a parameter of ddp_clean"),
    ("ddp_clean", {"params": {"rank": "1"}}, "--param rank: not a parameter of ddp_clean"),
    ("ddp_straggler", {"ranks": 4, "params": {"rank": "4"}}, "rank=4: outside the valid range 0..3"),
    ("ddp_straggler", {"params": {"slowdown": "inf"}}, "slowdown=inf: outside the valid range [0, 10]"),
    ("slow_nic", {"params": {"bandwidth_factor": "0"}}, "bandwidth_factor=0: outside the valid range (0, 1]"),
    ("algo_forced", {"params": {"algo": "CollNet"}}, "algo='CollNet': expected one of Tree, Ring"),
    ("collective_timeout", {"steps": 2, "params": {"step_index": "2"}}, "step_index=2: outside the valid range 0..1"),
    ("ddp_clean", {"ranks": 0}, "ranks=0: outside the valid range 1..4096"),
    ("ddp_clean", {"ranks": -3}, "ranks=-3: outside the valid range 1..4096"),
    ("ddp_clean", {"steps": 0}, "steps=0: outside the valid range 1..100000"),
    ("ddp_clean", {"size_mb": 0.0}, "size=0.0: outside the valid range (0, 100000.0] MB"),
    ("ddp_clean", {"nccl_version": "2.x"}, "nccl-version '2.x': expected MAJOR.MINOR[.PATCH]"),
])
def test_invalid_arguments_name_the_valid_range(scenario: str, kw: dict, message: str):
    with pytest.raises(ScenarioError) as err:
        check_run_args(scenario, **kw)
    assert message in str(err.value)


def test_every_documented_default_is_valid():
    for name in SCENARIOS:
        check_run_args(name)  # the defaults of every scenario pass their own checks


def test_the_parameters_a_scenario_reads_are_accepted():
    # the keys each family reads (docs/simulator.md) are all accepted with in-range values
    ok = {"layers": "2", "hidden": "512", "seq": "128", "micro_batch": "2", "noise": "0", "window_skew": "0",
          "seq_args": "0"}
    build_job("ddp_straggler", 4, 2, {**ok, "dp_mode": "fsdp", "rank": "3", "slowdown": "0.2"})
    build_job("pp_imbalance", 8, 2, {**ok, "pp": "4", "tp": "2", "microbatches": "4", "stage": "0", "factor": "2",
                                     "loss_kernel": "0", "optimizer": "1"})
    build_job("collective_timeout", 4, 2, {"seq": "1", "step_index": "0", "timeout_ms": "1000", "rank": "1"})


def test_collective_timeout_seq_is_the_all_reduce_not_the_sequence_length():
    _, job = build_job("collective_timeout", 4, 2, {"seq": "1"})
    assert job.faults[0]["seq"] == 1
    assert job.work.seq == build_job("ddp_clean", 4, 2, {})[1].work.seq  # model shape untouched


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "forensics.cli", "simulate", *args], capture_output=True, text=True,
                          cwd=ROOT)


@pytest.mark.parametrize("args,message", [
    (["pp_clean", "-p", "pp=0"], "pp=0: outside the valid range 1..8"),
    (["ddp_clean", "--steps", "0"], "steps=0: outside the valid range 1..100000"),
    (["ddp_clean", "--ranks", "-2"], "ranks=-2: outside the valid range 1..4096"),
    (["ddp_clean", "-p", "nosuch=1"], "--param nosuch: not a parameter of ddp_clean"),
    (["ddp_clean", "-p", "=1"], "expected KEY=VALUE"),
])
def test_cli_rejects_with_exit_2_and_one_line(tmp_path: Path, args: list[str], message: str):
    out = tmp_path / "run"
    res = cli(*args, "--out", str(out))
    assert res.returncode == 2, res.stderr
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in res.stderr
    assert not out.exists()


def test_cli_simulation_lands_whole_or_not_at_all(tmp_path: Path):
    out = tmp_path / "run"
    res = cli("ddp_clean", "--ranks", "2", "--steps", "1", "-p", "layers=1", "--out", str(out), "--truth",
              str(tmp_path / "t.json"))
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "t.json").exists() and not (out / "truth.json").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run", "t.json"]  # no temporary folder left
    assert any(out.rglob("*.pt.trace.json.gz"))
