"""Incidents (issue 14): causal rules link causes to consequences only on their evidence; every finding
is in exactly one incident; costs; the verdict; the run header; byte-identical output.

Rule cases use Finding fixtures (each rule: one case that links, one that must not); the end-to-end
cases use the bundled xid79 sample and `forensics simulate` scenarios, checked against the truth the
simulator wrote from the faults it injected (not from the detectors).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import pytest

from forensics.base.findings import CostBasis, Finding, Severity, When
from forensics.detectors._fault_kinds import fault_kind
from forensics.detectors.node_health import HOST_EVENT
from forensics.incidents import RULES, JobFacts, correlate

ROOT = Path(__file__).resolve().parent.parent
T0 = 1_773_478_800_000_000_000  # 2026-03-14 09:00:00 UTC
S = 1_000_000_000


WINDOW = (T0, T0 + 10 * S)
IN_PROFILE = When.span(*WINDOW, "the profiled window")
#: the kind each fixture's (detector, key) has, as its detector would declare it
KINDS = {("gpu_hw_error", "xid|k|1"): "gpu_fault", ("nccl_timeout", "timeout:13"): "timeout",
         ("nccl_timeout", "ras"): "missing_rank", ("nccl_timeout", "desync"): "desync",
         ("busy_wait", "busy_wait"): "spin_wait", ("straggler", "compute"): "slow_rank",
         ("slow_link", "link"): "slow_transfers",
         ("exposed_comm", "0"): "exposed_communication", ("nccl_transport", "socket"): "degraded_transport",
         ("nccl_algorithm", "forced"): "forced_algorithm", ("nccl_algorithm", "mixed_gpus"): "mixed_gpus"}
_TRACE = ("busy_wait", "straggler", "slow_link", "exposed_comm")


def at(t: int | None) -> When:
    return When.unknown("no stamp") if t is None else When.span(t, t, "logged")


def F(detector: str, key: str = "", sev: Severity = Severity.CRITICAL, **kw) -> Finding:
    kw.setdefault("kind", KINDS.get((detector, key), ""))
    if detector in _TRACE:
        kw.setdefault("when", IN_PROFILE)
    return Finding(detector, sev, kw.pop("title", f"{detector} {key}"), "s", "Do it.", key=key, **kw)


def xid79(rank: int = 4, gpu: str = "0000:9a:00.0", host: str = "node07", t: int | None = None) -> Finding:
    return F("gpu_hw_error", "xid|k|1", ranks=(rank,), hosts=(host,), gpus=(gpu,), confidence="high",
             metrics={"category": "xid", "root_xid": 79}, when=at(t))


def timeout(culprit: int = 4, gpu: str = "0000:9a:00.0", host: str = "node07", t: int | None = None,
            ran_ms: int = 600_000) -> Finding:
    when = When.unknown("no year") if t is None else When.span(t - ran_ms * 10**6, t, "watchdog stamp - ran")
    return F("nccl_timeout", "timeout:13", ranks=(culprit,), hosts=(host,), gpus=(gpu,), confidence="high",
             when=when, cost=CostBasis(fatal=True, died_ns=t, hung_s=ran_ms / 1e3, waiting_ranks=7))


def busy_wait(waited_for: str = "4") -> Finding:
    return F("busy_wait", "busy_wait", ranks=(0, 1, 2, 3, 5, 6, 7), hosts=("node07",),
             waited_for=tuple(int(r) for r in waited_for.split(",")))


def straggler(rank: int = 5, host: str = "node07", lost: float = 2.0) -> Finding:
    return F("straggler", "compute", Severity.WARNING, ranks=(rank,), hosts=(host,), waited_for=(rank,), victims=(0,),
             gpu_seconds_lost=lost, confidence="high")


def host_fault(host: str = "node07", t: int | None = None, category: str = "hung") -> Finding:
    kind = fault_kind(category, None, HOST_EVENT).name
    return F("node_health", f"{category}|k|2", Severity.WARNING, hosts=(host,), kind=kind, when=at(t),
             metrics={"category": category})


def oom_of_rank(rank: int = 4, host: str = "node07", t: int | None = None) -> Finding:
    """node_health: the OOM killer killed the training process of ``rank``."""
    return F("node_health", "oom|3001|k|5", ranks=(rank,), hosts=(host,), confidence="high", kind="host_fault",
             when=at(t), metrics={"category": "oom", "training_process": True})


def slow_link(host: str = "node07", ranks: tuple[int, ...] = tuple(range(8, 16))) -> Finding:
    return F("slow_link", "link", Severity.WARNING, ranks=ranks, hosts=(host,), metrics={"level": "host"})


def idle(ranks: tuple[int, ...] = (4,), gpu: str | None = "0000:9a:00.0",
         gap: tuple[int, int] = (T0 + 2 * S, T0 + 32 * S),
         cls: str = "sync") -> Finding:
    """gpu_idle on ``ranks``, placed at their longest idle gap ``gap`` (trace clock, epoch ns), as the detector does."""
    return F("gpu_idle", f"class-{cls}", ranks=ranks, hosts=("node07",), gpus=(gpu,) if gpu and 4 in ranks else (),
             kind="idle_gpu", when=When.span(*gap, "longest idle gaps"), metrics={"class": cls}, gpu_seconds_lost=30.0)




# --- each rule: links / must not link ---------------------------------------------------------------

CASES = [
    # rule, findings that link (cause first), findings that must not link
    ("gpu_fault_kills_rank", [xid79(t=T0 + 1 * S), timeout(t=T0 + 601 * S)],
     [xid79(t=T0 + 700 * S), timeout(t=T0 + 601 * S)]),                    # the fault after the timeout
    ("gpu_fault_kills_rank", [xid79(), timeout()],                           # times unknown: GPU matches
     [xid79(rank=2, gpu="0000:18:00.0"), timeout()]),                        # another GPU and rank
    # the faulted rank's own idle (its host blocked on the lost GPU) is the fault's consequence ...
    ("fault_idles_its_rank", [xid79(t=T0 + 1 * S), idle()],
     [xid79(t=T0 + 1 * S), idle(ranks=tuple(range(8)), cls="input")]),      # ... not the whole job's idle
    ("fault_idles_its_rank", [xid79(), idle()],                             # fault time unknown: its GPU, place only
     [xid79(t=T0 + 60 * S), idle()]),                                       # its idle ended before the fault
    ("fault_idles_its_rank", [oom_of_rank(t=T0 + 1 * S), idle(gpu=None)],    # the killed rank, by rank
     [oom_of_rank(rank=2, t=T0 + 1 * S), idle(gpu=None)]),                  # another rank was killed
    ("gpu_fault_stalls_peers", [xid79(t=T0 + 2 * S), busy_wait("4")],
     [xid79(t=T0 + 2 * S), busy_wait("6")]),                                 # the peers waited for rank 6
    ("gpu_fault_stalls_peers", [xid79(t=T0 + 2 * S), busy_wait("4")],
     [xid79(t=T0 + 60 * S), busy_wait("4")]),                                # fault after the profiled window
    ("host_fault_slows_or_kills", [host_fault(t=T0 - 60 * S), straggler()],
     [host_fault(host="node03", t=T0 - 60 * S), straggler()]),              # straggler on another host
    ("host_fault_slows_or_kills", [host_fault(t=T0 - 60 * S, category="oom"), timeout(t=T0 + 601 * S)],
     [host_fault(t=T0 + 900 * S, category="oom"), timeout(t=T0 + 601 * S)]),  # OOM after the timeout
    ("host_fault_slows_or_kills", [host_fault(t=T0 - 60 * S, category="edac"), straggler()],
     [host_fault(t=T0 - 7200 * S, category="edac"), straggler()]),          # hours before: outside the window
    # the killed rank is the one the timeout names, reported from another host (the peers' watchdog)
    ("host_fault_kills_rank", [oom_of_rank(t=T0 - 5 * S), timeout(host="node03", t=T0 + 601 * S)],
     [oom_of_rank(rank=2, t=T0 - 5 * S), timeout(host="node03", t=T0 + 601 * S)]),  # another rank was killed
    ("host_fault_kills_rank", [oom_of_rank(t=T0 - 5 * S), busy_wait("4")],
     [oom_of_rank(t=T0 + 60 * S), busy_wait("4")]),                          # killed after the profiled window
    # an info-level host event (correctable DRAM errors below the rate) explains nothing
    ("host_fault_slows_or_kills", [host_fault(t=T0 - 60 * S, category="edac"), straggler()],
     [F("node_health", "edac|k|2", Severity.INFO, hosts=("node07",), kind="host_event", when=at(T0 - 60 * S),
        metrics={"category": "edac"}), straggler()]),
    ("nic_fault_slows_link", [host_fault(t=T0 - 10 * 86400 * S, category="ib_port"), slow_link()],
     [host_fault(host="node03", t=T0 - 60 * S, category="ib_port"), slow_link()]),  # a NIC on another host
    ("nic_fault_slows_link", [host_fault(category="mlx5"), slow_link()],             # times unknown
     [host_fault(t=T0 + 900 * S, category="ib_port"), slow_link()]),                # flap after the trace
    ("slow_link_stalls_peers", [slow_link(), F("exposed_comm", "0", Severity.WARNING, ranks=tuple(range(16)))],
     [slow_link(), F("exposed_comm", "0", Severity.WARNING, ranks=(16, 17), hosts=("node09",))]),
    ("missing_rank_times_out_others", [F("nccl_timeout", "ras", ranks=(4,), hosts=("node07",)), timeout()],
     [F("nccl_timeout", "ras", ranks=(9,), hosts=("node09",)), timeout()]),
    ("hang_stalls_peers", [timeout(), busy_wait("4")], [timeout(), busy_wait("3")]),
    ("straggler_stalls_peers", [straggler(rank=5), busy_wait("5")], [straggler(rank=5), busy_wait("2")]),
    ("degraded_transport_slows_comm",
     [F("nccl_transport", "socket", Severity.WARNING, ranks=(0, 1), hosts=("node07",)),
      F("exposed_comm", "0", Severity.WARNING, ranks=(0, 1, 2, 3), hosts=("node07",))],
     [F("nccl_transport", "socket", Severity.WARNING, ranks=(8, 9), hosts=("node09",)),
      F("exposed_comm", "0", Severity.WARNING, ranks=(0, 1, 2, 3), hosts=("node07",))]),
    # a transport switch in the environment links where it cost the job (warning), not where it had no effect
    ("degraded_transport_slows_comm",
     [F("nccl_transport", "transport_env", Severity.WARNING, ranks=(0, 1), hosts=("node07",),
        kind="degraded_transport"),
      F("exposed_comm", "0", Severity.WARNING, ranks=(0, 1, 2, 3), hosts=("node07",))],
     [F("nccl_transport", "transport_env", Severity.INFO, ranks=(0, 1), hosts=("node07",), kind="transport_setting"),
      F("exposed_comm", "0", Severity.WARNING, ranks=(0, 1, 2, 3), hosts=("node07",))]),
    ("forced_algorithm_slows_comm",
     [F("nccl_algorithm", "forced", Severity.WARNING), F("exposed_comm", "0", Severity.WARNING, ranks=(0, 1))],
     [F("nccl_algorithm", "mixed_gpus", Severity.WARNING), F("exposed_comm", "0", Severity.WARNING, ranks=(0, 1))]),
]


@pytest.mark.parametrize("rule,yes,no", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_rule_links_only_on_its_evidence(rule, yes, no):
    assert rule in {r.name for r in RULES}
    out, incidents = correlate(yes, JobFacts(8, WINDOW))
    cause, cons = out
    assert out[1].caused_by == (cause.id,), (rule, out)
    assert len(incidents) == 1 and incidents[0].root_cause == cause.id
    assert {e.rule for e in incidents[0].links} == {rule}
    out, incidents = correlate(no, JobFacts(8, WINDOW))
    assert all(not f.caused_by for f in out)
    assert len(incidents) == 2  # unrelated: an incident each


def test_chain_gpu_fault_timeout_busy_wait_is_one_incident_rooted_at_the_fault():
    fs = [busy_wait("4"), timeout(), xid79(), straggler(rank=2, host="node03", lost=5.0)]
    out, incidents = correlate(fs, JobFacts(8, WINDOW))
    by = {f.detector: f for f in out}
    first = incidents[0]
    assert first.root_cause == by["gpu_hw_error"].id
    assert first.findings == (by["gpu_hw_error"].id, by["nccl_timeout"].id, by["busy_wait"].id)
    assert by["nccl_timeout"].caused_by == (by["gpu_hw_error"].id,)
    # the Xid has no time: gpu_fault_stalls_peers refuses it; the timeout (same period) explains the waiting
    assert by["busy_wait"].caused_by == (by["nccl_timeout"].id,)
    # every finding in exactly one incident; the unrelated straggler on its own, after the fatal one
    assert sorted(i for inc in incidents for i in inc.findings) == sorted(f.id for f in out)
    assert [len(i.findings) for i in incidents] == [3, 1]
    assert all(f.incident == next(i.id for i in incidents if f.id in i.findings) for f in out)
    # fatal cost: 8 GPUs x 600 s ran before the watchdog = 4800 GPU-s
    assert first.gpu_hours_lost == pytest.approx(8 * 600 / 3600, abs=1e-6)
    assert incidents[1].gpu_hours_lost == pytest.approx(5.0 / 3600, abs=1e-6)


# --- rule 3: links need their evidence ------------------------------------------------------------


def test_a_time_rule_refuses_a_finding_whose_time_is_unknown():
    rule = next(r for r in RULES if r.name == "gpu_fault_stalls_peers")
    assert rule.order == "cause_first" and rule.unknown_time == "refuse"
    out, incidents = correlate([xid79(t=None), busy_wait("4")], JobFacts(8, WINDOW))
    assert all(not f.caused_by for f in out) and len(incidents) == 2
    out, incidents = correlate([xid79(t=T0 + 2 * S), busy_wait("4")], JobFacts(8, WINDOW))  # timed: linked
    assert len(incidents) == 1 and incidents[0].links[0].basis == ""


def test_a_place_only_link_is_low_confidence_and_says_so():
    rule = next(r for r in RULES if r.name == "gpu_fault_kills_rank")
    assert rule.unknown_time == "place_only" and rule.confidence == "high"
    out, incidents = correlate([xid79(t=None), timeout(t=T0 + 601 * S)], JobFacts(8, WINDOW))
    (inc,) = incidents
    (link,) = inc.links
    assert link.confidence == "low" and inc.confidence == "low"
    assert link.basis.startswith("place only (gpu)") and "gpu_fault's time is unknown" in link.basis
    assert link.to_json()["basis"] == link.basis and link.basis in inc.summary
    timed = correlate([xid79(t=T0 + 1 * S), timeout(t=T0 + 601 * S)], JobFacts(8, WINDOW))[1][0]
    assert timed.links[0].confidence == "high" and "basis" not in timed.links[0].to_json()


def desync(t: int | None, ran_ms: int = 600_000) -> Finding:
    when = When.unknown("no stamp") if t is None else When.span(t - ran_ms * 10**6, t, "watchdog stamp - ran")
    return F("nccl_timeout", "desync", ranks=(4,), hosts=("node07",), when=when)


def test_a_cause_is_never_later_than_its_consequence():
    """The known bad case: an Xid logged ten minutes after the watchdog fired was linked as the timeout's cause
    through a desync finding that carried no time. The desync now carries its lines' time, and the Xid is refused
    as its cause and as the timeout's."""
    fired = T0 + 601 * S
    late_xid = xid79(t=fired + 600 * S)
    out, incidents = correlate([late_xid, desync(fired), timeout(t=fired)], JobFacts(8, WINDOW))
    by = {f.kind: f for f in out}
    assert by["gpu_fault"].caused_by == () and not any(by["gpu_fault"].id in f.caused_by for f in out)
    assert by["timeout"].caused_by == (by["desync"].id,)
    root = next(i for i in incidents if by["timeout"].id in i.findings).root_cause
    assert root == by["desync"].id
    # every link of every case above: the cause starts no later than the consequence ends
    for fs in ([late_xid, desync(fired), timeout(t=fired)], [xid79(t=T0), desync(fired), timeout(t=fired)]):
        out, incidents = correlate(fs, JobFacts(8, WINDOW))
        whens = {f.id: f.when for f in out}
        links = [e for i in incidents for e in i.links]
        assert links
        for e in links:
            c, q = whens[e.cause], whens[e.consequence]
            assert not (c.known and q.known) or c.start_ns <= q.end_ns  # type: ignore[operator]


def test_fatal_cost_uses_the_fault_time_when_both_times_are_known():
    out, incidents = correlate([xid79(t=T0), timeout(t=T0 + 900 * S)], JobFacts(16, WINDOW))
    assert incidents[0].gpu_hours_lost == pytest.approx(16 * 900 / 3600, abs=1e-6)
    assert "from the fault to the watchdog kill" in incidents[0].cost_method
    assert incidents[0].verdict.startswith("Job died at 09:15:00: ")


def test_cost_is_null_only_without_times():
    _, incidents = correlate([F("nccl_algorithm", "forced", Severity.WARNING)], JobFacts(8, WINDOW))
    assert incidents[0].gpu_hours_lost is None and "not computed" in incidents[0].cost_method


def test_ids_and_order_do_not_depend_on_input_order():
    fs = [busy_wait("4"), timeout(), xid79(), straggler(rank=2, host="node03")]
    a = correlate(fs, JobFacts(8, WINDOW))
    b = correlate(list(reversed(fs)), JobFacts(8, WINDOW))
    assert [i.to_json() for i in a[1]] == [i.to_json() for i in b[1]]
    assert sorted((f.id, f.incident, f.caused_by) for f in a[0]) == sorted((f.id, f.incident,
                                                                            f.caused_by) for f in b[0])


# --- end to end ----------------------------------------------------------------------------------


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "forensics.cli", *args], capture_output=True, text=True,
                          cwd=ROOT, check=False)


@pytest.fixture(scope="module")
def xid79_out(tmp_path_factory):
    out = tmp_path_factory.mktemp("xid79")
    runs = [_cli("analyze", "sample_traces/xid79", "--out", str(out / f"r{i}"), "-q", "--fail-on", "never")
            for i in (1, 2)]
    return out, runs


def test_xid79_sample_one_incident_rooted_at_the_xid(xid79_out, findings_validator):
    from tests.conftest import assert_valid_findings

    out, runs = xid79_out
    doc = assert_valid_findings(findings_validator, out / "r1" / "findings.json")
    truth = json.loads((ROOT / "sample_traces" / "xid79.truth.json").read_text())
    (expected,) = truth["incidents"]
    by_id = {f["id"]: f for f in doc["findings"]}
    (inc,) = [i for i in doc["incidents"] if by_id[i["root_cause"]]["detector"] == expected["root"]["detector"]]
    root = by_id[inc["root_cause"]]
    assert root["metrics"]["root_xid"] == 79 and root["ranks"] == expected["root"]["ranks"]
    members = {by_id[i]["detector"] for i in inc["findings"][1:]}
    assert set(expected["consequences"]) <= members <= set(expected["consequences"]) | set(expected["may_include"])
    assert doc["incidents"][0]["id"] == inc["id"]
    for f in doc["findings"]:
        assert sum(f["id"] in i["findings"] for i in doc["incidents"]) == 1
    # cost: world size x the longest 'ran for' of the watchdog lines, read here from the logs themselves
    ran = max(int(m) for p in (ROOT / "sample_traces" / "xid79" / "logs").glob("*.out")
              for m in re.findall(r"ran for (\d+) milliseconds", p.read_text()))
    # plus the work since the truth's checkpoint save, up to the hang's start (earliest watchdog stamp - ran)
    (ck,) = truth["checkpoints"]
    year = datetime.fromtimestamp(ck["wall_ns"] / 1e9, tz=timezone.utc).year
    fired = min(int(datetime(year, *map(int, m[:5]), tzinfo=timezone.utc).timestamp()) * 10**9 + int(m[5].ljust(9, "0"))
                for p in (ROOT / "sample_traces" / "xid79" / "logs").glob("*.out")
                for m in re.findall(r"\[E(\d\d)(\d\d) (\d\d):(\d\d):(\d\d)\.(\d+) \S+\] \[Rank \d+\] Watchdog caught",
                                    p.read_text()))
    lost_s = (fired - ran * 10**6 - ck["wall_ns"]) / 1e9
    assert inc["gpu_hours_lost"] == pytest.approx(truth["job"]["world_size"] * (ran / 1000 + lost_s) / 3600, abs=1e-4)
    # the verdict: first line on stdout, first bullet of summary.md, in report.html
    verdict = runs[0].stdout.splitlines()[0]
    assert verdict == "CRITICAL: " + inc["verdict"]
    assert verdict.startswith("CRITICAL: Job died at 09:10:00: Xid 79") and "rank 4" in verdict
    md = (out / "r1" / "summary.md").read_text().splitlines()
    assert md[2].replace("\\", "") == "- " + verdict
    assert "Verdict" in (out / "r1" / "report.html").read_text()


def test_xid79_findings_json_is_byte_identical_across_runs(xid79_out):
    out, _ = xid79_out
    assert (out / "r1" / "findings.json").read_bytes() == (out / "r2" / "findings.json").read_bytes()


def test_xid79_run_header(xid79_out):
    out, _ = xid79_out
    run = json.loads((out / "r1" / "findings.json").read_text())["run"]
    truth = json.loads((ROOT / "sample_traces" / "xid79.truth.json").read_text())
    assert run["world_size"] == truth["job"]["world_size"] and run["ranks_missing"] == []
    assert run["hosts"] == sorted(h["host"] for h in truth["hosts"])
    assert {(g["host"], g["pci_bus_id"], g["rank"]) for g in run["gpus"]} == {
        (r["host"], r["pci_bus_id"], r["rank"]) for r in truth["ranks"]}


SIMULATED = [("collective_timeout", {}), ("ddp_straggler", {}), ("host_straggler", {"ranks": 16}),
             ("xid48", {}), ("net_socket", {}), ("input_bound", {}), ("ddp_no_overlap", {}), ("slow_nic", {}),
             ("slow_nic", {"params": {"nic": "3"}}), ("hsdp_slow_nic", {"steps": 2}),
             ("pp_imbalance", {}), ("pp_imbalance_stage2", {}), ("oom_kill", {}), ("xid149", {}),
             ("aer_fatal_audio", {}), ("rm_init_failed", {}), ("xid79", {}),
             ("cuda_oom", {}), ("illegal_address", {}), ("time_limit", {}), ("preempted", {}), ("dataloader_hang", {}),
             ("pp_exception", {}), ("async_tp_serialized", {"steps": 2})]


@pytest.mark.parametrize("scenario,kw", SIMULATED, ids=[s + "".join(f"-{k}{v}" for k, v in kw.get("params", {}).items())
                                                       for s, kw in SIMULATED])
def test_simulated_scenarios_give_the_incidents_of_their_truth(tmp_path, scenario, kw):
    from forensics.pipeline import analyze
    from forensics.simulate import simulate

    truth = simulate(scenario, tmp_path / "run", seed=0, **kw)
    assert truth["incidents"], "the scenario's truth names no incident"
    analysis = analyze(tmp_path / "run", workers=1)
    by_id = {f.id: f for f in analysis.findings}
    for exp in truth["incidents"]:
        found = [i for i in analysis.incidents if by_id[i.root_cause].detector == exp["root"]["detector"]
                 and set(exp["root"]["ranks"]) <= set(by_id[i.root_cause].ranks)
                 and by_id[i.root_cause].metrics.get("category", exp["root"].get("category")) == exp["root"].get(
                     "category", by_id[i.root_cause].metrics.get("category"))]
        assert found, (scenario, exp, [i.to_json() for i in analysis.incidents])
        members = {by_id[f].detector for f in found[0].findings[1:]}
        assert set(exp["consequences"]) <= members <= set(exp["consequences"]) | set(exp["may_include"]), members


def test_real_nccl_logs_give_byte_identical_findings(tmp_path):
    logs = ROOT.parent / "shared" / "sample_data" / "nccl_logs"
    assert logs.is_dir(), f"shared sample data missing: {logs} (this test needs ../shared)"
    runs = [_cli("analyze", str(logs), "--out", str(tmp_path / f"r{i}"), "-q", "--fail-on", "never") for i in (1, 2, 3)]
    assert all(r.returncode == 0 for r in runs), [r.stderr for r in runs]
    first = (tmp_path / "r1" / "findings.json").read_bytes()
    assert all((tmp_path / f"r{i}" / "findings.json").read_bytes() == first for i in (2, 3))
    doc = json.loads(first)
    assert sorted(i for inc in doc["incidents"] for i in inc["findings"]) == sorted(f["id"] for f in doc["findings"])


def test_triage_ranks_jobs_by_their_top_incident():
    from forensics.fleet.state import dataset, job_ranking
    from forensics.fleet.triage import JobTask, analyze_job

    def run(name: str):
        return analyze_job(JobTask(name, str(ROOT / "sample_traces" / name), "fp"))

    xid = run("xid79")
    table = job_ranking(dataset([run("ddp_straggler"), xid]))
    top = table.row(0, named=True)
    assert top["job_id"] == "xid79" and top["top_incident"].startswith("Xid 79")  # not the busy_wait symptom
    assert top["top_verdict"] == xid.incidents[0]["verdict"]


# --- links need their evidence: "any" order, standing settings (issue 25 item 3) ---------------------------------


def test_any_order_asks_no_order_but_refuses_a_cause_known_to_start_after_its_consequence_ended():
    """`any`: a hang and its waiters describe the same period, so neither has to start first; but a hang that began
    after the profiled window ended cannot explain the spinning measured in that window."""
    rule = next(r for r in RULES if r.name == "hang_stalls_peers")
    assert rule.order == "any"
    during = timeout(t=T0 + 605 * S, ran_ms=600_000)  # hung from T0 + 5 s: inside the window
    out, incidents = correlate([during, busy_wait("4")], JobFacts(8, WINDOW))
    assert len(incidents) == 1 and incidents[0].links[0].confidence == "high" and not incidents[0].links[0].basis
    after = timeout(t=T0 + 660 * S, ran_ms=600_000)  # hung from T0 + 60 s: the window had ended
    out, incidents = correlate([after, busy_wait("4")], JobFacts(8, WINDOW))
    assert all(not f.caused_by for f in out) and len(incidents) == 2
    # the consequence may start first: spinning that began before the hang's collective was issued still links
    early = F("busy_wait", "busy_wait", ranks=(0, 1), waited_for=(4,), when=When.span(T0 - 30 * S, T0 + 20 * S, "w"))
    assert len(correlate([during, early], JobFacts(8, WINDOW))[1]) == 1


def test_any_order_with_an_unknown_time_links_by_place_only_and_says_so():
    """No rule links a finding of unknown time silently: `any` rules either refuse it or, as the hang rules do, link
    it by place alone at low confidence with the reason in the link."""
    out, incidents = correlate([timeout(t=None), busy_wait("4")], JobFacts(8, WINDOW))
    (inc,) = incidents
    (link,) = inc.links
    assert link.rule == "hang_stalls_peers" and link.confidence == "low"
    assert link.basis == "place only (rank): the timeout's time is unknown"
    for rule in RULES:  # every rule states what it does with an unknown time
        assert rule.unknown_time in ("refuse", "place_only", "standing"), rule.name
    refusing = F("straggler", "compute", Severity.WARNING, ranks=(5,), waited_for=(5,), when=at(None))
    out, incidents = correlate([refusing, busy_wait("5")], JobFacts(8, WINDOW))
    assert len(incidents) == 2  # straggler_stalls_peers refuses a straggler of unknown time


def test_a_standing_setting_links_without_its_own_time_but_not_to_an_untimed_consequence():
    transport = F("nccl_transport", "socket", Severity.WARNING, ranks=(0, 1), hosts=("node07",))
    assert not transport.when.known
    exposed = F("exposed_comm", "0", Severity.WARNING, ranks=(0, 1, 2, 3), hosts=("node07",))
    (inc,) = correlate([transport, exposed], JobFacts(8, WINDOW))[1]
    (link,) = inc.links
    assert link.rule == "degraded_transport_slows_comm" and link.confidence == "medium"
    assert link.basis == "place (rank): the degraded_transport is a setting that holds for the whole run"
    untimed = F("exposed_comm", "0", Severity.WARNING, ranks=(0, 1, 2, 3), hosts=("node07",), when=at(None))
    assert len(correlate([transport, untimed], JobFacts(8, WINDOW))[1]) == 2


# --- communication failures and what roots them (issue 28 item 2) ------------------------------------------------


def comm_failure(ranks: tuple[int, ...] = (3,), hosts: tuple[str, ...] = (), t: int | None = None) -> Finding:
    return F("nccl_comm_failure", "comm_failure", ranks=ranks, hosts=hosts, kind="comm_failure", when=at(t))


def raised(ranks: tuple[int, ...] = (3,), t: int | None = None) -> Finding:
    return F("last_words", "victims", Severity.WARNING, ranks=ranks, kind="nccl_raised", when=at(t))


def test_the_nccl_error_raised_to_python_is_the_logged_comm_failure():
    """Job log 17's shape: NCCL's remote error on rank 3 and the DistBackendError rank 3 raised for it, both without
    a time: one incident rooted at the communication failure, linked by place only."""
    cf, py = comm_failure(), raised()
    out, incidents = correlate([py, cf], JobFacts(8, None))
    (inc,) = incidents
    assert inc.root_cause == cf.id and inc.links[0].rule == "comm_failure_raised_to_python"
    assert inc.links[0].confidence == "low" and "time is unknown" in inc.links[0].basis
    timed = correlate([comm_failure(t=T0), raised(t=T0 + 2 * S)], JobFacts(8, None))[1]
    assert len(timed) == 1 and timed[0].links[0].confidence == "high"
    # another rank's error is not this failure's; an error raised long before it is not either
    assert len(correlate([comm_failure(), raised(ranks=(5,))], JobFacts(8, None))[1]) == 2
    assert len(correlate([comm_failure(t=T0), raised(t=T0 - 900 * S)], JobFacts(8, None))[1]) == 2


def test_something_earlier_roots_the_comm_failure_a_scheduler_kill_or_the_first_failure():
    stop = F("last_words", "scheduler:time_limit", Severity.WARNING, kind="scheduler_stop", when=at(T0),
             cost=CostBasis(fatal=True, died_ns=T0, hung_s=0.0))
    cf, py = comm_failure(t=T0 + 3 * S), raised(t=T0 + 4 * S)
    out, incidents = correlate([cf, py, stop], JobFacts(8, None))
    (inc,) = incidents
    assert inc.root_cause == stop.id and {f.id: f.caused_by for f in out}[cf.id] == (stop.id,)
    assert next(e for e in inc.links if e.consequence == py.id).cause == cf.id  # under the logged error
    late_stop = F("last_words", "scheduler:time_limit", Severity.WARNING, kind="scheduler_stop", when=at(T0 + 60 * S))
    out, incidents = correlate([cf, py, late_stop], JobFacts(8, None))
    assert next(i for i in incidents if cf.id in i.findings).root_cause == cf.id  # a stop after it explains nothing
    oom = F("last_words", "first:cuda_oom", kind="app_failure", ranks=(2,), when=at(T0))
    out, incidents = correlate([cf, py, oom], JobFacts(8, None))
    (inc,) = incidents
    assert inc.root_cause == oom.id and {f.id: f.caused_by for f in out}[cf.id] == (oom.id,)


def test_a_fault_on_the_peers_host_roots_the_comm_failure():
    """The failure names the peer's host (placed from the logs' addresses): a GPU fault or an OOM kill there, before
    it, is its root; the same fault after it is not."""
    cf = comm_failure(ranks=(0,), hosts=("node03", "node07"), t=T0 + 10 * S)
    for fault in (xid79(t=T0 + 9 * S), oom_of_rank(t=T0 + 8 * S)):
        (inc,) = correlate([cf, fault], JobFacts(8, None))[1]
        assert inc.root_cause == fault.id and inc.links[0].rule == "fault_breaks_peer_connection"
    assert len(correlate([cf, xid79(t=T0 + 60 * S)], JobFacts(8, None))[1]) == 2


# --- consequences of a fault stay under it (issue 28 item 7) --------------------------------------------------------


def test_slow_collectives_after_a_fault_on_its_rank_or_host_are_under_the_fault():
    """A GPU fault on rank 4 inside the profiled window: the exposed communication of the communicator through rank 4
    and the slow link of its host are the fault's consequences; before the fault (a fault after the window) or on
    another communicator they are not."""
    exposed = F("exposed_comm", "0", Severity.WARNING, ranks=tuple(range(8)), hosts=("node07",))
    link = slow_link(ranks=(4, 5))
    fault = xid79(t=T0 + 2 * S)
    out, incidents = correlate([fault, exposed, link], JobFacts(8, WINDOW))
    inc = next(i for i in incidents if i.root_cause == fault.id)
    assert set(inc.findings) == {fault.id, exposed.id, link.id}
    assert {e.rule for e in inc.links} <= {"fault_slows_collectives", "slow_link_stalls_peers"}
    assert {f.id: f.caused_by for f in out}[link.id] == (fault.id,)
    late = xid79(t=T0 + 60 * S)
    out, incidents = correlate([late, exposed, link], JobFacts(8, WINDOW))
    assert not any(late.id in f.caused_by for f in out)
    other = F("exposed_comm", "0", Severity.WARNING, ranks=(8, 9), hosts=("node09",))
    out, incidents = correlate([fault, other], JobFacts(8, WINDOW))
    assert len(incidents) == 2
    host = host_fault(t=T0 + 1 * S, category="hung")
    (inc,) = correlate([host, link], JobFacts(8, WINDOW))[1]
    assert inc.root_cause == host.id
