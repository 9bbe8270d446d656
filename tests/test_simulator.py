"""The simulator's own contract: determinism, physics, fault signatures, files in the real formats.

Every check reads the written files back with plain gzip/json/re (independently of the simulator's
code) and compares with what truth.json says or with textbook formulas."""

from __future__ import annotations

import gzip
import json
import re
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from forensics.simulate import SCENARIOS, simulate
from forensics.simulate.flight_recorder import SCENARIOS as FR_SCENARIOS
from tests.conftest import ROOT

SMALL = {"layers": "1"}


def load_traces(run: Path) -> dict[int, dict]:
    out = {}
    for f in sorted((run / "profiler").glob("*.pt.trace.json.gz")):
        d = json.loads(gzip.open(f).read())
        out[d["distributedInfo"]["rank"]] = d
    return out


def truth(run: Path) -> dict:
    return json.loads((run / "truth.json").read_text())


def nccl_kernels(d: dict) -> list[dict]:
    return [e for e in d["traceEvents"] if e.get("cat") == "kernel" and e["name"].startswith("nccl")]


def compute_kernels(d: dict) -> list[dict]:
    return [e for e in d["traceEvents"] if e.get("cat") == "kernel" and not e["name"].startswith("nccl")]


def union_us(iv: list[tuple[float, float]]) -> float:
    tot, cur = 0.0, None
    for a, b in sorted(iv):
        if cur is None or a > cur[1]:
            if cur is not None:
                tot += cur[1] - cur[0]
            cur = [a, b]
        else:
            cur[1] = max(cur[1], b)
    return tot + (cur[1] - cur[0] if cur else 0.0)


def steps_of(d: dict) -> list[tuple[int, float, float]]:
    return sorted((int(e["name"].split("#")[1]), e["ts"],
                   e["ts"] + e["dur"]) for e in d["traceEvents"] if e.get("name", "").startswith("ProfilerStep#"))


# ---------------------------------------------------------------------------------- determinism
def test_same_seed_gives_byte_identical_output(tmp_path: Path):
    for name, kw in (("ddp_straggler", {"ranks": 4, "steps": 2}), ("collective_timeout", {"ranks": 4, "steps": 2}),
                     ("pp_clean", {"ranks": 4, "steps": 2})):
        a, b = tmp_path / f"{name}_a", tmp_path / f"{name}_b"
        simulate(name, a, seed=7, params=SMALL, **kw)
        simulate(name, b, seed=7, params=SMALL, **kw)
        files_a = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file())
        files_b = sorted(p.relative_to(b) for p in b.rglob("*") if p.is_file())
        assert files_a == files_b and len(files_a) > 4
        for rel in files_a:
            assert (a / rel).read_bytes() == (b / rel).read_bytes(), f"{name}: {rel} differs"
    c = tmp_path / "other_seed"
    simulate("ddp_straggler", c, seed=8, ranks=4, steps=2, params=SMALL)
    tr = sorted((c / "profiler").iterdir())[0].read_bytes()
    assert all(tr != p.read_bytes() for p in (tmp_path / "ddp_straggler_a" / "profiler").iterdir())


# ---------------------------------------------------------------------------------- files and formats
@pytest.fixture(scope="module")
def multinode(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("sim") / "ddp16"
    simulate("ddp_clean", run, ranks=16, steps=2, seed=3, params={"layers": "2"})
    return run


def test_trace_files_look_like_kineto(multinode: Path):
    t = truth(multinode)
    traces = load_traces(multinode)
    assert sorted(traces) == list(range(16))
    names = sorted(p.name for p in (multinode / "profiler").iterdir())
    assert len(names) == 16
    pat = re.compile(r"^(?P<host>[\w-]+)_(?P<pid>\d+)\.(?P<ms>\d{13})\.pt\.trace\.json\.gz$")
    for n in names:
        assert pat.match(n), n
    for r, d in traces.items():
        row = t["ranks"][r]
        own = [n for n in names if n.startswith(f"{row['host']}_{row['pid']}.")]
        assert row["trace"] == f"profiler/{own[0]}"
        di = d["distributedInfo"]
        assert di["world_size"] == 16 and di["backend"] == "nccl" and di["pg_count"] == len(di["pg_config"])
        assert {"pg_name", "pg_desc", "backend_config", "pg_size", "ranks"} <= set(di["pg_config"][0])
        assert d["deviceProperties"][0]["numSms"] == 132 and isinstance(d["baseTimeNanoseconds"], int)
        cats = {e.get("cat") for e in d["traceEvents"]}
        assert {"kernel", "cpu_op", "cuda_runtime", "cuda_driver", "user_annotation", "ac2g", "gpu_memcpy"} <= cats
        # every kernel has its launch (same correlation) and an ac2g flow pair
        launches = {e["args"]["correlation"] for e in d["traceEvents"]
                    if e.get("cat") in ("cuda_runtime", "cuda_driver") and "Launch" in e["name"]}
        flows = [e["id"] for e in d["traceEvents"] if e.get("cat") == "ac2g"]
        for k in (e for e in d["traceEvents"] if e.get("cat") == "kernel"):
            assert k["args"]["correlation"] in launches
        assert len(flows) == 2 * len(set(flows))
        for k in nccl_kernels(d):
            a = k["args"]
            assert re.match(r"^ncclDevKernel_AllReduce_Sum_bf16_(RING|TREE)_(LL|LL128|SIMPLE)\(ncclDevKernelArgsStorage"
                            r"<4096ul>\)$", k["name"]), k["name"]
            assert a["Collective name"] == "allreduce" and a["Process Group Name"] == "0" and a["Group size"] == 16
            assert isinstance(a["Seq"], int)
        rpc = [e for e in d["traceEvents"] if e.get("name") == "record_param_comms"]
        assert len(rpc) == len(nccl_kernels(d)) == row["counts"]["nccl_kernels"]
        assert [s[0] for s in steps_of(d)] == [100, 101]


def test_header_is_what_hta_greps_for(multinode: Path):
    # HTA (holistictraceanalysis) maps files to ranks with this regex on the raw text; compact JSON
    # ("rank":0) would make it load a single rank. benchmarks/hta_compat.py runs HTA itself.
    files = sorted((multinode / "profiler").iterdir())
    assert len(files) == 16
    for f in files:
        head = gzip.open(f).read(20_000).decode()
        m = re.search(r'"rank":\s+(\d+)', head)
        assert m and json.loads(gzip.open(f).read())["distributedInfo"]["rank"] == int(m.group(1))


def test_fsdp_gathers_before_each_layer_and_reduce_scatters_after(tmp_path: Path):
    simulate("ddp_straggler", tmp_path / "r", ranks=4, steps=1, params={"layers": "3", "dp_mode": "fsdp", "rank": "0"})
    traces = load_traces(tmp_path / "r")
    assert sorted(traces) == [0, 1, 2, 3]
    for _r, d in traces.items():
        ks = nccl_kernels(d)
        ag = [k for k in ks if k["args"]["Collective name"] == "_allgather_base"]
        rs = [k for k in ks if k["args"]["Collective name"] == "_reduce_scatter_base"]
        assert len(ag) == 6 and len(rs) == 3  # 3 layers gathered in forward and in backward
        for k in ag:
            assert k["args"]["Out msg nelems"] == 4 * k["args"]["In msg nelems"]
        for k in rs:
            assert k["args"]["In msg nelems"] == 4 * k["args"]["Out msg nelems"]
        assert {k["tid"] for k in ag} != {k["tid"] for k in rs}  # separate streams
        seqs = [k["args"]["Seq"] for k in sorted(ks, key=lambda k: k["ts"])]
        assert sorted(seqs) == list(range(1, 10))


def test_window_skew_opens_odd_ranks_profilers_late(tmp_path: Path):
    t = simulate("ddp_straggler", tmp_path / "r", ranks=4, steps=3, params={"layers": "2", "window_skew": "1"})
    traces = load_traces(tmp_path / "r")
    assert sorted(traces) == [0, 1, 2, 3]
    for r, d in traces.items():
        steps = [s for s, _, _ in steps_of(d)]
        assert steps == ([101, 102] if r % 2 else [100, 101, 102]) == t["ranks"][r]["profiled_steps"]
        first_step_start = steps_of(d)[0][1]
        assert min(e["ts"] for e in d["traceEvents"] if e.get("cat") in ("kernel", "cpu_op")) >= first_step_start - 1
    seqs = {r: {k["args"]["Seq"] for k in nccl_kernels(d)} for r, d in traces.items()}
    assert seqs[1] < seqs[0] and seqs[1] == seqs[3] and seqs[0] == seqs[2]  # the late ranks miss step 100's collectives


def test_old_nccl_uses_old_kernel_names(tmp_path: Path):
    simulate("old_nccl", tmp_path / "r", ranks=2, steps=1, params=SMALL)
    d = load_traces(tmp_path / "r")[0]
    names = {k["name"] for k in nccl_kernels(d)}
    assert names and all(re.match(r"^ncclKernel_AllReduce_(RING|TREE)_(LL|LL128|SIMPLE)_Sum_float\(ncclDevComm\*, "
                                  r"unsigned long, ncclWork\*\)$", n) for n in names)
    assert all(e["args"]["dtype"] == "Float" for e in nccl_kernels(d))
    assert not any(e.get("cat") == "cuda_driver" for e in d["traceEvents"])  # old NCCL launches with cudaLaunchKernel


def test_every_scenario_writes_a_complete_run_dir(tmp_path: Path):
    for name, _sc in SCENARIOS.items():
        run = tmp_path / name
        t = simulate(name, run, steps=2, params=SMALL)
        world = t["job"]["world_size"]
        assert len(list((run / "profiler").iterdir())) == world, name
        assert len(list((run / "logs").iterdir())) == world, name
        assert len(list((run / "kernel").rglob("*.log"))) == t["job"]["nodes"], name
        assert t["scenario"] == name and t["healthy"] == (not t["faults"])
        for f in t["faults"]:
            assert f["kind"] and isinstance(f["expected"], dict)
            assert all(re.match(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.\d$", g) for g in f["gpus"])
        for h in t["hosts"]:
            assert (run / h["kernel_log"]).exists()
        assert json.loads((run / "truth.json").read_text()) == t


# ---------------------------------------------------------------------------------- physics
def test_collectives_end_together_once_clock_offsets_are_removed(multinode: Path):
    t = truth(multinode)
    offset_us = {h["host"]: h["clock_offset_ns"] / 1000 for h in t["hosts"]}
    assert len(set(offset_us.values())) == 2 and max(abs(v) for v in offset_us.values()) > 10
    ends: dict[tuple, list[float]] = {}
    raw_ends: dict[tuple, list[float]] = {}
    starts: dict[tuple, list[float]] = {}
    for r, d in load_traces(multinode).items():
        off = offset_us[t["ranks"][r]["host"]]
        for k in nccl_kernels(d):
            key = (k["args"]["Process Group Name"], k["args"]["Seq"])
            ends.setdefault(key, []).append(k["ts"] + k["dur"] - off)
            raw_ends.setdefault(key, []).append(k["ts"] + k["dur"])
            starts.setdefault(key, []).append(k["ts"] - off)
    assert ends and all(len(v) == 16 for v in ends.values())
    for key, e in ends.items():
        assert max(e) - min(e) <= 1.0, f"{key}: ends spread {max(e) - min(e):.3f} us"  # ring pipelining jitter < 1 us
    # the injected offsets are visible in the raw trace, and ranks do arrive at different times
    assert statistics.median(max(v) - min(v) for v in raw_ends.values()) > 10
    assert statistics.median(max(v) - min(v) for v in starts.values()) > 1


@pytest.mark.parametrize("scenario,m,v,tol",
                         [("pp_clean", 8, 1, 0.02), ("pp_small_m", 2, 1, 0.02), ("pp_interleaved", 8, 2, 0.05)])
def test_pipeline_bubble_matches_theory(tmp_path: Path, scenario: str, m: int, v: int, tol: float):
    # textbook assumptions: equal stages (no loss kernel on the last), no optimizer, compute >> p2p transfer
    params = {"noise": "0", "layers": "4" if v == 1 else "2", "hidden": "8192", "seq": "1024", "micro_batch": "1",
              "loss_kernel": "0", "optimizer": "0", "microbatches": str(m)}
    simulate(scenario, tmp_path / "r", ranks=4, steps=3, params=params)
    p = 4
    theory = (p - 1) / (v * m + p - 1)
    traces = load_traces(tmp_path / "r")
    assert sorted(traces) == [0, 1, 2, 3]
    for r, d in traces.items():
        comp = [(e["ts"], e["ts"] + e["dur"]) for e in compute_kernels(d)]
        _, s0, s1 = steps_of(d)[1]  # the middle, steady-state step
        busy = union_us([(max(a, s0), min(b, s1)) for a, b in comp if b > s0 and a < s1])
        bubble = 1 - busy / (s1 - s0)
        assert abs(bubble - theory) <= tol * theory, f"rank {r}: bubble {bubble:.4f} vs theory {theory:.4f}"
    t = truth(tmp_path / "r")
    assert t["expected"]["bubble_fraction_theory"] == round(theory, 6)
    # The engine's own pipeline-dependency wait (compute stream idle until a neighbour's activation or
    # gradient arrived), in the steady-state step, is the textbook bubble too; per rank and on average.
    for row in t["metrics"]:
        w = row["pipeline_wait_fraction_by_step"][1]
        assert abs(w - theory) <= tol * theory, f"rank {row['rank']}: pipeline wait {w:.4f} vs theory {theory:.4f}"
    assert abs(t["expected"]["bubble_fraction_measured_steady"] - theory) <= tol * theory


def test_compute_straggler_slowdown_as_configured(tmp_path: Path):
    simulate("ddp_straggler", tmp_path / "r", ranks=4, steps=2,
             params={"noise": "0", "layers": "2", "rank": "1", "slowdown": "0.2"})
    busy = {r: sum(e["dur"] for e in compute_kernels(d)) for r, d in load_traces(tmp_path / "r").items()}
    healthy = [busy[r] for r in (0, 2, 3)]
    assert max(healthy) - min(healthy) < 1e-6 * max(healthy)
    assert busy[1] / statistics.median(healthy) == pytest.approx(1.2, rel=1e-4)
    t = truth(tmp_path / "r")
    f = t["faults"][0]
    assert f["kind"] == "compute_straggler" and f["ranks"] == [1] and f["gpus"] == ["0000:2a:00.0"]
    # the others wait for the straggler inside their NCCL kernels; the straggler waits least
    waits = {m["rank"]: m["collective_wait_ns_total"] for m in t["metrics"]}
    assert waits[1] == min(waits.values()) and min(waits[r] for r in (0, 2, 3)) > 1_000_000


def test_collective_timeout_signature(tmp_path: Path):
    run = tmp_path / "r"
    simulate("collective_timeout", run, ranks=4, steps=2, params={"layers": "2", "rank": "2"})
    t = truth(run)
    exp = t["faults"][0]["expected"]
    seq, missing = exp["seq"], exp["missing_ranks"]
    assert missing == [2] and exp["waiting_ranks"] == [0, 1, 3] and exp["timeout_ms"] == 600000.0
    traces = load_traces(run)
    assert sorted(traces) == [0, 1, 2, 3]
    for r, d in traces.items():
        hit = [k for k in nccl_kernels(d) if k["args"]["Seq"] == seq
               and k["args"]["Process Group Name"] == exp["pg_name"]]
        if r == 2:
            assert not hit
            assert max(k["args"]["Seq"] for k in nccl_kernels(d)) == seq - 1
        else:
            # spins until the watchdog (600 s after enqueue) kills it
            assert len(hit) == 1 and 599_000_000 < hit[0]["dur"] <= 600_000_000
    for r in range(4):
        text = (run / t["ranks"][r]["log"]).read_text()
        wd = re.findall(r"Watchdog caught collective operation timeout: WorkNCCL\(SeqNum=(\d+), OpType=ALLREDUCE, "
                        r"NumelIn=(\d+)", text)
        if r == 2:
            assert not wd
        else:
            assert wd == [(str(seq), str(exp["numel"]))]
            assert f"last enqueued NCCL work: {seq}, last completed NCCL work: {seq - 1}." in text


def test_kernel_logs_carry_the_injected_xid_only_on_the_culprit(tmp_path: Path):
    run = tmp_path / "r"
    t = simulate("xid94", run, ranks=16, steps=1, params={"layers": "1", "rank": "11"})
    f = t["faults"][0]
    assert f["ranks"] == [11] and f["gpus"] == ["0000:5d:00.0"]  # rank 11 = local GPU 3
    culprit_host = t["ranks"][11]["host"]
    for h in t["hosts"]:
        text = (run / h["kernel_log"]).read_text()
        xids = re.findall(r"NVRM: Xid \(PCI:([0-9a-f:]+)\): (\d+),", text)
        assert xids == ([("0000:5d:00", "94")] if h["host"] == culprit_host else [])
    inj = t["kernel_log"]["injected"]
    assert [i["xid"] for i in inj] == [94] and inj[0]["host"] == culprit_host and inj[0]["gpu"] == "0000:5d:00.0"
    lines = (run / inj[0]["file"]).read_text().splitlines()
    assert "NVRM: Xid (PCI:0000:5d:00): 94, " in lines[inj[0]["line"] - 1]
    # two nodes, two timestamp styles
    heads = [(run / h["kernel_log"]).read_text().splitlines()[0] for h in t["hosts"]]
    assert re.match(r"^\[\s*\d+\.\d{6}\] ", heads[0]) and re.match(r"^\[\w{3} \w{3} [ \d]\d \d\d:\d\d:\d\d \d{4}\] ",
                                                                   heads[1])


def test_nccl_logs_reflect_transport_faults(tmp_path: Path):
    runs = {}
    for name in ("ddp_clean", "net_socket", "gdr_off", "p2p_disabled", "algo_forced"):
        runs[name] = tmp_path / name
        simulate(name, runs[name], ranks=16, steps=1, params=SMALL)
    text = {n: (r / "logs" / "rank07.out").read_text() for n, r in runs.items()}
    head = r"^[\w-]+:\d+:\d+ \[7\] NCCL INFO "
    assert re.search(head + r"Channel 00/0 : 7\[7\] -> 8\[0\] \[send\] via NET/IB/7/GDRDMA$", text["ddp_clean"], re.M)
    assert re.search(head + r"Channel 00/0 : 7\[7\] -> 8\[0\] \[send\] via NET/Socket/0$", text["net_socket"], re.M)
    assert re.search(head + r"Channel 00/0 : 7\[7\] -> 8\[0\] \[send\] via NET/IB/7$", text["gdr_off"], re.M)
    assert "GPU Direct RDMA Disabled for HCA 7 'mlx5_7'" in text["gdr_off"]
    assert re.search(head + r"Channel 00/0 : 6\[6\] -> 7\[7\] \[receive\]", text["ddp_clean"], re.M) is None
    p2p = (runs["p2p_disabled"] / "logs" / "rank03.out").read_text()
    assert ("NCCL_P2P_LEVEL set by environment to "
            "LOC") in p2p and "via SHM/direct/direct" in p2p and "P2P/CUMEM" not in p2p
    assert "NCCL_ALGO set by environment to Tree" in text["algo_forced"]
    r0 = (runs["algo_forced"] / "logs" / "rank00.out").read_text()
    tun = re.findall(r"NCCL INFO (\d+) Bytes -> Algo (\d) proto (\d) time", r0)
    assert tun and all(a == "0" for _, a, _ in tun)  # 0 = Tree
    assert re.search(r"^NCCL version 2\.21\.5\+cuda12\.4$", r0, re.M)
    busids = re.findall(r"rank 7 nranks 16 cudaDev 7 nvmlDev 7 busId (\w+) commId", text["ddp_clean"])
    assert busids == ["db000", "db000"]  # Init START and Init COMPLETE


def test_sixty_four_ranks_five_steps(tmp_path: Path):
    t = simulate("ddp_straggler", tmp_path / "r", ranks=64, steps=5, params={"slowdown": "0.1"})
    assert t["job"]["nodes"] == 8 and len(t["job"]["steps"]) == 5
    assert t["faults"][0]["expected"]["compute_ratio_vs_median"] == pytest.approx(1.1, rel=0.02)


def test_size_option_streams_a_large_trace(tmp_path: Path):
    t = simulate("ddp_clean", tmp_path / "r", ranks=1, params=SMALL, size_mb=3)
    raw = len(gzip.open(next((tmp_path / "r" / "profiler").iterdir())).read())
    assert 3e6 <= raw < 3.5e6 and len(t["job"]["steps"]) > 4


def test_cli_simulate_and_usage_errors(tmp_path: Path):
    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "forensics.cli", "simulate", *args], capture_output=True,
                              text=True, cwd=ROOT)

    res = cli("ddp_straggler", "--out", str(tmp_path / "r"), "--ranks", "2", "--steps", "1", "-p", "layers=1", "-p",
              "rank=1")
    assert res.returncode == 0, res.stderr
    assert "culprit rank(s): [1]" in res.stdout and (tmp_path / "r" / "truth.json").exists()
    assert cli("--list", "x").stdout.count("\n") == len(SCENARIOS) + len(FR_SCENARIOS)
    for bad in (["nope", "--out", str(tmp_path / "x")], ["ddp_clean", "--out", str(tmp_path / "r")],
                ["pp_clean", "--ranks", "6", "--out", str(tmp_path / "y")],
                ["ddp_clean", "-p", "layers=x", "--out", str(tmp_path / "z")]):
        res = cli(*bad)
        assert res.returncode == 2 and "Traceback" not in res.stderr, (bad, res.stderr)


# ---------------------------------------------------------------------------------- fault signatures in the traces
def _launch_to_start_us(d: dict) -> list[float]:
    launch = {e["args"]["correlation"]: e["ts"] for e in d["traceEvents"]
              if e.get("cat") in ("cuda_runtime", "cuda_driver") and "Launch" in e["name"]}
    return [k["ts"] - launch[k["args"]["correlation"]] for k in compute_kernels(d)]


def test_host_straggler_is_launch_bound_and_late_rank_makes_busy_waiters(tmp_path: Path):
    simulate("host_straggler", tmp_path / "h", ranks=4, steps=2, params={"layers": "2", "rank": "2"})
    traces = load_traces(tmp_path / "h")
    # share of kernels that start within 20 us of their launch: the GPU waits for the host
    at_launch = {r: sum(x < 20 for x in _launch_to_start_us(d)) / len(compute_kernels(d)) for r, d in traces.items()}
    assert at_launch[2] > 0.1 and max(at_launch[r] for r in (0, 1, 3)) < 0.05
    idle = {}
    for r, d in traces.items():
        gpu = [(e["ts"], e["ts"] + e["dur"]) for e in d["traceEvents"] if e.get("cat") in ("kernel", "gpu_memcpy")]
        idle[r] = 1 - union_us(gpu) / sum(s1 - s0 for _, s0, s1 in steps_of(d))
    assert idle[2] > 0.1 and max(idle[r] for r in (0, 1, 3)) < 0.05
    simulate("late_rank", tmp_path / "l", ranks=4, steps=2, params={"layers": "2", "rank": "3", "stall_ms": "30"})
    traces = load_traces(tmp_path / "l")
    assert sorted(traces) == [0, 1, 2, 3]
    for r, d in traces.items():
        for _, s0, s1 in steps_of(d):
            longest = max(k["dur"] for k in nccl_kernels(d) if s0 <= k["ts"] < s1)
            if r == 3:
                assert longest < 5_000
            else:
                assert longest > 25_000  # spins ~30 ms waiting for the late rank
    f = truth(tmp_path / "l")["faults"][0]
    assert f["ranks"] == [3] and f["expected"]["victims"] == [0, 1, 2]


def _exposed_fraction(d: dict) -> float:
    comp = [(e["ts"], e["ts"] + e["dur"]) for e in compute_kernels(d)]
    comm = [(e["ts"], e["ts"] + e["dur"]) for e in nccl_kernels(d)]
    both = union_us(comp + comm)
    steps = steps_of(d)
    return (both - union_us(comp)) / sum(s1 - s0 for _, s0, s1 in steps)


def test_no_overlap_exposes_communication_and_slow_links_slow_collectives(tmp_path: Path):
    frac = {}
    xfer = {}
    for name in ("ddp_clean", "ddp_no_overlap", "net_socket"):
        simulate(name, tmp_path / name, ranks=16, steps=2, params={"layers": "4", "noise": "0"})
        traces = load_traces(tmp_path / name)
        frac[name] = statistics.median(_exposed_fraction(d) for d in traces.values())
        per: dict[tuple, list[float]] = {}
        for d in traces.values():
            for k in nccl_kernels(d):
                per.setdefault((k["args"]["Process Group Name"], k["args"]["Seq"]), []).append(k["dur"])
        xfer[name] = statistics.median(min(v) for v in per.values())  # transfer = the shortest member's kernel
        t = truth(tmp_path / name)
        if t["faults"] and "exposed_comm_fraction_median" in t["faults"][0]["expected"]:
            assert t["faults"][0]["expected"]["exposed_comm_fraction_median"] == pytest.approx(frac[name], abs=0.01)
    assert frac["ddp_no_overlap"] > 1.5 * frac["ddp_clean"]  # clean still exposes the last bucket
    assert xfer["net_socket"] > 10 * xfer["ddp_clean"]


def test_slow_nic_slows_exactly_the_transfers_through_that_node(tmp_path: Path):
    # TP=8 x PP=2 x DP=2 on 4 nodes, node 2's NIC at 25%: the DP groups of stage 1 (nodes 2, 3) and the PP
    # groups pairing node 0 with node 2 are slow; the DP groups of stage 0 (nodes 0, 1), the PP groups
    # pairing node 1 with node 3 and the intra-node TP groups are not.
    run = tmp_path / "nic"
    simulate("slow_nic", run, ranks=32, steps=2, params={"layers": "2", "noise": "0", "node": "2"})
    t = truth(run)
    assert (t["job"]["tp"], t["job"]["pp"], t["job"]["dp"], t["job"]["nodes"]) == (8, 2, 2, 4)
    assert t["faults"][0]["ranks"] == list(range(16, 24))
    traces = load_traces(run)
    pg_nodes = {g["pg_name"]: {r // 8 for r in g["ranks"]} for g in t["process_groups"]}
    pg_kind = {g["pg_name"]: g["kind"] for g in t["process_groups"]}
    per: dict[tuple, list[float]] = {}
    for _r, d in traces.items():
        for k in nccl_kernels(d):
            a = k["args"]
            if a["Collective name"] in ("send", "recv"):
                # both sides of one transfer end together: the shorter is the bare transfer
                per.setdefault((a["Process Group Name"], "p2p", a["In msg nelems"]), []).append(k["dur"])
            else:
                per.setdefault((a["Process Group Name"], a["Seq"]), []).append(k["dur"])
    xfer: dict[tuple[str, bool], list[float]] = {}
    for key, durs in per.items():
        kind = pg_kind[key[0]]
        xfer.setdefault((kind, 2 in pg_nodes[key[0]]), []).append(min(durs))
    med = {k: statistics.median(v) for k, v in xfer.items()}
    assert med[("dp", True)] > 2.5 * med[("dp", False)]
    assert med[("pp", True)] > 2.5 * med[("pp", False)]
    assert ("tp", True) in med and med[("tp", True)] == pytest.approx(med[("tp", False)], rel=0.05)
