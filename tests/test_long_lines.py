"""A line longer than the record cap (FORENSICS_MAX_RECORD_BYTES) in an NCCL log or a kernel log is
skipped without being held in memory, counted, and named (file and line) in a `partial` source;
the rest of the file is parsed as if the line were not there."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from forensics.parsers.bounded_read import LongLines, read_capped, read_lines

LINE_MB = 100
CAP = 1 << 20  # the cap the subprocesses run with: the long line is 100x larger

NCCL_HEAD = (
    b"node1:1234:1234 [0] NCCL INFO Bootstrap : Using eth0:10.0.0.1<0>\n"
    b"node1:1234:1234 [0] NCCL INFO cudaDriverVersion 12040\n"
)
NCCL_TAIL = (
    b"node1:1234:1234 [0] NCCL INFO NCCL_SOCKET_IFNAME set by environment to eth0\n"
    b"node1:1234:1234 [0] NCCL INFO comm 0x5581 rank 0 nranks 8 cudaDev 0 nvmlDev 0 busId 18000 commId 0xabc - Init "
    b"COMPLETE\n"
    b"epoch 1 loss 2.3\n"
)
DMESG_HEAD = b"[ 1234.567890] NVRM: Xid (PCI:0000:3b:00): 79, pid=0, GPU has fallen off the bus.\n"
DMESG_TAIL = (
    b"[ 1240.000000] NVRM: Xid (PCI:0000:3b:00): 48, pid=1234, name=python, An uncorrectable double bit error\n"
    b"[ 1250.000000] NVRM: Xid (PCI:0000:86:00): 13, pid=99, name=python, Graphics Exception\n"
)

_PROBE = """
import json, resource, sys
from pathlib import Path
from forensics.parsers.result import ParseContext
from forensics.parsers import kernel_log, nccl_log

path = Path(sys.argv[2])
parser = {"nccl": nccl_log, "dmesg": kernel_log}[sys.argv[1]]
res = parser.parse(path, ParseContext(run_dir=path.parent, rel_path=path.name))
rows = {name: df.height for name, df in res.frames.items()}
print(json.dumps({"status": res.status, "message": res.message, "rows": rows,
                  "peak_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}))
"""


def _probe(kind: str, path: Path) -> dict:
    env = {**os.environ, "FORENSICS_MAX_RECORD_BYTES": str(CAP)}
    out = subprocess.run([sys.executable, "-c", _PROBE, kind, str(path)], env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def _with_long_line(path: Path, head: bytes, tail: bytes) -> None:
    with open(path, "wb") as fh:
        fh.write(head)
        block = b"x" * (1 << 20)
        for _ in range(LINE_MB):
            fh.write(block)
        fh.write(b"\n")
        fh.write(tail)


@pytest.mark.parametrize("kind,head,tail", [("nccl", NCCL_HEAD, NCCL_TAIL), ("dmesg", DMESG_HEAD, DMESG_TAIL)])
def test_a_100_mb_line_is_skipped_and_named(tmp_path: Path, kind: str, head: bytes, tail: bytes):
    long_file = tmp_path / f"{kind}_long.log"
    _with_long_line(long_file, head, tail)
    # the same file with an empty line in place of the long one: what the rest must parse to
    plain_file = tmp_path / f"{kind}_plain.log"
    plain_file.write_bytes(head + b"\n" + tail)
    long, plain = _probe(kind, long_file), _probe(kind, plain_file)
    long_line_no = head.count(b"\n") + 1

    assert plain["status"] == "ok"
    assert long["status"] == "partial"
    assert f"{long_file.name} line {long_line_no}" in long["message"]
    assert f"longer than {CAP:,} bytes" in long["message"]
    assert long["rows"] == plain["rows"] and sum(plain["rows"].values()) > 0
    grown_mb = (long["peak_kb"] - plain["peak_kb"]) / 1024
    assert grown_mb < LINE_MB / 5, f"peak RSS grew by {grown_mb:.0f} MB for a {LINE_MB} MB line"


def _lines(data: bytes, cap: int) -> tuple[list[tuple[int, bytes]], LongLines]:
    long = LongLines(cap)
    return list(read_lines(io.BufferedReader(io.BytesIO(data), 64), long)), long  # type: ignore[arg-type]


def test_read_lines_keeps_lines_up_to_the_cap_and_numbers_every_line():
    got, long = _lines(b"abcd\nabcde\nabcdef\n\nab", cap=5)
    # "abcd\n" and "abcde\n" hold at most 5 bytes besides the line break; "abcdef" holds 6
    assert got == [(1, b"abcd\n"), (2, b"abcde\n"), (4, b"\n"), (5, b"ab")]
    assert (long.count, long.first, long.lines) == (1, 3, 5)
    assert long.note("f.log") == "f.log line 3 longer than 5 bytes (FORENSICS_MAX_RECORD_BYTES): skipped, not read"


def test_read_lines_counts_every_long_line_and_one_at_the_end_without_a_break():
    got, long = _lines(b"x" * 20 + b"\nok\n" + b"y" * 30, cap=4)
    assert got == [(2, b"ok\n")]
    assert (long.count, long.first, long.lines) == (2, 1, 3)
    assert "line 1 and 1 later line(s)" in (long.note("f") or "")


def test_read_capped_keeps_the_line_numbers_after_a_skipped_line():
    data = b"a\n" + b"z" * 50 + b"\nb\nc"
    long = LongLines(10)
    text = read_capped(io.BufferedReader(io.BytesIO(data), 16), long)  # type: ignore[arg-type]
    assert text.splitlines() == [b"a", b"", b"b", b"c"]
    long = LongLines(10)
    assert read_capped(io.BufferedReader(io.BytesIO(b"a\n" + b"z" * 50), 16),
                       long) == b"a\n\n"  # type: ignore[arg-type]
    assert long.first == 2
