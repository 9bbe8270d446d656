"""The must-hold items of the trace detectors, proven on simulator scenarios (forensics.simulate).

Each scenario is simulated into a temporary RUN_DIR, read back through the real discovery + Kineto
parser, and the detectors are checked against the scenario's truth.json (written by the simulator,
not by the detectors).
"""

from __future__ import annotations

import json

import polars as pl
import pytest

from forensics.detectors import run_detectors
from forensics.detectors.exposed_comm import exposure_table
from forensics.detectors.pipeline_bubble import stage_table
from forensics.facts.context import JobContext
from forensics.pipeline import load

OURS = {"straggler", "exposed_comm", "busy_wait", "pipeline_bubble", "slow_link"}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    cache: dict[tuple, tuple] = {}

    def _run(scenario: str, **kw):
        kw.setdefault("seed", 0)
        key = (scenario, tuple(sorted((k, str(v)) for k, v in kw.items())))
        if key not in cache:
            from forensics.simulate import simulate

            out = tmp_path_factory.mktemp(scenario)
            params = kw.pop("params", None)
            simulate(scenario, out, params=params, **kw)
            truth = json.loads((out / "truth.json").read_text())
            _, frames = load(out, workers=1)
            findings, skipped = run_detectors(JobContext(frames), only=sorted(OURS))
            cache[key] = (truth, frames, findings, skipped)
        return cache[key]

    return _run


STRAGGLERS = [
    # scenario, simulate kwargs, expected class
    ("ddp_straggler", {}, "compute"),
    # +10% among 64 ranks from 5 steps (2 layers per step instead of 6 keep the test fast)
    ("ddp_straggler", {"ranks": 64, "steps": 5, "params": {"slowdown": "0.1", "rank": "37", "layers": "2"}}, "compute"),
    # +5%: below the compute test's rho <= 0.95, found as a late arriver whose extra compute explains it
    ("ddp_straggler", {"seed": 6, "params": {"slowdown": "0.05"}}, "compute"),
    ("host_straggler", {}, "host"),
    ("late_rank", {}, "host"),
]


@pytest.mark.parametrize("scenario,kw,cls", STRAGGLERS,
                         ids=["compute8", "compute10pct_64r_5steps", "compute5pct", "host", "late_rank"])
def test_every_injected_straggler_is_found_with_rank_and_class(run, scenario, kw, cls):
    truth, frames, findings, _ = run(scenario, **kw)
    (fault,) = truth["faults"]
    found = [f for f in findings if f.detector == "straggler"]
    assert [(list(f.ranks), f.metrics["class"]) for f in found] == [(fault["ranks"], cls)]
    assert list(found[0].hosts) == fault["hosts"]
    # The culprit's GPU, by PCI bus id, from the NCCL init lines (the simulator's own placement).
    assert list(found[0].gpus) == fault["gpus"]
    assert [e["gpu"] for e in found[0].evidence if e["role"] == "culprit"] == fault["gpus"]
    # A straggler never shows up as exposed communication on its victims (they wait, they do not transfer).
    # Raw "transfer not under compute" does rise on victims here (late_rank: their all-reduce ends after
    # their compute because they waited), which is why exposure is capped by the exposure on the last
    # arriver. Checked end to end: no rank is more exposed than the culprit (who waited for nobody) by more
    # than 1% of the step, and no exposed_comm finding claims more than that either.
    table = exposure_table(JobContext(frames)).group_by("rank").agg(
        (pl.col("exposed_ns").sum() / pl.col("step_ns").sum()).alias("x")
    )
    x = dict(table.iter_rows())
    culprit_x = x.get(fault["ranks"][0], 0.0)
    assert max(x.values(), default=0.0) <= culprit_x + 0.01
    for f in findings:
        if f.detector == "exposed_comm":
            assert f.metrics["exposed_fraction"] <= culprit_x + 0.01


@pytest.mark.parametrize("node,seed", [(1, 0), (2, 1)])
def test_slow_nic_is_found_as_a_slow_link_on_its_node(run, node, seed):
    # TP=8 x PP=2 x DP=2 on 4 nodes: only the slow node is in every group whose transfers are slow
    # (its stage's DP groups, its PP groups); one slow_link warning names it with its ranks. Its partners
    # in those groups (a node of the other stage, the other node of its stage) are blamed by nothing.
    truth, _, findings, _ = run("slow_nic", seed=seed, steps=2, params={"node": str(node)})
    (fault,) = truth["faults"]
    assert fault["ranks"] == list(range(8 * node, 8 * node + 8))
    found = [f for f in findings if f.detector == "slow_link"]
    assert [(f.severity.value, list(f.ranks), list(f.hosts)) for f in found] == [("warning", fault["ranks"],
                                                                                  fault["hosts"])]
    assert [f for f in findings if f.detector == "straggler"] == []
    # The slow groups and how much slower they move data, against the engine's own transfer times.
    exp = fault["expected"]
    assert found[0].metrics["slow_groups"] == len(exp["slow_groups"])
    assert sorted((e["pg"].split("|")[0] for e in found[0].evidence), key=int) == exp["slow_groups"]
    for e in found[0].evidence:
        assert e["ratio"] == pytest.approx(exp["transfer_ratio_by_kind"][e["pg_type"].lower()], rel=0.05)


def test_one_slow_nic_is_named_with_its_rank_and_device(run):
    # Only NIC 3 of node 2 is slow: the groups through it are rank 19's DP group and PP group; the one
    # rank they share is named, with the NIC its NCCL connections use (mlx5_3:1).
    truth, _, findings, _ = run("slow_nic", steps=2, params={"node": "2", "nic": "3"})
    (fault,) = truth["faults"]
    assert fault["ranks"] == [8 * 2 + 3]
    found = [f for f in findings if f.detector == "slow_link"]
    assert [(list(f.ranks), list(f.hosts), f.metrics["nic"]) for f in found] == [
        (fault["ranks"], fault["hosts"], fault["expected"]["nic"])]
    assert sorted((e["pg"].split("|")[0] for e in found[0].evidence), key=int) == fault["expected"]["slow_groups"]
    assert [f for f in findings if f.detector == "straggler"] == []


@pytest.mark.parametrize("params", [{}, {"node": "2", "nic": "5"}], ids=["node", "one_nic"])
def test_hsdp_slow_nic_names_only_the_node_common_to_all_slow_groups(run, params):
    # The case: a 4-node HSDP job (shard groups = 2 nodes, replicate groups pair node k with k+2).
    # Each partner node is in some slow groups, the slow node in all of them: one warning, on it alone.
    truth, _, findings, _ = run("hsdp_slow_nic", steps=2, params=params)
    (fault,) = truth["faults"]
    node = int(params.get("node", 1))
    assert fault["hosts"] == [h["host"] for h in truth["hosts"] if h["node"] == node]
    found = [f for f in findings if f.detector == "slow_link"]
    assert [(f.severity.value, list(f.ranks), list(f.hosts), f.metrics["nic"]) for f in found] == [
        ("warning", fault["ranks"], fault["hosts"], fault["expected"].get("nic"))]
    assert sorted((e["pg"].split("|")[0] for e in found[0].evidence), key=int) == fault["expected"]["slow_groups"]
    assert not [f for f in findings if f.detector == "straggler"]


@pytest.mark.parametrize("seed", range(2))
def test_clean_hsdp_has_no_finding(run, seed):
    truth, _, findings, _ = run("hsdp_clean", seed=seed, steps=2)
    assert truth["healthy"]
    assert [(f.detector, f.title) for f in findings] == []


def test_stage_imbalance_is_found_at_the_right_stage(run):
    truth, _, findings, _ = run("pp_imbalance")
    (fault,) = truth["faults"]
    by = {(f.detector, f.metrics.get("class", f.key)) for f in findings}
    assert ("straggler", "stage") in by
    imb = [f for f in findings if f.detector == "pipeline_bubble" and f.key.startswith("imbalance")]
    assert [list(f.ranks) for f in imb] == [fault["ranks"]]
    assert imb[0].metrics["slow_stage"] == fault["expected"]["stage"]


@pytest.mark.parametrize(
    "scenario,seed",
    [(s, seed) for s in ("ddp_clean", "pp_clean", "pp_interleaved", "fsdp_clean", "old_nccl") for seed in range(4)],
)
def test_clean_baselines_have_no_finding(run, scenario, seed):
    truth, _, findings, _ = run(scenario, seed=seed)
    assert truth["healthy"]
    assert [(f.detector, f.title) for f in findings] == []


@pytest.mark.parametrize("scenario", ["pp_clean", "pp_small_m", "pp_interleaved", "pp_imbalance"])
def test_bubble_fraction_against_truth(run, scenario):
    truth, frames, findings, _ = run(scenario)
    table, p = stage_table(JobContext(frames))
    assert p == truth["job"]["pp"]
    exp = truth["expected"]
    # Ground truth: the simulator engine's pipeline-dependency wait (compute stream idle until the
    # neighbour's activation/gradient arrived) over the step, per stage, over the same profiled steps.
    assert float(table["f_b"].mean()) == pytest.approx(exp["bubble_fraction_measured"], abs=0.02)
    assert sorted(table["pp_stage"]) == sorted(int(s) for s in exp["bubble_fraction_measured_by_stage"])
    for stage, f_b in table.select("pp_stage", "f_b").iter_rows():
        assert f_b == pytest.approx(exp["bubble_fraction_measured_by_stage"][str(stage)], abs=0.02)
        # never more than the time without compute (the DP all-reduce at the flush is not bubble)
        assert f_b <= exp["compute_idle_fraction_by_stage"][str(stage)] + 1e-6
    if scenario == "pp_clean":
        assert float(table["f_b"].mean()) == pytest.approx(exp["bubble_fraction_theory"], abs=0.02)


def test_exposed_comm_fraction_within_one_percent_of_step(run):
    truth, _, findings, _ = run("ddp_no_overlap")
    (f,) = [f for f in findings if f.detector == "exposed_comm"]
    expected = truth["faults"][0]["expected"]["exposed_comm_fraction_median"]
    assert f.metrics["exposed_fraction"] == pytest.approx(expected, abs=0.01)


@pytest.mark.parametrize("scenario,kw", [
    ("late_rank", {}),
    # a 50% slower GPU: its peers spin a third of each step in NCCL
    ("ddp_straggler", {"steps": 3, "params": {"slowdown": "0.5", "layers": "2"}}),
])
def test_busy_wait_names_the_culprit_and_lists_its_victims_as_evidence(run, scenario, kw):
    truth, _, findings, _ = run(scenario, **kw)
    (fault,) = truth["faults"]
    (bw,) = [f for f in findings if f.detector == "busy_wait"]
    # ranks / hosts / gpus name who caused it, not the ranks that waited.
    assert (list(bw.ranks), list(bw.hosts), list(bw.gpus)) == (fault["ranks"], fault["hosts"], fault["gpus"])
    victims = sorted(set(range(truth["job"]["world_size"])) - set(fault["ranks"]))
    if "victims" in fault["expected"]:
        assert victims == fault["expected"]["victims"]
    assert sorted(e["rank"] for e in bw.evidence if e["role"] == "victim") == victims
    assert bw.metrics["ranks_affected"] == len(victims)
    assert [e["rank"] for e in bw.evidence if e["role"] == "culprit"] == fault["ranks"]
    assert f"mostly for rank(s) {fault['ranks'][0]} (" in bw.summary


def test_busy_wait_stays_quiet_on_a_10pct_straggler(run):
    # 10% slower: its peers wait ~9% of the step, under min_wait; the straggler finding carries it.
    _, _, findings, _ = run("ddp_straggler")
    assert [f.detector for f in findings] == ["straggler"]


@pytest.mark.parametrize("scenario", ["late_rank", "ddp_straggler", "host_straggler", "pp_imbalance", "ddp_no_overlap"])
def test_texts_point_at_no_other_finding(run, scenario):
    # A text may describe evidence, never send the reader to another detector's finding, which may not exist.
    _, _, findings, _ = run(scenario)
    assert findings
    for f in findings:
        text = f"{f.summary} {f.remediation}".lower()
        assert "finding" not in text, (f.detector, text)
        assert f.related == ()


def test_host_clock_offsets_recovered_from_collective_ends(run):
    from forensics.facts.collectives import match_collectives

    truth, frames, _, _ = run("ddp_no_overlap")
    true = {h["host"]: h["clock_offset_ns"] for h in truth["hosts"]}
    assert len(true) == 2
    est = dict(match_collectives(frames).host_offsets.select("host", "offset_ns").iter_rows())
    h0, h1 = sorted(true)
    # Relative offset between the two nodes, to within 1 µs (collective ends agree to ring-step jitter).
    assert est[h1] - est[h0] == pytest.approx(true[h1] - true[h0], abs=1_000)


@pytest.mark.parametrize("scenario,kw", [("ddp_clean", {"ranks": 16, "seed": 1}), ("slow_nic", {"steps": 2})])
def test_last_arrival_per_collective_matches_the_engine(run, scenario, kw):
    # truth.json lists, per collective instance, the rank whose kernel started last in the engine (no clock
    # offsets) and its margin over the next one. Matching infers it from durations alone (all members end
    # together, so the shortest kernel is the last to arrive); each member's end carries < 0.9 µs of ring
    # jitter, so arrivals closer than 1 µs cannot be told apart and are not compared.
    truth, frames, _, _ = run(scenario, **kw)
    la = truth["last_arrivals"]
    assert not la["truncated"]
    cols = la["columns"]
    rows = [dict(zip(cols, r)) for r in la["rows"]]
    inst = JobContext(frames).match.instances
    got = {
        (k.split("|")[0], int(k.rsplit("#s", 1)[1])): r
        for k, r in inst.select("instance_key", "last_rank").iter_rows()
    }
    assert len(got) == len(rows) and {(r["pg_name"], r["seq"]) for r in rows} == set(got)
    resolvable = [r for r in rows if r["margin_ns"] >= 1_000]
    assert len(resolvable) >= 20  # TP all-reduces of GPU-bound ranks often arrive within 1 µs of each other
    wrong = [(r["pg_name"], r["seq"], r["last_rank"], got[(r["pg_name"], r["seq"])]) for r in resolvable
             if got[(r["pg_name"], r["seq"])] != r["last_rank"]]
    assert wrong == []
    assert len({r["last_rank"] for r in rows}) >= 4  # many different ranks arrive last: not a one-culprit case
