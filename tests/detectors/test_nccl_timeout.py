from __future__ import annotations

from datetime import datetime, timezone

from forensics.base.frames import JobFrames
from tests.detectors.nccl_fixtures import HEALTHY, frames_from

TIMEOUT = """\
[rank2]:[E101 10:00:00.000000000 ProcessGroupNCCL.cpp:632] [Rank 2] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=41, OpType=ALLREDUCE, NumelIn=1024, NumelOut=1024, Timeout(ms)=600000) ran for 600100 milliseconds before timing out.
[rank2]:[E101 10:00:00.000000000 ProcessGroupNCCL.cpp:2268] [PG ID 0 PG GUID 0(default_pg) Rank 2]  failure detected by watchdog at work sequence id: 41 PG status: last enqueued work: 41, last completed work: 40
[rank3]:[E101 10:00:00.000000000 ProcessGroupNCCL.cpp:2268] [PG ID 0 PG GUID 0(default_pg) Rank 3]  failure detected by watchdog at work sequence id: 41 PG status: last enqueued work: 39, last completed work: 39
"""  # noqa: E501 -- verbatim log lines (test data)


def test_triggers_and_names_the_rank_that_never_issued_the_collective(run_detector, tmp_path):
    findings, _ = run_detector(frames_from(tmp_path, TIMEOUT))
    (f,) = findings
    assert f.ranks == (3,) and f.metrics["seq"] == 41 and f.metrics["timeout_ms"] == 600000
    assert "never issued" in f.summary and "stuck inside" in f.summary


def test_triggers_on_desync(run_detector, tmp_path):
    first = TIMEOUT.splitlines()[0]
    text = (TIMEOUT + first.replace("rank2", "rank6").replace("Rank 2", "Rank 6") + "\n"
            + first.replace("rank2", "rank5").replace("Rank 2", "Rank 5").replace("ALLREDUCE", "BROADCAST") + "\n")
    findings, _ = run_detector(frames_from(tmp_path, text))
    d = [f for f in findings if f.key == "desync"][0]
    assert d.ranks == (5,)  # the minority collective at SeqNum 41


def test_clean_healthy_nccl_log(run_detector, tmp_path):
    findings, skipped = run_detector(frames_from(tmp_path, HEALTHY))
    assert findings == [] and "collective_timeouts" in skipped[0].reason


def test_clean_ras_all_ok(run_detector, tmp_path):
    text = ("NCCL version 2.26.2 compiled with CUDA 12.4\n\nGroup     Comms     Nodes     Ranks     Ranks     Ranks    "
            "Status  Errors\n"
            "    0         1         2         8        16        16   RUNNING      OK\n")
    findings, skipped = run_detector(frames_from(tmp_path, text))
    assert findings == [] and "no PyTorch watchdog" in skipped[0].reason


def test_skipped_without_any_log(run_detector):
    findings, skipped = run_detector(JobFrames({}))
    assert findings == [] and "collective_timeouts" in skipped[0].reason


def _in_2026(frames: JobFrames) -> JobFrames:
    """The frames with one profiled step in January 2026: the job's year for the year-less glog stamps."""
    import polars as pl

    t = int(datetime(2026, 1, 1, 9, 0, tzinfo=timezone.utc).timestamp()) * 10**9
    steps = pl.DataFrame({"rank": [0], "step": [1], "start_ns": [t], "end_ns": [t + 10**9]})
    return JobFrames({**{n: frames[n] for n in frames.present}, "steps": steps})


def test_timeout_and_desync_carry_the_watchdog_time(run_detector, tmp_path):
    """Both are placed from their own lines: the watchdog stamp (Jan 1 10:00:00) minus the 600100 ms run."""
    stamped = TIMEOUT.replace("[E101 ", "[E0101 ")  # glog: [EMMDD hh:mm:ss.frac ...]
    first = stamped.splitlines()[0]
    text = stamped + first.replace("rank2", "rank5").replace("Rank 2", "Rank 5").replace("ALLREDUCE",
                                                                                         "BROADCAST") + "\n"
    findings, _ = run_detector(_in_2026(frames_from(tmp_path, text)))
    fired = int(datetime(2026, 1, 1, 10, 0, tzinfo=timezone.utc).timestamp()) * 10**9
    by = {f.kind: f for f in findings}
    assert set(by) == {"timeout", "desync"}
    for f in by.values():
        assert (f.when.start_ns, f.when.end_ns) == (fired - 600_100 * 10**6, fired), f.when
    assert by["timeout"].cost.fatal and by["timeout"].cost.died_ns == fired and by["timeout"].cost.hung_s == 600.1
    assert by["timeout"].cost.waiting_ranks == 3 and by["timeout"].process_group == "0"


def test_without_the_job_year_the_time_is_unknown_and_says_why(run_detector, tmp_path):
    findings, _ = run_detector(frames_from(tmp_path, TIMEOUT.replace("[E101 ", "[E0101 ")))
    (f,) = findings
    assert not f.when.known and "year" in f.when.basis and f.cost.died_ns is None


def test_triggers_and_names_the_rank_stuck_on_the_device_by_the_counters_vote(run_detector, tmp_path):
    # every rank reached SeqNum 41 (nobody "never issued" it); rank 3's own work stopped completing at 37
    line = ("[rank{r}]:[E101 10:00:00.000000000 ProcessGroupNCCL.cpp:2268] [PG ID 0 PG GUID 0(default_pg) Rank {r}]  "
            "failure detected by watchdog at work sequence id: {s} PG status: last enqueued work: 41, "
            "last completed work: {c}\n")
    text = "".join(line.format(r=r, s=38 if r == 3 else 41, c=37 if r == 3 else 40) for r in range(4))
    findings, _ = run_detector(frames_from(tmp_path, text))
    (f,) = findings
    assert f.ranks == (3,) and "vote names rank(s) 3 stuck on the device" in f.summary
    assert f.metrics["culprit_ranks"] == "3"


CUDA_FAIL = ("2026-01-01T10:00:05.250Z: nodeA:100:100 [0] init.cc:204 NCCL WARN Cuda failure 'an illegal memory access "
             "was encountered'\n")
RAS_ERRORS = """\
NCCL version 2.27.3 compiled with CUDA 12.9
Group     Comms     Nodes     Ranks     Ranks     Ranks    Status  Errors
    0         1         1         1         2         1   RUNNING  INCOMPLETE
INCOMPLETE
  Process 60004 on node 10.4.109.13 managing GPU 0
"""


def test_a_cuda_failure_is_placed_by_its_lines_own_stamp(run_detector, tmp_path):
    findings, _ = run_detector(frames_from(tmp_path, CUDA_FAIL + CUDA_FAIL.replace("10:00:05.250", "10:00:07")))
    (f,) = findings
    t = int(datetime(2026, 1, 1, 10, 0, 5, tzinfo=timezone.utc).timestamp()) * 10**9 + 250_000_000
    assert f.kind == "cuda_failure" and (f.when.start_ns, f.when.end_ns) == (t, t + 1_750_000_000), f.when


def test_a_cuda_failure_without_a_stamp_is_unknown_in_time(run_detector, tmp_path):
    (f,) = run_detector(frames_from(tmp_path, CUDA_FAIL.split(": ", 1)[1]))[0]
    assert f.kind == "cuda_failure" and not f.when.known and "stamp" in f.when.basis


def test_ras_errors_are_placed_by_their_lines_stamps(run_detector, tmp_path):
    text = "".join(f"2026-01-01T10:00:{i:02d}Z: {line}\n" for i, line in enumerate(RAS_ERRORS.splitlines()))
    findings, _ = run_detector(frames_from(tmp_path, text))
    (f,) = findings
    t0 = int(datetime(2026, 1, 1, 10, 0, tzinfo=timezone.utc).timestamp()) * 10**9
    assert f.kind == "missing_rank" and (f.when.start_ns, f.when.end_ns) == (t0 + 2 * 10**9, t0 + 4 * 10**9), f.when
    (g,) = run_detector(frames_from(tmp_path, RAS_ERRORS))[0]
    assert not g.when.known
