"""nccl-tests output: the parameters line, the device list, the result table rows (split fragments included), the
average bus bandwidth and the out-of-bounds / correctness tails."""

from __future__ import annotations

import re

from forensics.parsers.nccl_log.envelope import COLL_NAMES
from forensics.parsers.nccl_log.rows import Acc, to_float, to_int

from forensics.base.bus_ids import normalize_bus_id

NT_PARAMS = re.compile(r"^#?\s*nThread \d+ nGpus \d+ minBytes \d+ maxBytes \d+")
NT_DEVICE = re.compile(r"^#?\s*Rank\s+(?P<rank>\d+)(?: Group\s+\d+)? Pid\s+(?P<pid>\d+) on\s+(?P<host>\S+) "
                       r"device\s+(?P<dev>\d+) \[(?P<bus>[^\]]+)\] (?P<name>.+?)\s*$")
NT_ROW = re.compile(
    r"^\s*(?P<size>\d+)\s+(?P<count>\d+)\s+(?P<type>int8|uint8|int32|uint32|int64|uint64|half|float|double|bfloat16|f8e"
    r"4m3|f8e5m2|char|int)"
    r"(?:\s+(?P<redop>sum|prod|max|min|avg|mulsum|none))?(?:\s+(?P<root>-?\d+))?(?P<vals>(?:\s+(?:[\d.]+(?:e[+-]?\d+)?|"
    r"N/A))+)\s*$"
)
NT_TAIL = re.compile(r"^\s*(?P<time>[\d.]+)\s+(?P<algbw>[\d.]+)\s+(?P<busbw>[\d.]+)\s+(?P<wrong>\d+|N/A|[\d.]+e[+-]\d+)"
                     r"(?P<more>(?:\s+(?:[\d.]+(?:e[+-]?\d+)?|N/A)){4})?\s*$")
NT_HEADER = re.compile(r"^#?\s*(?:out-of-place\s+in-place|size\s+count\s+type|\(B\)\s+\(elements\)|Using devices|#|$)")
NT_OOB = re.compile(r"^#?\s*Out of bounds values\s*:\s*(?P<n>\d+) (?P<ok>OK|FAILED)")
NT_AVG = re.compile(r"^#?\s*Avg bus bandwidth\s*:\s*(?P<bw>[\d.]+)(?:\s+(?P<ok>OK|FAILED))?")
NT_FAIL = re.compile(r"(?:(?P<host>[^\s:]+): )?Test NCCL failure (?P<src>\S+) '(?P<msg>[^']*)")
NT_MISC = re.compile(r"^#|Test NCCL failure|Test failure|Collective test concluded|^\s*\.\. .* pid \d+: ")
NT_PERF = re.compile(r"\b(all_reduce|all_gather|reduce_scatter|alltoall|broadcast|reduce|sendrecv|gather|scatter|hyperc"
                     r"ube)_perf\b")
CMD_ENV = re.compile(r"(?:^|[\s#])(?:-x\s+)?(?P<var>NCCL_[A-Z0-9_]+)=(?P<val>[^\s;]+)")


def _seen_tests(acc: Acc) -> bool:
    """A bare number row: nccl-tests when the file has nccl-tests output, else plain text."""
    acc.tail_lines += 1
    return True


def nccl_tests_line(acc: Acc, text: str, n: int) -> bool:
    """One line of nccl-tests output (a result row, a cut row, a device line, a check or a header)."""
    return (_nt_row(acc, text, n) or _nt_tail(acc, text, n) or _nt_device(acc, text, n) or _nt_check(acc, text, n)
            or _nt_misc(acc, text, n))


def _nt_row(acc: Acc, text: str, n: int) -> bool:
    m = NT_ROW.match(text)
    if not m:
        return False
    acc.nt_seen = True
    vals = m["vals"].split()
    for k, placement in enumerate(("out-of-place", "in-place")):
        part = vals[4 * k : 4 * k + 4]
        if len(part) < 3:
            break
        acc.add(
            "nccl_tests", host=None, line=n, size_bytes=int(m["size"]), count=int(m["count"]), type=m["type"],
            redop=m["redop"], root=to_int(m["root"]), placement=placement, time_us=to_float(part[0]),
            algbw_gbps=to_float(part[1]), busbw_gbps=to_float(part[2]),
            wrong=to_float(part[3]) if len(part) > 3 else None, size_inferred=False,
        )
    return True


def _nt_tail(acc: Acc, text: str, n: int) -> bool:
    m = NT_TAIL.match(text)
    if not m:
        return False
    # a row cut by interleaved output: its size is algbw x time (GB/s x us = kB), a power of two
    est = float(m["algbw"]) * float(m["time"]) * 1e3
    if est <= 0:
        return _seen_tests(acc)
    p2 = 1 << max(0, round(est).bit_length() - 1)
    size = min((p2, 2 * p2), key=lambda s: abs(s - est))
    if abs(size - est) / size >= 0.05:
        return _seen_tests(acc)
    # kept only if the file turns out to hold nccl-tests output (decided at the end of the file)
    acc.tails.append(dict(
        source=acc.source, host=None, line=n, size_bytes=size, placement=None, time_us=float(m["time"]),
        algbw_gbps=float(m["algbw"]), busbw_gbps=float(m["busbw"]), wrong=to_float(m["wrong"]), size_inferred=True,
    ))
    return True


def _nt_device(acc: Acc, text: str, n: int) -> bool:
    m = NT_DEVICE.match(text)
    if not m:
        return False
    acc.nt_seen = True
    bus = m["bus"].lower().removeprefix("0x")
    acc.add(
        "nccl_comms", host=m["host"], pid=int(m["pid"]), cuda_dev=int(m["dev"]), rank=int(m["rank"]), line=n,
        origin="nccl-tests", phase="device", gpu_name=m["name"],
        bus_id=normalize_bus_id(bus, bare="bus"),
    )
    return True


def _nt_check(acc: Acc, text: str, n: int) -> bool:
    """The out-of-bounds check count and the average bus bandwidth line."""
    m = NT_OOB.match(text)
    if m:
        acc.add("nccl_events", host=None, line=n, level="ERROR" if m["ok"] == "FAILED" else "INFO",
                kind="nccl_tests_check", code=int(m["n"]), message=text)
        return True
    m = NT_AVG.match(text)
    if m:
        acc.add("nccl_events", host=None, line=n, level="ERROR" if m["ok"] == "FAILED" else "INFO",
                kind="nccl_tests_avg", value=float(m["bw"]), message=text)
        return True
    return False


def _nt_misc(acc: Acc, text: str, n: int) -> bool:
    """Parameter and header lines: they prove nccl-tests output and may name the test and its environment."""
    if NT_PARAMS.match(text) or re.search(r"out-of-place|\(elements\)|Avg bus bandwidth", text):
        acc.nt_seen = True
    if NT_PARAMS.match(text) or NT_HEADER.match(text) or NT_MISC.search(text):
        fail = NT_FAIL.search(text)
        if fail:  # nccl-tests ends on an NCCL error: its text says which (`remote process exited ...`)
            acc.add("nccl_events", host=fail["host"], pid=None, cuda_dev=None, line=n, level="WARN",
                    kind="nccl_tests_failure", file_line=fail["src"], message=fail["msg"].strip(" /"))
        perf = NT_PERF.search(text)
        if perf:
            acc.perf = acc.perf or COLL_NAMES[perf.group(1)]
        for cm in CMD_ENV.finditer(text):
            acc.add("nccl_env", host=None, pid=None, cuda_dev=None, line=n, var=cm["var"], value=cm["val"],
                    origin="command")
        return True
    return False
