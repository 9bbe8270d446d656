"""last_words: the first failure is the root (its consequences under it), a scheduler stop is its own kind,
stack dumps name the odd rank out; bad input is bounded and never raises."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import polars as pl
from forensics.parsers.discovery import discover_and_parse
from forensics.parsers.lastwords import parse
from forensics.parsers.result import ParseContext

from forensics.base.findings import CostBasis, Finding, Severity, When
from forensics.base.frames import JobFrames
from forensics.detectors import run_detectors
from forensics.facts.context import JobContext
from forensics.incidents import JobFacts, correlate
from forensics.pipeline import analyze, collect_frames

OOM_RANK3 = """\
2025-03-01 10:00:00 [rank3]: Traceback (most recent call last):
[rank3]:   File "/job/train.py", line 40, in <module>
[rank3]:     main()
[rank3]:   File "/job/train.py", line 31, in main
[rank3]:     loss = model(batch)
[rank3]:   File "/usr/lib/python3/site-packages/torch/nn/modules/module.py", line 1501, in _call_impl
[rank3]:     return forward_call(*args, **kwargs)
[rank3]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 4.00 GiB. GPU 3 has a total capacity of 79.10 GiB \
of which 1.00 GiB is free. Including non-PyTorch memory, this process has 78.10 GiB memory in use. Of the allocated \
memory 60.00 GiB is allocated by PyTorch, and 17.00 GiB is reserved by PyTorch but unallocated.
"""  # noqa: E501 -- verbatim log lines (test data)


def _write(tmp: Path, name: str, text: str | bytes) -> Path:
    path = tmp / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(text.encode() if isinstance(text, str) else text)
    return path


def _findings(tmp: Path) -> list[Finding]:
    _, frames = collect_frames(discover_and_parse(tmp))
    found, skipped = run_detectors(JobContext(frames), only=["last_words"])
    assert not skipped
    return found


def test_triggers_oom_on_rank_3_with_its_numbers_and_fragmentation(tmp_path):
    _write(tmp_path, "rank3.log", OOM_RANK3)
    (f,) = _findings(tmp_path)
    assert (f.key, f.ranks, f.severity) == ("first:cuda_oom", (3,), Severity.CRITICAL)
    assert f.metrics["user_frame"] == "/job/train.py:31 in main"
    assert f.metrics["fault_wall_ns"] == 1740823200 * 10**9 and f.metrics["time_from"] == "before"
    assert f.metrics["oom_reserved_unallocated_bytes"] == 17 * 2**30
    assert "expandable_segments:True" in f.remediation  # 17 GiB unallocated > 10 % of 79.10 GiB


def test_triggers_stack_outlier_in_checkpoint_io(tmp_path):
    stacks = "".join(f"=== Rank {r} ===\nThread 0x1 (most recent call first):\n"
                     f'  File "/x/torch/distributed/distributed_c10d.py", line 2000 in all_reduce\n'
                     f'  File "/job/train.py", line 10 in <module>\n' for r in range(7))
    stacks += ('=== Rank 7 ===\nThread 0x1 (most recent call first):\n  File "/x/torch/serialization.py", line 600 in '
               'save\n'
               '  File "/job/train.py", line 12 in <module>\n')
    _write(tmp_path, "stacks_1.txt", stacks)
    (f,) = _findings(tmp_path)
    assert (f.key, f.ranks, f.metrics["where"], f.metrics["majority_where"]) == ("stacks", (7,), "checkpoint_io",
                                                                                 "collective")


def test_clean_a_launcher_that_only_restarted_and_stopped_its_workers_is_no_failure(tmp_path):
    _write(tmp_path, "launcher.log", "[default] Rendezvous complete for workers. Result:\n"
                                      "W0801 13:23:17.366000 1 api.py:900] Sending process 17 closing signal SIGTERM\n")
    assert _findings(tmp_path) == []


def test_clean_stacks_all_in_one_place_name_no_suspect(tmp_path):
    stacks = "".join(f"=== Rank {r} ===\nThread 0x1 (most recent call first):\n"
                     f'  File "/x/torch/distributed/distributed_c10d.py", line 2000 in all_reduce\n' for r in range(4))
    _write(tmp_path, "stacks_1.txt", stacks)
    assert _findings(tmp_path) == []


def test_skipped_without_last_words_or_stacks():
    found, skipped = run_detectors(JobContext(JobFrames({})), only=["last_words"])
    assert found == [] and "last_words" in skipped[0].reason and "stacks" in skipped[0].reason


def test_a_rank_stdout_that_is_an_nccl_log_is_read_for_both_and_listed_once(tmp_path):
    nccl = "".join(f"node1:100:200 [3] NCCL INFO Channel {i:02d}/0 : 3[3] -> 4[4] via P2P/IPC\n" for i in range(8))
    _write(tmp_path, "rank3.log", nccl + OOM_RANK3)
    parsed = discover_and_parse(tmp_path)
    sources, frames = collect_frames(parsed)
    assert sources.select("path", "kind", "status").rows() == [("rank3.log", "nccl_log", "ok")]
    assert "also read for last words: 1 last-words event(s)" in sources["message"][0]
    assert frames["last_words"]["cls"].to_list() == ["cuda_oom"] and frames.has("nccl_channels")


def _f(det: str, key: str, kind: str, t: int | None, ranks=(), hosts=(), gpus=(), cost=None, **metrics) -> Finding:
    when = When.span(t, t, "test") if t is not None else When.unknown("test")
    return Finding(det, Severity.CRITICAL, f"{det} {key}", "", "do it", ranks=tuple(ranks), hosts=tuple(hosts),
                   gpus=tuple(gpus), metrics=metrics, key=key, kind=kind, when=when, cost=cost or CostBasis())


T = 1_700_000_000 * 10**9


def test_the_first_failure_is_the_root_and_the_other_ranks_timeouts_hang_under_it():
    oom = _f("last_words", "first:cuda_oom", "app_failure", T, ranks=(3,), hosts=("n1",), job_died=True)
    timeout = _f("nccl_timeout", "timeout:0:5", "timeout", T + 600 * 10**9, ranks=(5, 6), hosts=("n2",),
                 cost=CostBasis(fatal=True, died_ns=T + 600 * 10**9, hung_s=600.0, waiting_ranks=7))
    victims = _f("last_words", "victims", "nccl_raised", T + 5 * 10**9, ranks=(4,))
    out, incidents = correlate([timeout, victims, oom], JobFacts(gpus=8, window=None))
    assert len(incidents) == 1 and incidents[0].root_cause == oom.id
    assert {f.id: f.caused_by for f in out}[timeout.id] == (oom.id,)
    assert incidents[0].verdict.startswith("Job died at ") and "last_words first:cuda_oom" in incidents[0].verdict
    assert incidents[0].gpu_hours_lost == round(8 * 600 / 3600, 6)  # from the OOM to the watchdog's kill


def test_the_verdict_says_the_job_died_from_the_kind_not_from_a_metric():
    """The kind declares that its findings end the job (FindingKind.ends_job): no metric key is read."""
    oom = _f("last_words", "first:cuda_oom", "app_failure", T, ranks=(3,), hosts=("n1",))
    (inc,) = correlate([oom], JobFacts(gpus=8, window=None))[1]
    assert inc.verdict.startswith("Job died: last_words first:cuda_oom"), inc.verdict
    raised = _f("last_words", "victims", "nccl_raised", T, ranks=(3,), job_died=True)
    (inc,) = correlate([raised], JobFacts(gpus=8, window=None))[1]
    assert not inc.verdict.startswith("Job died"), inc.verdict


def test_an_application_xid_at_the_time_of_the_ranks_cuda_error_is_the_same_incident():
    ima = _f("last_words", "first:illegal_address", "app_failure", T, ranks=(2,), hosts=("n1",), job_died=True)
    xid = replace(_f("gpu_hw_error", "xid:31", "gpu_event", T - 2 * 10**9, hosts=("n1",), gpus=("0000:3b:00.0",)),
                  xids=(31,))
    later = replace(_f("gpu_hw_error", "xid:31b", "gpu_event", T + 900 * 10**9, hosts=("n1",)), xids=(31,))
    _, incidents = correlate([xid, ima, later], JobFacts(gpus=8, window=None))
    roots = {i.root_cause: set(i.findings) for i in incidents}
    assert roots[ima.id] == {ima.id, xid.id}  # within 120 s of the error; the one 15 minutes later is not it


def test_a_gpu_event_at_the_time_of_the_cuda_error_joins_it_only_for_an_application_xid():
    """Xid 13/31/43/45 is the application's error seen by the driver; another GPU event on the same host at the same
    time (a correctable ECC report, Xid 94's neighbours, throttling: no Xid at all) is not that error."""
    ima = _f("last_words", "first:illegal_address", "app_failure", T, ranks=(2,), hosts=("n1",))
    for xids, joined in (((13,), True), ((43, 45), True), ((), False), ((63,), False), ((92,), False)):
        ev = replace(_f("gpu_hw_error", "ev", "gpu_event", T + 3 * 10**9, hosts=("n1",)), xids=xids)
        out, incidents = correlate([ima, ev], JobFacts(gpus=8, window=None))
        assert (len(incidents) == 1) is joined, xids


def test_nothing_after_a_time_limit_is_blamed_on_nccl_or_the_hardware():
    stop = _f("last_words", "scheduler:time_limit", "scheduler_stop", T,
              cost=CostBasis(fatal=True, died_ns=T, hung_s=0.0))
    timeout = _f("nccl_timeout", "timeout:0:5", "timeout", T + 60 * 10**9, ranks=(1,))
    xid79 = _f("gpu_hw_error", "xid:79", "gpu_fault", T + 5 * 10**9, hosts=("n1",))
    before = _f("gpu_hw_error", "xid:79b", "gpu_fault", T - 3600 * 10**9, hosts=("n2",))
    facts = JobFacts(gpus=8, window=None, checkpoints_ns=(T - 1800 * 10**9,), checkpoint_lines=1)
    _, incidents = correlate([stop, timeout, xid79, before], facts)
    by_root = {i.root_cause: i for i in incidents}
    assert set(by_root[stop.id].findings) == {stop.id, timeout.id, xid79.id}
    assert by_root[stop.id].gpu_hours_lost == round(8 * 1800 / 3600, 6)  # the work since the checkpoint
    assert by_root[stop.id].verdict.startswith("Stopped at ")
    assert before.id in by_root  # a fault before the cancellation stays its own incident


def test_bad_input_interleaved_truncated_deep_and_not_utf8_is_bounded_and_partial(tmp_path):
    lines = []
    for r in range(64):  # 64 ranks' tracebacks interleaved line by line
        lines.append(f"[rank{r}]: Traceback (most recent call last):")
    for depth in range(3):
        lines += [f'[rank{r}]:   File "/job/train.py", line {depth + 1}, in f{depth}' for r in range(64)]
    lines += [f"[rank{r}]: RuntimeError: CUDA error: an illegal memory access was encountered" for r in range(0, 64, 2)]
    deep = ["Traceback (most recent call last):"] + ['  File "/job/rec.py", line 3, in rec\n    rec()'] * 100_000
    body = "\n".join(lines + deep).encode() + b"\n\xff\xfe broken bytes \x80\n  File \"/job/rec.py\", line 3, in r"
    path = _write(tmp_path, "job.log", body)
    res = parse(path, ParseContext(tmp_path, "job.log"))
    lw = res.frames["last_words"]
    assert res.status == "partial"
    assert "not UTF-8" in res.message and "traceback(s) cut off" in res.message and "100,001 frames" in res.message
    ima = lw.filter(pl.col("cls") == "illegal_address")
    assert sorted(ima["rank"].to_list()) == list(range(0, 64, 2)) and set(ima["frames"].to_list()) == {3}
    deepest = lw.filter(pl.col("frames") == 100_001).row(0, named=True)
    assert deepest["traceback"].count('File "/job/rec.py"') == 48 and "99,953 frames not shown" in deepest["traceback"]


def test_analyze_never_raises_on_garbage(tmp_path):
    _write(tmp_path, "rank0.log", b"Traceback (most recent call last):\n\x00\x01" * 3 + b"[rank]: " + b"\xff" * 5000)
    a = analyze(tmp_path)
    assert a.sources.height == 1


def test_the_process_group_a_line_names_is_the_findings_process_group(tmp_path):
    """PyTorch's `[PG ID n ...]` prefix names the group (its PG ID, as the watchdog lines do); a line without it names
    none."""
    text = ("[rank3]:[E0101 10:00:00.000000000 ProcessGroupNCCL.cpp:1896] [PG ID 2 PG GUID 5(TENSOR_PARALLEL) Rank 3] "
            "Process group watchdog thread terminated with exception: CUDA error: an illegal memory access was "
            "encountered\n")
    _write(tmp_path, "rank3.log", text)
    (f,) = _findings(tmp_path)
    assert f.kind == "app_failure" and f.process_group == "2", f.process_group
    (tmp_path / "rank3.log").write_text(text.replace("[PG ID 2 PG GUID 5(TENSOR_PARALLEL) Rank 3] ", ""))
    (g,) = _findings(tmp_path)
    assert g.kind == "app_failure" and g.process_group is None
