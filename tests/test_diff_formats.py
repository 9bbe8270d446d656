"""forensics diff across formats (issue 18, item 4): Kineto against Kineto of another NCCL naming era, and
Kineto against Nsight Systems for the same workload. The same job written both ways must map its kernels to
the same categories and collectives, and the diff must not report renamed kernels as appeared or vanished.

Expectations come from the raw files (kernel names, collectives named by the kernels) and the simulator's
truth.json, not from the code under test."""

from __future__ import annotations

import gzip
import json
import re
import shutil
import sqlite3
from pathlib import Path

import pytest

from forensics.diff import RunProfile, compare, profile
from forensics.pipeline import analyze
from forensics.simulate import simulate

# collective args PyTorch >= 2.1 puts on NCCL kernels and record_param_comms; older traces lack them
_COLL_ARGS = ("Collective name", "In msg nelems", "Out msg nelems", "Group size", "dtype", "In split size",
              "Out split size", "Process Group Name", "Process Group Description", "Process Group Ranks", "Seq")
_NCCL_KERNEL = re.compile(r"^nccl(?:Dev)?Kernel_([A-Za-z]+?)_")


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("formats")
    simulate("ddp_clean", root / "clean", ranks=4, steps=4)
    simulate("old_nccl", root / "old", ranks=4, steps=4)
    _strip_collective_metadata(root / "old", root / "old_bare")
    _to_nsys(root / "clean", root / "nsys")
    return {name: root / name for name in ("clean", "old", "old_bare", "nsys")}


_PROFILES: dict[Path, RunProfile] = {}


def _profile(run: Path) -> RunProfile:
    if run not in _PROFILES:
        _PROFILES[run] = profile(analyze(run), run.name)
    return _PROFILES[run]


def _traces(run: Path) -> list[Path]:
    return sorted((run / "profiler").glob("*.json.gz"))


def _load(trace: Path) -> dict:
    with gzip.open(trace, "rt") as fh:
        return json.load(fh)


def _strip_collective_metadata(run: Path, out: Path) -> None:
    """The run as PyTorch before 2.1 traced it: no record_param_comms, no collective args on NCCL kernels."""
    shutil.copytree(run, out)
    traces = _traces(out)
    assert len(traces) == len(_traces(run)) > 0
    for trace in traces:
        d = _load(trace)
        events = [e for e in d["traceEvents"] if e.get("name") != "record_param_comms"]
        for e in events:
            if e.get("cat") == "kernel" and e["name"].startswith("nccl"):
                e["args"] = {k: v for k, v in e["args"].items() if k not in _COLL_ARGS}
        d["traceEvents"] = events
        with gzip.open(trace, "wt") as fh:
            json.dump(d, fh)


def _nccl_kernels(run: Path) -> list[dict]:
    return [e for t in _traces(run) for e in _load(t)["traceEvents"]
            if e.get("cat") == "kernel" and e["name"].startswith("nccl")]


_MEMCPY_KIND = {"HtoD": 1, "DtoH": 2, "DtoD": 8, "PtoP": 10}
_SCHEMA = """
CREATE TABLE META_DATA_EXPORT (name TEXT, value TEXT);
CREATE TABLE TARGET_INFO_SESSION_START_TIME (utcEpochNs INTEGER);
CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INTEGER, end INTEGER, deviceId INTEGER, contextId INTEGER,
  streamId INTEGER, correlationId INTEGER, globalPid INTEGER, demangledName INTEGER, shortName INTEGER,
  gridX INTEGER, gridY INTEGER, gridZ INTEGER, blockX INTEGER, blockY INTEGER, blockZ INTEGER);
CREATE TABLE CUPTI_ACTIVITY_KIND_MEMCPY (start INTEGER, end INTEGER, deviceId INTEGER, contextId INTEGER,
  streamId INTEGER, correlationId INTEGER, globalPid INTEGER, copyKind INTEGER, bytes INTEGER);
CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME (start INTEGER, end INTEGER, globalTid INTEGER, correlationId INTEGER,
  nameId INTEGER);
CREATE TABLE NVTX_EVENTS (start INTEGER, end INTEGER, eventType INTEGER, domainId INTEGER, globalTid INTEGER,
  text TEXT);
"""


def _nsys_demangled(name: str) -> str:
    """A Kineto (cxxabi) kernel name as Nsight Systems' demangler writes it, as seen in the real exports of
    ../shared/sample_data/nsys/nsys-ai: `<unnamed>` namespaces, `(int)N` and `(bool)0` template arguments,
    `[lambda(T) (instance N)]`, `char *`."""
    name = name.replace("(anonymous namespace)", "<unnamed>").replace("char*", "char *")
    name = re.sub(r"\{lambda\(([^)]*)\)#(\d+)\}", r"[lambda(\1) (instance \2)]", name)
    name = re.sub(r"(?<=[<,] )(false|true)(?=[,>])|(?<=<)(false|true)(?=[,>])",
                  lambda m: "(bool)" + ("1" if (m.group(1) or m.group(2)) == "true" else "0"), name)
    return re.sub(r"(?<=[<,] )(\d+)(?=[,>])|(?<=<)(\d+)(?=[,>])", lambda m: f"(int){m.group(1) or m.group(2)}", name)


class _Strings:
    def __init__(self) -> None:
        self.ids: dict[str, int] = {}

    def __call__(self, s: str) -> int:
        return self.ids.setdefault(s, len(self.ids) + 1)


def _to_nsys(run: Path, out: Path) -> None:
    """Each rank's Kineto trace written again as the Nsight Systems SQLite export of the same events (kernels,
    memcpys, launch calls with their correlation ids, ProfilerStep#N as NVTX push/pop ranges), session-relative
    times, one file per rank named by its rank; no collective metadata (nsys has none without NCCL's NVTX)."""
    out.mkdir()
    for trace in _traces(run):
        d = _load(trace)
        base = d.get("baseTimeNanoseconds", 0)
        ns = [base + round(e["ts"] * 1000) for e in d["traceEvents"] if e.get("ph") == "X" and isinstance(e.get("ts"),
                                                                                                          float)]
        t0 = min(ns) - 1_000_000
        con = sqlite3.connect(out / f"rank{d['distributedInfo']['rank']}.sqlite")
        con.executescript(_SCHEMA)
        con.executemany("INSERT INTO META_DATA_EXPORT VALUES (?, ?)",
                        [("EXPORT_SCHEMA_VERSION", "3.13.2"), ("EXPORT_PRODUCT_VERSION", "2024.5.1.113"),
                         ("EXPORT_CONFIG_TIME_SHIFT", "0")])
        con.execute("INSERT INTO TARGET_INFO_SESSION_START_TIME VALUES (?)", (t0,))
        strings = _Strings()
        for e in d["traceEvents"]:
            _insert_event(con, e, base, t0, strings)
        con.executemany("INSERT INTO StringIds VALUES (?, ?)", [(i, s) for s, i in strings.ids.items()])
        con.commit()
        con.close()


def _insert_event(con: sqlite3.Connection, e: dict, base: int, t0: int, strings: _Strings) -> None:
    if e.get("ph") != "X" or not isinstance(e.get("ts"), float):
        return
    start = base + round(e["ts"] * 1000) - t0
    end = start + round(e["dur"] * 1000)
    cat, a = e.get("cat"), e.get("args", {})
    if cat == "kernel":
        gpid = _PID << 24
        name = strings(_nsys_demangled(e["name"]))
        con.execute("INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                    (start, end, a["device"], 1, a["stream"], a["correlation"], gpid, name, name, *a["grid"],
                     *a["block"]))
    elif cat == "gpu_memcpy":
        kind = _MEMCPY_KIND[e["name"].split()[1]]
        con.execute("INSERT INTO CUPTI_ACTIVITY_KIND_MEMCPY VALUES (?,?,?,?,?,?,?,?,?)",
                    (start, end, a["device"], 1, a["stream"], a["correlation"], _PID << 24, kind, a["bytes"]))
    elif cat in ("cuda_runtime", "cuda_driver"):
        con.execute("INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (?,?,?,?,?)",
                    (start, end, (_PID << 24) | (e["tid"] & 0xFFFFFF), a.get("correlation"),
                     strings(e["name"] + "_v3020")))
    elif cat == "user_annotation" and e["name"].startswith("ProfilerStep#"):
        con.execute("INSERT INTO NVTX_EVENTS VALUES (?,?,?,?,?,?)",
                    (start, end, 59, 0, (_PID << 24) | (e["tid"] & 0xFFFFFF), e["name"]))


_PID = 4242  # one process per file: the rank comes from the file name


def test_the_two_nccl_eras_really_differ(runs: dict[str, Path]):
    new_names = {e["name"] for e in _nccl_kernels(runs["clean"])}
    old_names = {e["name"] for e in _nccl_kernels(runs["old"])}
    assert new_names and old_names and not new_names & old_names
    assert all(n.startswith("ncclDevKernel_") for n in new_names) and all(n.startswith("ncclKernel_")
                                                                          for n in old_names)
    assert not any("Collective name" in e["args"] for e in _nccl_kernels(runs["old_bare"]))


@pytest.mark.parametrize("old", ["old", "old_bare"])
def test_nccl_eras_line_up(runs: dict[str, Path], old: str):
    """ddp_clean (NCCL 2.21, ncclDevKernel_*) against old_nccl (2.18, ncclKernel_*), with and without the
    collective metadata: the same categories, the same collectives, nothing appeared or vanished; only the
    NCCL version changed (from truth.json)."""
    base, new = _profile(runs["clean"]), _profile(runs[old])
    d = compare(base, new)
    collectives = {_NCCL_KERNEL.match(e["name"]).group(1).lower()
                   for e in _nccl_kernels(runs[old])}  # type: ignore[union-attr]
    assert collectives == {_NCCL_KERNEL.match(e["name"]).group(1).lower()  # type: ignore[union-attr]
                           for e in _nccl_kernels(runs["clean"])} == {"allreduce"}
    for p in (base, new):
        assert set(p.kernels.filter(p.kernels["key"].str.starts_with("nccl"))["key"]) == {f"nccl {c}"
                                                                                          for c in collectives}
    assert d.base_side is not None and d.new_side is not None
    assert set(d.base_side.categories) == set(d.new_side.categories)
    nccl_cats = [c for c in d.base_side.categories if c.startswith("nccl:")]
    assert nccl_cats and all(d.new_side.categories[c] == pytest.approx(d.base_side.categories[c],
                                                                       rel=0.05) for c in nccl_cats)
    assert [k for k in d.kernels if k["change"] != "changed"] == []
    truth = {r: json.loads((runs[r] / "truth.json").read_text())["job"]["nccl_version"] for r in ("clean", old)}
    changes = {c["aspect"]: c for c in d.nccl_changes}
    assert set(changes) == {"version"}
    assert (changes["version"]["base"], changes["version"]["new"]) == ([truth["clean"]], [truth[old]])
    assert d.verdict.startswith("No significant change")
    assert f"NCCL version changed: {truth['clean']} -> {truth[old]}" in d.verdict


def test_the_nsys_copy_names_kernels_as_nsys_does(runs: dict[str, Path]):
    con = sqlite3.connect(runs["nsys"] / "rank0.sqlite")
    names = {n for (n,) in con.execute("SELECT s.value FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s "
                                       "ON s.id = k.demangledName")}
    con.close()
    kineto = {e["name"] for e in _load(_traces(runs["clean"])[0])["traceEvents"] if e.get("cat") == "kernel"}
    assert len(names) == len(kineto) and len(names - kineto) >= 5  # templated kernels renamed, one for one
    assert any("<unnamed>" in n and "(bool)" not in n for n in names) and any("(int)4" in n for n in names)


def test_kineto_and_nsys_of_the_same_job_map_the_same(runs: dict[str, Path]):
    """The same simulated job as Kineto JSON and as Nsight Systems SQLite: the same steps, categories,
    kernel time per category and kernels (the two tools demangle templated kernels and name copies
    differently)."""
    kin, nsy = _profile(runs["clean"]), _profile(runs["nsys"])
    assert (nsy.ranks, nsy.step_ids) == (kin.ranks, kin.step_ids) == (4, [100, 101, 102, 103])
    d = compare(kin, nsy)
    assert d.base_side is not None and d.new_side is not None
    assert set(d.base_side.categories) == set(d.new_side.categories)
    assert [c for c in d.base_side.categories if not c.startswith("nccl:") and c != "idle"]
    for cat, ms in d.base_side.categories.items():
        if not cat.startswith("nccl:") and cat != "idle":
            assert d.new_side.categories[cat] == pytest.approx(ms, rel=1e-3, abs=1e-3), cat
    assert [k for k in d.kernels if k["change"] != "changed"] == []
    assert d.verdict.startswith("No significant change")


# (class, name as Kineto records it, name as Nsight Systems records it, compared as, category): names from the
# real samples (../shared/sample_data/kineto/tracelens, nsys/nsys-ai) and the simulator
_SAME_KERNEL = [
    ("compute", "void at::native::vectorized_elementwise_kernel<8, at::native::FillFunctor<c10::BFloat16>, "
                "std::array<char*, 1ul> >(int, at::native::FillFunctor<c10::BFloat16>, std::array<char*, 1ul>)",
     "void at::native::vectorized_elementwise_kernel<(int)8, at::native::FillFunctor<c10::BFloat16>, "
     "std::array<char *, (unsigned long)1>>(int, T2, T3)",
     "at::native::vectorized_elementwise_kernel", "elementwise"),
    ("compute", "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<float, float, false>"
                "(int, float, float const*, float const*, float const*, float*, float*, float*)",
     "void at::native::<unnamed>::vectorized_layer_norm_kernel<float, float, (bool)0>(int, T2, const T1 *, "
     "const T1 *, const T1 *, T2 *, T2 *, T1 *)",
     "at::native::anon::vectorized_layer_norm_kernel", "normalization"),
    ("compute",
     "sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize128x128x8_stage3_warpsize2x2x1_ffma_aligna4_alignc4_execute_kernel_"
     "_5x_cublas",
     "sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize128x128x8_stage3_warpsize2x2x1_ffma_aligna4_alignc4_execute_kernel_"
     "_5x_cublas",
     "sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize128x128x8_stage3_warpsize2x2x1_ffma_aligna4_alignc4_execute_kernel_"
     "_5x_cublas",
     "gemm"),
    ("compute",
     "void flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false, false, cutlass::bfloat16_t, "
                "Flash_kernel_traits<128, 128, 64, 4, cutlass::bfloat16_t> >, false, false>(Flash_fwd_params)",
     "void flash::flash_fwd_kernel<Flash_fwd_kernel_traits<(int)128, (int)128, (int)64, (int)4, (bool)0, (bool)0, "
     "cutlass::bfloat16_t, Flash_kernel_traits<(int)128, (int)128, (int)64, (int)4, cutlass::bfloat16_t>>, (bool)0, "
     "(bool)0>(Flash_fwd_params)", "flash::flash_fwd_kernel", "attention"),
    ("memcpy", "Memcpy HtoD (Pinned -> Device)", "[CUDA memcpy Host-to-Device]", "memcpy HtoD", "memcpy"),
    ("memcpy", "Memcpy DtoH (Device -> Pageable)", "[CUDA memcpy Device-to-Host]", "memcpy DtoH", "memcpy"),
    ("memcpy", "Memcpy DtoD (Device -> Device)", "[CUDA memcpy Device-to-Device]", "memcpy DtoD", "memcpy"),
    ("memset", "Memset (Device)", "[CUDA memset]", "memset", "memset"),
]


@pytest.mark.parametrize("cls,kineto,nsys,key,category", _SAME_KERNEL, ids=[k for _, _, _, k, _ in _SAME_KERNEL])
def test_one_kernel_named_by_both_tools_compares_and_maps_the_same(cls: str, kineto: str, nsys: str, key: str,
                                                                   category: str):
    import polars as pl

    from forensics.diff import short_key
    from forensics.facts.op_categories import category_expr

    df = pl.DataFrame({"name": [kineto, nsys], "class": [cls, cls], "collective": [None, None]},
                      schema={"name": pl.String, "class": pl.String, "collective": pl.String})
    out = df.select(short_key().alias("key"), category_expr(pl.col("name")).alias("category"))
    assert out["key"].to_list() == [key, key]
    if cls == "compute":  # copies and memsets take their category from their class, not their name
        assert out["category"].to_list() == [category, category]


# ------------------------------------------------------------------ software versions (issue 18, item 3)
def _cuda(v: int) -> str:
    """CUDA's integer version (1000 * major + 10 * minor) as major.minor."""
    return f"{v // 1000}.{v % 1000 // 10}"


def test_software_versions_of_the_simulated_eras(runs: dict[str, Path], tmp_path: Path):
    """old_nccl is built against CUDA 12.2 (truth.json), ddp_clean against 12.4: a software version change, in
    diff.json, diff.md and diff.html."""
    from tests.conftest import run_cli

    truth = {r: json.loads((runs[r] / "truth.json").read_text())["job"] for r in ("clean", "old")}
    assert truth["clean"]["cuda_version"] != truth["old"]["cuda_version"]
    d = compare(_profile(runs["clean"]), _profile(runs["old"]))
    assert d.version_changes == [{"component": "CUDA runtime", "base": [truth["clean"]["cuda_version"]],
                                  "new": [truth["old"]["cuda_version"]]}]
    assert _profile(runs["clean"]).versions["distributed backend"] == ["nccl"]
    assert d.verdict.endswith(f"; software changed: CUDA runtime {truth['clean']['cuda_version']} -> "
                              f"{truth['old']['cuda_version']}.")
    out = tmp_path / "d"
    assert run_cli("diff", str(runs["clean"]), str(runs["old"]), "--out", str(out), "-q").returncode == 0
    data = json.loads((out / "diff.json").read_text())
    assert data["version_changes"] == d.version_changes
    row = f"| CUDA runtime | {truth['clean']['cuda_version']} | {truth['old']['cuda_version']} |"
    md_rows = [line.replace("\\", "") for line in (out / "diff.md").read_text().splitlines()]  # Markdown escapes off
    assert row in md_rows
    assert "CUDA runtime" in (out / "diff.html").read_text()


def test_software_versions_of_a_real_kineto_trace():
    from tests.conftest import shared_path

    trace = shared_path("kineto", "tracelens", "eager_trace.json.gz")
    raw = _load(trace)
    expected = {"CUDA runtime": [_cuda(raw["cuda_runtime_version"])],
                "CUDA driver API": [_cuda(raw["cuda_driver_version"])],
                "CUPTI API": [str(raw["cupti_version"])], "distributed backend": [raw["distributedInfo"]["backend"]]}
    assert expected == {"CUDA runtime": ["12.9"], "CUDA driver API": ["13.0"], "CUPTI API": ["28"],
                        "distributed backend": ["nccl"]}  # what the file says, read by eye
    assert profile(analyze(trace), "eager").versions == expected


def test_software_versions_of_real_nsys_exports():
    from tests.conftest import shared_path

    run = shared_path("nsys", "DistributedSysLab_FS24", "ring_simple_2nodes_6gpus_job508813")
    env: dict[str, set[str]] = {}
    for db in sorted(run.glob("*.sqlite")):
        con = sqlite3.connect(db)
        for k, v in con.execute("SELECT name, value FROM TARGET_INFO_SYSTEM_ENV"):
            env.setdefault(k, set()).add(v)
        con.close()
    expected = {"NVIDIA driver": sorted(env["NvDriverVersion"]),
                "CUDA driver API": sorted(_cuda(int(v)) for v in env["CudaDriverVersion"]),
                "OFED": sorted(env["OfedDriverVersion"]), "Linux kernel": sorted(env["SoftwareReleaseVersion"])}
    assert expected["NVIDIA driver"] == ["530.30.02"] and expected["CUDA driver API"] == ["12.1"]
    versions = profile(analyze(run), "ring").versions
    assert {k: versions[k] for k in expected} == expected


def test_nccl_version_from_the_logs_alone(runs: dict[str, Path], tmp_path: Path):
    """Runs with only their NCCL logs (no traces): the NCCL version change still comes from the log banners."""
    for r in ("clean", "old"):
        shutil.copytree(runs[r] / "logs", tmp_path / r / "logs")
    truth = {r: json.loads((runs[r] / "truth.json").read_text())["job"]["nccl_version"] for r in ("clean", "old")}
    d = compare(profile(analyze(tmp_path / "clean"), "c"), profile(analyze(tmp_path / "old"), "o"))
    changes = {c["aspect"]: c for c in d.nccl_changes}
    assert (changes["version"]["base"], changes["version"]["new"]) == ([truth["clean"]], [truth["old"]])
    assert d.verdict.startswith("No comparison")
