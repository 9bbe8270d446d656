"""PyTorch ProcessGroupNCCL and watchdog lines: timeouts, blocking waits, the last enqueued/started/completed work,
desync reports, NCCL errors, Flight Recorder dumps."""

from __future__ import annotations

import re

from forensics.parsers.nccl_log.rows import Acc, to_int

# --- PyTorch, RAS, nccl-tests ---------------------------------------------------------------
_WORK = (
    r"WorkNCCL\((?:SeqNum=(?P<seq>\d+), )?OpType=(?P<op>\w+)(?:, TensorShape=\[[^\]]*\])?"
    r"(?:, NumelIn=(?P<numelIn>-?\d+), NumelOut=(?P<numelOut>-?\d+))?, Timeout\(ms\)=(?P<timeout>\d+)\)"
)
PT_TIMEOUT = re.compile(r"\[Rank (?P<rank>\d+)\]\s+Watchdog caught collective operation timeout: " + _WORK
                        + r" ran for (?P<ran>\d+) milliseconds")
PT_BLOCKING = re.compile(r"\[Rank (?P<rank>\d+)\] Work " + _WORK + r" timed out in blocking wait")
PT_LAST = re.compile(
    r"\[PG (?:ID )?(?P<pg>\d+)[^\]]*? Rank (?P<rank>\d+)\]\s+(?:Exception \(either an error or timeout\) detected by "
    r"watchdog at work: "
    r"(?P<seq>\d+), last enqueued NCCL work: (?P<enq>\d+), last completed NCCL work: (?P<comp>\d+)"
    r"|Timeout at NCCL work: (?P<seq3>\d+), last enqueued NCCL work: (?P<enq3>\d+), last completed NCCL work: "
    r"(?P<comp3>\d+)"
    r"|failure detected by watchdog at work "
    r"sequence id: (?P<seq2>\d+) PG status: last enqueued work: (?P<enq2>\d+), last completed work: (?P<comp2>\d+))"
)
PT_DESYNC = re.compile(r"\[(?P<lag>\d+)\] finished collective #(?P<fin>\d+), but didn't join collective #(?P<next>\d+)")
#: an NCCL error PyTorch raised: `NCCL error in: <file>:<line>, <what>` (the C++ call site, PyTorch <= 2.3 and the
#: Python exception), or the 2.4+ watchdog's `Process group watchdog thread terminated with exception: NCCL error:
#: <what>, NCCL version ...`
PT_NCCL_ERR = re.compile(r"NCCL error in: (?P<file>\S+):(?P<line>\d+), (?P<what>[^,(]+)"
                         r"|watchdog thread terminated with exception: NCCL error: (?P<what2>[^,(]+)")
PT_DUMP = re.compile(r"(?:Received a dump signal|flight recorder dump signal|[Dd]umping (?:the )?(?:flight "
                     r"recorder|debug info))"
                     r"(?:.*? from (?:this local )?rank (?P<from>\d+))?")
PT_RANK = re.compile(r"\[rank(?P<r>\d+)\]:|\[Rank (?P<R>\d+)\]")
PT_ANY = re.compile(r"ProcessGroupNCCL|WorkNCCL|TORCH_NCCL|c10d|Watchdog caught|FlightRecorder")


def pytorch_line(acc: Acc, line: str, n: int) -> None:
    text = line.strip()
    rm = PT_RANK.search(line)
    rank = int(rm["r"] or rm["R"]) if rm else None
    base = dict(host=None, line=n, rank=rank, message=text[:2000])
    m = PT_TIMEOUT.search(line) or PT_BLOCKING.search(line)
    if m:
        acc.add(
            "collective_timeouts", **base, kind="watchdog_timeout" if "Watchdog" in m.group(0) else "blocking_wait",
            seq=to_int(m["seq"]), op_type=m["op"], numel_in=to_int(m["numelIn"]), numel_out=to_int(m["numelOut"]),
            timeout_ns=int(m["timeout"]) * 1_000_000,
            ran_ns=int(m["ran"]) * 1_000_000 if "ran" in m.groupdict() and m["ran"] else None,
        )
        return
    m = PT_LAST.search(line)
    if m:
        acc.add(
            "collective_timeouts", **base, kind="pg_status", pg=int(m["pg"]),
            seq=int(m["seq"] or m["seq2"] or m["seq3"]),
            last_enqueued=int(m["enq"] or m["enq2"] or m["enq3"]),
            last_completed=int(m["comp"] or m["comp2"] or m["comp3"]),
        )
        return
    m = PT_DESYNC.search(line)
    if m:
        acc.add("collective_timeouts", **base, kind="desync", seq=int(m["next"]), lagging_rank=int(m["lag"]),
                last_completed=int(m["fin"]))
        return
    m = PT_NCCL_ERR.search(line)
    if m:
        acc.add("collective_timeouts", **base, kind="nccl_error")
        return
    if "FlightRecorder is disabled" in line:
        acc.add("nccl_events", host=None, line=n, rank=rank, level="INFO", kind="flight_recorder_disabled",
                message=text)
        return
    m = PT_DUMP.search(line)
    if m:
        # the flight recorder was triggered; `from rank N` names the rank whose watchdog fired first
        acc.add("nccl_events", host=None, line=n, rank=rank, level="INFO", kind="flight_recorder",
                code=to_int(m["from"]), message=text[:500])
