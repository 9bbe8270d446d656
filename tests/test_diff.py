"""forensics diff on simulator pairs: the same job with and without one injected change.

The size of each injected change comes from the simulator's truth.json (what it put in), never from the
code under test."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import polars as pl
import pytest

from forensics.diff import RunDiff, RunProfile, align, compare, profile
from forensics.pipeline import analyze
from forensics.simulate import simulate
from tests.browser import open_page  # noqa: F401  (a pytest fixture)
from tests.conftest import run_cli


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("pairs")
    jobs = {
        "clean8": ("ddp_clean", {}),
        "clean8_seed7": ("ddp_clean", {"seed": 7}),
        "input_bound": ("input_bound", {}),
        "clean16": ("ddp_clean", {"ranks": 16}),
        "net_socket": ("net_socket", {}),
        "algo_forced": ("algo_forced", {}),
        "slow_gemm": ("slow_gemm", {}),
    }
    for name, (scenario, kw) in jobs.items():
        simulate(scenario, root / name, **kw)
    return {name: root / name for name in jobs}


_PROFILES: dict[Path, RunProfile] = {}


def _profile(run: Path) -> RunProfile:
    if run not in _PROFILES:  # each run analysed once for the whole module
        _PROFILES[run] = profile(analyze(run), run.name)
    return _PROFILES[run]


def _diff(runs: dict[str, Path], base: str, new: str) -> RunDiff:
    return compare(_profile(runs[base]), _profile(runs[new]))


def _truth(run: Path) -> dict:
    return json.loads((run / "truth.json").read_text())


def test_more_idle_is_named_with_its_size(runs: dict[str, Path]):
    d = _diff(runs, "clean8", "input_bound")
    stall_ms = _truth(runs["input_bound"])["faults"][0]["expected"]["stall_ms_per_step"]
    assert d.delta_ms == pytest.approx(stall_ms, rel=0.10)
    assert d.contributors[0]["what"] == "GPU idle"
    assert d.contributors[0]["delta_ms"] == pytest.approx(stall_ms, rel=0.10)
    assert d.verdict.startswith("NEW is ") and "slower per step" in d.verdict and "GPU idle" in d.verdict
    assert not d.nccl_changes


def test_slower_kernel_class_is_named_with_its_size(runs: dict[str, Path]):
    """Every rank's GEMM kernels 30 % longer: the GEMM time the simulator added per step (its truth) is the
    compute delta and the GEMM category's delta, and the verdict names GEMM kernels."""
    fault = _truth(runs["slow_gemm"])["faults"][0]
    assert fault["kind"] == "slow_kernel_class" and fault["params"] == {"kernel_class": "gemm", "slowdown": 0.3}
    added_ms = fault["expected"]["added_ms_per_step"]
    assert added_ms > 5  # a change well above the noise
    d = _diff(runs, "clean8", "slow_gemm")
    top = d.contributors[0]
    assert top["kind"] == "compute" and top["what"].startswith("compute (mostly gemm kernels")
    assert top["delta_ms"] == pytest.approx(added_ms, rel=0.10)
    assert d.new_side.categories["gemm"] - d.base_side.categories["gemm"] == pytest.approx(added_ms, rel=0.10)
    assert d.delta_ms == pytest.approx(added_ms, rel=0.10)
    assert "slower per step" in d.verdict and "gemm kernels" in d.verdict
    assert not d.nccl_changes
    gemm = [k for k in d.kernels if k["category"] == "gemm"]
    assert gemm and all(k["change"] == "changed" and k["delta_ms"] > 0 for k in gemm)
    assert sum(k["delta_ms"] for k in gemm) == pytest.approx(added_ms, rel=0.10)


def test_transport_change_is_the_explanation(runs: dict[str, Path]):
    d = _diff(runs, "clean16", "net_socket")
    injected_ms = (_truth(runs["net_socket"])["expected"]["step_ns_median"]
                   - _truth(runs["clean16"])["expected"]["step_ns_median"]) / 1e6
    assert d.delta_ms == pytest.approx(injected_ms, rel=0.10)
    top = d.contributors[0]
    assert top["kind"] == "comm" and top["delta_ms"] == pytest.approx(injected_ms, rel=0.10)
    changes = {c["aspect"]: c for c in d.nccl_changes}
    assert changes["transport"]["removed"] == ["NET/IB"] and changes["transport"]["added"] == ["NET/Socket"]
    assert "NCCL_IB_DISABLE=1" in changes["env"]["added"]
    assert "NET/Socket instead of NET/IB" in d.verdict
    assert "Inter-node NCCL traffic runs over TCP sockets" in d.incidents["appeared"]


def test_the_parts_add_up_to_the_delta(runs: dict[str, Path]):
    """Medians (with the rest the medians leave) add up to the median step delta, means to the mean delta."""
    for base, new in (("clean8", "input_bound"), ("clean16", "net_socket"), ("clean8", "clean8_seed7")):
        d = _diff(runs, base, new)
        assert sum(c["delta_ms"] for c in d.contributors) == pytest.approx(d.delta_ms, abs=0.01)
        assert sum(c["mean_ms"] for c in d.contributors) == pytest.approx(d.delta_ms_mean, abs=0.01)
        assert all(c["spread_ms"][0] <= c["delta_ms"] <= c["spread_ms"][1] for c in d.contributors)


@pytest.mark.parametrize("base,new,warmup,how,pairs,dropped_base,dropped_new", [
    # same step numbers: the first step of each run is warm-up (each has >= 3 steps), the rest pair by number
    ([100, 101, 102, 103], [100, 101, 102, 103], None, "step number", [(101, 101), (102, 102), (103, 103)], [100], [100]),
    # no step number in common: by order, after each run's own warm-up step
    ([100, 101, 102, 103], [7, 8, 9], None, "order", [(101, 8), (102, 9)], [100, 103], [7]),
    # partly common: warm-up first (each run's own first step), then the common numbers; the rest has no partner
    ([100, 101, 102, 103, 104, 105], [102, 103, 104, 105], None, "step number", [(103, 103), (104, 104), (105, 105)],
     [100, 101, 102], [102]),
    # fewer than 3 steps in a run: nothing is dropped as warm-up
    ([5, 6], [5, 6, 7], None, "step number", [(5, 5), (6, 6)], [], [7]),
    ([5, 6, 7, 8], [5, 6, 7, 8], 0, "step number", [(5, 5), (6, 6), (7, 7), (8, 8)], [], []),
    ([5, 6, 7, 8], [5, 6, 7, 8], 2, "step number", [(7, 7), (8, 8)], [5, 6], [5, 6]),
    # step-less captures (-1: the whole capture) compare as one "step" each, never with a per-step run
    ([-1], [-1], None, "whole capture", [(-1, -1)], [], []),
    ([-1], [100, 101, 102], None, "none", [], [-1], [100, 101, 102]),
    ([3, 1, 2], [2, 3, 1], None, "step number", [(2, 2), (3, 3)], [1], [1]),  # order of the input does not matter
])
def test_steps_are_aligned(base, new, warmup, how, pairs, dropped_base, dropped_new):
    al = align(base, new, warmup)
    assert (al.how, al.pairs, al.dropped_base, al.dropped_new) == (how, pairs, dropped_base, dropped_new)


def test_one_odd_step_does_not_drive_the_verdict(runs: dict[str, Path]):
    """NEW = BASE's own run with one step 500 ms longer (all of it idle): the median delta stays 0, the spread
    shows the odd step, and the mean (which one step drives) says so."""
    base = _profile(runs["clean8"])
    odd_step = 102
    bump = pl.when(pl.col("step") == odd_step).then(500.0).otherwise(0.0)
    per_step = base.per_step.with_columns((pl.col("step_ms") + bump), (pl.col("b:idle") + bump),
                                          (pl.col("c:idle") + bump))
    new = dataclasses.replace(base, name="odd", per_step=per_step)
    d = compare(base, new)
    assert d.alignment.pairs == [(101, 101), (102, 102), (103, 103)]
    assert d.delta_ms == 0.0 and d.spread_ms == [0.0, 500.0]
    assert d.delta_ms_mean == pytest.approx(500.0 / 3, abs=1e-3)
    assert d.verdict.startswith("No significant change")
    idle = next(c for c in d.contributors if c["what"] == "GPU idle")
    assert idle["delta_ms"] == 0.0 and idle["spread_ms"] == [0.0, 500.0]
    assert [p["delta_ms"] for p in d.steps] == [0.0, 500.0, 0.0]


def test_the_verdict_says_how_many_steps_were_compared(runs: dict[str, Path]):
    d = _diff(runs, "clean8", "input_bound")
    lo, hi = d.spread_ms
    assert f"median of 3 aligned steps, {lo:+.1f} to {hi:+.1f} ms" in d.verdict


def test_no_change_says_so(runs: dict[str, Path]):
    d = _diff(runs, "clean8", "clean8_seed7")  # same job, other noise
    assert abs(d.delta_frac or 0) < 0.03
    assert d.verdict.startswith("No significant change")
    assert not d.nccl_changes and d.findings == {"appeared": [], "resolved": []}


def test_algorithm_change_is_reported_even_below_noise(runs: dict[str, Path]):
    d = _diff(runs, "clean16", "algo_forced")
    changes = {c["aspect"]: c for c in d.nccl_changes}
    assert changes["algorithm"]["removed"] == ["allreduce RING"] and changes["algorithm"]["added"] == ["allreduce TREE"]
    assert "NCCL_ALGO=Tree" in d.verdict


def test_cli_writes_both_files_and_gates_on_fail_slower(runs: dict[str, Path], tmp_path: Path):
    out = tmp_path / "d"
    res = run_cli("diff", str(runs["clean16"]), str(runs["net_socket"]), "--out", str(out), "-q", "--fail-slower", "0.5")
    assert res.returncode == 1, res.stderr  # 169 % slower > 50 %
    data = json.loads((out / "diff.json").read_text())
    assert data["schema"] == "forensics-diff/2" and data["verdict"] == res.stdout.splitlines()[0]
    assert data["base"]["ranks"] == 16 and data["new"]["steps"] == 4
    steps = data["steps"]  # each run's first step is warm-up; the other three pair by number
    assert steps["how"] == "step number" and steps["warmup"] == 1
    assert steps["pairs"] == [[101, 101], [102, 102], [103, 103]]
    assert steps["dropped"] == {"base": [100], "new": [100]}
    assert [p["base_step"] for p in steps["deltas"]] == [101, 102, 103]
    assert data["delta_ms_per_step"] == pytest.approx(sorted(p["delta_ms"] for p in steps["deltas"])[1], abs=1e-3)
    res = run_cli("diff", str(runs["clean8"]), str(runs["clean8_seed7"]), "--out", str(out), "-q", "--fail-slower", "0.05")
    assert res.returncode == 0, res.stderr


def test_markdown_escapes_run_names(runs: dict[str, Path], tmp_path: Path):
    odd = tmp_path / "a|b`<i>"
    shutil.copytree(runs["clean8"], odd)
    out = tmp_path / "d"
    assert run_cli("diff", str(odd), str(runs["clean8_seed7"]), "--out", str(out), "-q").returncode == 0
    head = (out / "diff.md").read_text().splitlines()[0]
    assert head == "# forensics diff: a\\|b\\`\\<i\\> -> clean8\\_seed7"


def test_diff_page_in_the_browser(runs: dict[str, Path], tmp_path: Path, open_page):  # noqa: F811
    odd = tmp_path / "base<img src=x onerror=alert(1)>"
    shutil.copytree(runs["clean8"], odd)
    out = tmp_path / "d"
    res = run_cli("diff", str(odd), str(runs["input_bound"]), "--out", str(out), "-q")
    assert res.returncode == 0, res.stderr
    opened = open_page(out / "diff.html")
    page = opened.page
    assert page.locator("#verdict").inner_text() == res.stdout.splitlines()[0]  # the CLI's verdict line
    assert page.locator("#fig-delta .main-svg").count() >= 1  # the waterfall drew, offline
    assert page.locator("h1").inner_text().startswith("forensics diff: base<img src=x onerror=alert(1)>")
    first = page.locator("#contributors tbody tr").first.locator("td").all_inner_texts()
    assert first[0] == "GPU idle" and first[1].startswith("+")
    data = json.loads((out / "diff.json").read_text())
    steps = page.locator("#steps tbody tr")
    assert steps.count() == len(data["steps"]["pairs"]) == 3
    assert steps.first.locator("td").all_inner_texts()[:2] == [str(s) for s in data["steps"]["pairs"][0]]
    assert "aligned by step number" in page.locator("#alignment").inner_text()
    opened.assert_clean()


def test_unreadable_input_is_exit_2(tmp_path: Path, runs: dict[str, Path]):
    empty = tmp_path / "empty"
    empty.mkdir()
    res = run_cli("diff", str(empty), str(runs["clean8"]), "--out", str(tmp_path / "o"), "-q")
    assert res.returncode == 2 and "BASE: no readable trace or log" in res.stderr


def _sqlite_allreduce_ms_per_rank(folder: Path) -> float:
    """Mean over the folder's exports of the total all-reduce kernel time, read straight from SQLite."""
    import sqlite3

    totals = []
    for db in sorted(folder.glob("*.sqlite")):
        con = sqlite3.connect(db)
        (ns,) = con.execute(
            "SELECT SUM(k.end - k.start) FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id = k.demangledName "
            "WHERE s.value LIKE 'ncclKernel_AllReduce%'").fetchone()
        con.close()
        totals.append(ns / 1e6)
    return sum(totals) / len(totals)


def test_real_ring_vs_tree_pair_names_the_algorithm_change():
    """DistributedSysLab_FS24: the same 2-node x 3-GPU all-reduce job run with NCCL_ALGO=Ring and =Tree
    (../shared/sample_data/nsys/SOURCES.md)."""
    from tests.conftest import shared_path

    ring = shared_path("nsys", "DistributedSysLab_FS24", "ring_simple_2nodes_6gpus_job508813")
    tree = shared_path("nsys", "DistributedSysLab_FS24", "tree_simple_2nodes_6gpus_job508838")
    d = compare(_profile(ring), _profile(tree))
    changes = {c["aspect"]: c for c in d.nccl_changes}
    assert (changes["env"]["removed"], changes["env"]["added"]) == (["NCCL_ALGO=Ring"], ["NCCL_ALGO=Tree"])
    assert (changes["algorithm"]["removed"], changes["algorithm"]["added"]) == (["allreduce RING"], ["allreduce TREE"])
    assert "NCCL_ALGO=Ring -> NCCL_ALGO=Tree" in d.verdict
    assert "over the capture (no profiler steps)" in d.verdict  # nsys exports of a bare all-reduce: no steps
    allreduce = next(k for k in d.kernels if k["kernel"] == "nccl allreduce")
    assert allreduce["base_ms"] == pytest.approx(_sqlite_allreduce_ms_per_rank(ring), abs=0.002)
    assert allreduce["new_ms"] == pytest.approx(_sqlite_allreduce_ms_per_rank(tree), abs=0.002)


def test_an_earlier_frames_output_stands_for_its_run(runs: dict[str, Path], tmp_path: Path):
    """BASE given as the folder `forensics frames` wrote: the same diff as from the run folder itself."""
    frames_out = tmp_path / "base_frames"
    assert run_cli("frames", str(runs["clean16"]), "--out", str(frames_out), "-q").returncode == 0
    a, b = tmp_path / "a", tmp_path / "b"
    assert run_cli("diff", str(runs["clean16"]), str(runs["net_socket"]), "--out", str(a), "-q").returncode == 0
    assert run_cli("diff", str(frames_out), str(runs["net_socket"]), "--out", str(b), "-q").returncode == 0
    da, db = json.loads((a / "diff.json").read_text()), json.loads((b / "diff.json").read_text())
    for d in (da, db):
        d["base"].pop("path"), d["base"].pop("name")
    assert da == db
