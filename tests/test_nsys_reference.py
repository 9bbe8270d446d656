"""Our nsys frames against the CSVs NVIDIA's own `nsys stats` / `nsys analyze` (2023.4.4) wrote for the
same 17 real exports (../shared/sample_data/nsys/*/nsys2023.4.4_reference/).

Every figure on our side is computed from OUR frames with Polars (tests/nsys_reference.py); every
figure on the other side is read from the reference CSV. Counts and ns sums must agree exactly,
percentages within 0.1 percentage point.
"""

from __future__ import annotations

import re
import sqlite3
from functools import cache

import polars as pl
import pytest
from forensics.parsers.nsys import parse
from forensics.parsers.result import ParseContext, ParseResult

from tests import nsys_reference as R
from tests.conftest import shared_path

DSL = "DistributedSysLab_FS24"
RING = f"{DSL}/ring_simple_2nodes_6gpus_job508813"
TREE = f"{DSL}/tree_simple_2nodes_6gpus_job508838"
FILES = [
    "nsys-ai/h100_2gpu_1s.sqlite",
    "nsys-ai/mfu_2gpu_after.sqlite",
    "nsys-ai/mfu_2gpu_before.sqlite",
    "nsys-ai/mock.sqlite",
    "pipit/saxpy-mpi-cuda_nsys_perlmutter0.sqlite",
    *[f"{RING}/example_2_nsys_report_{h}.sqlite" for h in
      ("ault43.cscs.ch_485050", "ault43.cscs.ch_485052", "ault43.cscs.ch_485055",
       "ault44.cscs.ch_739537", "ault44.cscs.ch_739538", "ault44.cscs.ch_739541")],
    *[f"{TREE}/example_2_nsys_report_{h}.sqlite" for h in
      ("ault43.cscs.ch_491764", "ault43.cscs.ch_491768", "ault43.cscs.ch_491770",
       "ault44.cscs.ch_742406", "ault44.cscs.ch_742412", "ault44.cscs.ch_742413")],
]


@cache
def parsed(rel: str) -> ParseResult:
    path = shared_path("nsys", rel)
    return parse(path, ParseContext(path.parent, path.name))


def reference(rel: str, report: str) -> pl.DataFrame | None:
    path = shared_path("nsys", rel)
    csv = path.parent / "nsys2023.4.4_reference" / f"{path.stem}_{report}.csv"
    return pl.read_csv(csv) if csv.stat().st_size else None


def raw_offset(rel: str) -> int:
    """Our clock = nsys' raw clock + this. The DSL files were exported with --ts-normalize (SOURCES.md),
    so their raw times already are Unix epoch ns; the others are session-relative, so the session's
    utcEpochNs is added. Read here with plain SQL, independently of the parser."""
    if rel.startswith(DSL):
        return 0
    con = sqlite3.connect(f"file:{shared_path('nsys', rel)}?mode=ro&immutable=1", uri=True)
    try:
        return int(con.execute("SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME").fetchone()[0])
    finally:
        con.close()


def ops_in_raw_clock(rel: str) -> pl.DataFrame:
    res = parsed(rel)
    off = raw_offset(rel)
    ops = R.gpu_ops(res.frames["kernels"], res.frames["profiler_overhead"])
    return ops.with_columns(pl.col("start_ns") - off, pl.col("end_ns") - off)


def test_every_sample_export_is_listed():
    root = shared_path("nsys")
    found = sorted(p.relative_to(root).as_posix() for p in root.rglob("*.sqlite"))
    assert found == sorted(FILES)


@pytest.mark.parametrize("rel", FILES)
def test_parses_ok(rel: str):
    res = parsed(rel)
    assert res.status == "ok", res.message
    # one kernels row per CUPTI kernel / memcpy / memset record, counted here with plain SQL
    con = sqlite3.connect(f"file:{shared_path('nsys', rel)}?mode=ro&immutable=1", uri=True)
    try:
        tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        raw = {kind: con.execute(f"SELECT count(*) FROM CUPTI_ACTIVITY_KIND_{kind.upper()}").fetchone()[0]
               if f"CUPTI_ACTIVITY_KIND_{kind.upper()}" in tables else 0 for kind in ("kernel", "memcpy", "memset")}
    finally:
        con.close()
    counts = dict(res.frames["kernels"].group_by("class").len().iter_rows())
    assert counts.get("compute", 0) + counts.get("comm", 0) == raw["kernel"] > 0
    assert (counts.get("memcpy", 0), counts.get("memset", 0)) == (raw["memcpy"], raw["memset"])


@pytest.mark.parametrize("rel", FILES)
def test_kernel_summary_matches_cuda_gpu_kern_sum(rel: str):
    ref = reference(rel, "cuda_gpu_kern_sum")
    assert ref is not None
    ours = R.kern_sum(parsed(rel).frames["kernels"])
    joined = ref.join(ours, left_on="Name", right_on="name", how="full", coalesce=False)
    assert joined.filter(pl.col("name").is_null() | pl.col("Name").is_null()).height == 0, "kernel names differ"
    assert joined["Instances"].to_list() == joined["instances"].to_list()
    assert joined["Total Time (ns)"].to_list() == joined["total"].to_list()
    assert joined["Min (ns)"].to_list() == joined["min"].to_list()
    assert joined["Max (ns)"].to_list() == joined["max"].to_list()
    # nsys prints averages and medians with one decimal, percentages with one decimal.
    assert (joined["Avg (ns)"] - joined["avg"]).abs().max() <= 0.051
    assert (joined["Med (ns)"] - joined["med"]).abs().max() <= 0.051
    assert (joined["Time (%)"] - joined["pct"]).abs().max() <= 0.1


@pytest.mark.parametrize("rel", FILES)
def test_memory_ops_match_cuda_gpu_mem_time_sum(rel: str):
    ref = reference(rel, "cuda_gpu_mem_time_sum")
    k = parsed(rel).frames["kernels"].filter(pl.col("class").is_in(["memcpy", "memset"]))
    ours = k.group_by(pl.col("name").cast(pl.String)).agg(  # names are Categorical in the frames
        pl.len().alias("count"), (pl.col("end_ns") - pl.col("start_ns")).sum().alias("total"))
    if ref is None:
        # nsys 2023.4 wrote no rows for the 2022.2 export; ours has memcpys, so check against raw SQL.
        con = sqlite3.connect(f"file:{shared_path('nsys', rel)}?mode=ro&immutable=1", uri=True)
        n = sum(con.execute(f"SELECT count(*) FROM {t}").fetchone()[0]
                for t in ("CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET"))
        con.close()
        assert ours["count"].sum() == n
        return
    joined = ref.join(ours, left_on="Operation", right_on="name", how="full", coalesce=False)
    assert joined.filter(pl.col("name").is_null() | pl.col("Operation").is_null()).height == 0
    assert joined["Count"].to_list() == joined["count"].to_list()
    assert joined["Total Time (ns)"].to_list() == joined["total"].to_list()


@pytest.mark.parametrize("rel", FILES)
def test_gpu_gaps_match_nsys_analyze(rel: str):
    ref = reference(rel, "gpu_gaps_gap=1")
    ours = R.gaps(ops_in_raw_clock(rel), threshold_ns=1_000_000)
    expected = [] if ref is None else sorted(zip(ref["Device ID"], ref["Start (ns)"], ref["Duration (ns)"]))
    assert sorted(zip(ours["device"], ours["gap_start"], ours["duration"])) == expected


@pytest.mark.parametrize("rel", FILES)
def test_gpu_time_utilization_matches_nsys_analyze(rel: str):
    ref = reference(rel, "gpu_time_util")
    ours = R.time_util(ops_in_raw_clock(rel))
    if ref is None:
        assert ours.height == 0
        return
    ref = ref.sort("Device ID", "Start (ns)")
    ours = ours.sort("device", "start")
    assert ours["device"].to_list() == ref["Device ID"].to_list()
    assert ours["start"].to_list() == ref["Start (ns)"].to_list()
    assert ours["duration"].to_list() == ref["Duration (ns)"].to_list()
    assert (ours["pct"] - ref["In-Use (%)"]).abs().max() <= 0.1


_VERSION = re.compile(r"_v\d+$")


@pytest.mark.parametrize("rel", FILES)
def test_cuda_api_calls_match_cuda_api_sum(rel: str):
    ref = reference(rel, "cuda_api_sum")
    assert ref is not None
    # nsys drops the `_v<N>` version suffix from some API names only; compare with it dropped on both sides.
    ref = ref.with_columns(pl.col("Name").str.replace(r"_v\d+$", "")).group_by("Name").agg(
        pl.col("Num Calls").sum(), pl.col("Total Time (ns)").sum())
    ops = parsed(rel).frames["cpu_ops"].filter(pl.col("category").is_in(["cuda_runtime", "cuda_driver"]))
    ours = ops.group_by(pl.col("name").cast(pl.String)).agg(pl.len().alias("calls"),
                                    (pl.col("end_ns") - pl.col("start_ns")).sum().alias("total"))
    joined = ref.join(ours, left_on="Name", right_on="name", how="full", coalesce=False)
    assert joined.filter(pl.col("name").is_null() | pl.col("Name").is_null()).height == 0, "API names differ"
    assert joined["calls"].to_list() == joined["Num Calls"].to_list()
    assert joined["total"].to_list() == joined["Total Time (ns)"].to_list()


@pytest.mark.parametrize("rel", FILES)
def test_nvtx_ranges_match_nvtx_sum(rel: str):
    ref = reference(rel, "nvtx_sum")
    ann = parsed(rel).frames["cpu_ops"].filter(pl.col("category") == "user_annotation")
    if ref is None:
        assert ann.height == 0
        return
    # nvtx_sum prefixes ranges of a named domain with `Domain:`; our names are the bare range text.
    ref = ref.with_columns(pl.col("Range").str.replace(r"^(NCCL|MPI):", "")).group_by("Range").agg(
        pl.col("Instances").sum(), pl.col("Total Time (ns)").sum())
    ours = ann.group_by(pl.col("name").cast(pl.String)).agg(
        pl.len().alias("n"), (pl.col("end_ns") - pl.col("start_ns")).sum().alias("total"))
    joined = ref.join(ours, left_on="Range", right_on="name", how="full", coalesce=False)
    assert joined.filter(pl.col("name").is_null() | pl.col("Range").is_null()).height == 0
    assert joined["n"].to_list() == joined["Instances"].to_list()
    assert joined["total"].to_list() == joined["Total Time (ns)"].to_list()
