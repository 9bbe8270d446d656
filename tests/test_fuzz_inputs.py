"""Hostile input through the real CLI (`forensics analyze` in a subprocess): every class of bad file
the issue lists sits in one run folder beside one good trace, and each must end as its own row of
the sources table with the expected status and reason, no traceback, and bounded memory.

Inputs are scaled down (a 40 MB whitespace bomb, a 24 MB one-line log) with the record cap lowered
to 4 MiB through FORENSICS_MAX_RECORD_BYTES, so the same mechanisms run in seconds.
"""

from __future__ import annotations

import gzip
import json
import os
import random
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

FORENSICS = Path(sys.executable).with_name("forensics")
RSS_LIMIT_KB = 2 * 1024 * 1024  # 2 GB
CAP = 4 << 20


def _trace(rank: int | None, n: int = 50, extra: list | None = None) -> dict:
    events = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 1000, "dur": 10_000}]
    for i in range(n):
        events.append({"ph": "X", "cat": "cpu_op", "name": f"aten::op{i % 5}", "pid": 1, "tid": 1, "ts": 1000 + 100 * i, "dur": 50})
        events.append({"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7, "ts": 1010 + 100 * i, "dur": 60,
                       "args": {"device": 0, "stream": 7, "correlation": i + 1}})
    doc: dict = {"traceEvents": events + (extra or [])}
    if rank is not None:
        doc["distributedInfo"] = {"rank": rank, "world_size": 8}
    return doc


def _dump(doc: dict) -> bytes:
    return json.dumps(doc).encode()


# Runs a command as the only child of a fresh Python process and writes the peak RSS (kB) of that child and its
# workers (RUSAGE_CHILDREN of the fresh process: nothing else it ever reaped) to argv[1].
_MEASURED = (
    "import resource, subprocess, sys\n"
    "code = subprocess.run(sys.argv[2:]).returncode\n"
    "open(sys.argv[1], 'w').write(str(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss))\n"
    "sys.exit(code)\n"
)


def _run(run_dir: Path, out: Path, env: dict | None = None,
         peak_kb: Path | None = None) -> tuple[subprocess.CompletedProcess, dict | None]:
    """The CLI on ``run_dir``; with ``peak_kb``, run in a fresh process that writes the CLI's peak RSS there."""
    cmd = [str(FORENSICS), "analyze", str(run_dir), "--out", str(out), "-q", "--fail-on", "never"]
    proc = subprocess.run(
        [sys.executable, "-c", _MEASURED, str(peak_kb), *cmd] if peak_kb else cmd,
        capture_output=True, text=True, timeout=170, env={**os.environ, "FORENSICS_MAX_RECORD_BYTES": str(CAP), **(env or {})},
    )
    doc = json.loads((out / "findings.json").read_text()) if (out / "findings.json").exists() else None
    return proc, doc


def _sources(doc: dict) -> dict[str, dict]:
    return {s["path"]: s for s in doc["run"]["sources"]}


def _build_hostile_run(run: Path, outside: Path) -> dict[str, tuple[set[str], str]]:
    """Writes the files; returns path -> (allowed statuses, substring the message must hold)."""
    rnd = random.Random(13)
    expect: dict[str, tuple[set[str], str]] = {}
    good = _dump(_trace(0))
    (run / "rank0.pt.trace.json").write_bytes(good)
    expect["rank0.pt.trace.json"] = ({"ok"}, "events")

    # truncated and corrupt gzip
    gz = gzip.compress(_dump(_trace(1, n=3000)), mtime=0)
    (run / "rank1.pt.trace.json.gz").write_bytes(gz[: len(gz) * 2 // 3])
    expect["rank1.pt.trace.json.gz"] = ({"partial"}, "truncated")
    (run / "rank2.pt.trace.json.gz").write_bytes(gz[:10] + bytes(rnd.randrange(256) for _ in range(4000)))
    expect["rank2.pt.trace.json.gz"] = ({"failed"}, "gzip")
    # corrupt JSON: one damaged event in the middle costs that event only
    raw = _dump(_trace(3, n=3000))
    mid = raw.index(b'"name": "gemm"', len(raw) // 2)
    (run / "rank3.pt.trace.json").write_bytes(raw[:mid] + b'"name": gemm!!' + raw[mid + 14 :])
    expect["rank3.pt.trace.json"] = ({"partial"}, "1 damaged event")
    # NaN / Infinity as values; a time of 1e300 rejected per event
    nan = _dump(_trace(4, extra=[{"ph": "X", "cat": "cpu_op", "name": "odd", "pid": 1, "tid": 1, "ts": 2000, "dur": 5,
                                  "args": {"x": "__NAN__", "y": "__INF__"}},
                                 {"ph": "X", "cat": "cpu_op", "name": "far", "pid": 1, "tid": 1, "ts": 1e300, "dur": 5}]))
    (run / "rank4.pt.trace.json").write_bytes(nan.replace(b'"__NAN__"', b"NaN").replace(b'"__INF__"', b"-Infinity"))
    expect["rank4.pt.trace.json"] = ({"ok"}, "1 malformed events skipped")
    # deep nesting
    deep = _dump(_trace(5, extra=[{"ph": "X", "cat": "cpu_op", "name": "deep", "pid": 1, "tid": 1, "ts": 3000, "dur": 1,
                                   "args": {"d": "__DEEP__"}}]))
    (run / "rank5.pt.trace.json").write_bytes(deep.replace(b'"__DEEP__"', b"[" * 5000 + b"]" * 5000))
    expect["rank5.pt.trace.json"] = ({"partial"}, "nesting too deep")
    # CRLF and hostile characters in the name
    crlf = json.dumps(_trace(6), indent=1).replace("\n", "\r\n").encode()
    hostile = "rank6 [bold]x[red] <b>|`$(id)`.pt.trace.json"
    (run / hostile).write_bytes(crlf)
    expect[hostile] = ({"ok"}, "events")
    # a whitespace bomb inside the event array: stops at the record cap
    bomb = gzip.compress(b'{"traceEvents": [' + b" " * (40 << 20), compresslevel=9, mtime=0)
    (run / "rank7.pt.trace.json.gz").write_bytes(bomb)
    expect["rank7.pt.trace.json.gz"] = ({"failed"}, "no event boundary")
    # a huge single line of text (no newline) and binary garbage, non-UTF-8 text
    (run / "huge_line.log").write_bytes(b"x" * (24 << 20))
    expect["huge_line.log"] = ({"ignored"}, "not a recognised")
    (run / "garbage.bin").write_bytes(bytes(rnd.randrange(256) for _ in range(100_000)))
    expect["garbage.bin"] = ({"ignored"}, "binary")
    (run / "latin1.log").write_bytes("node1:12:12 [0] NCCL INFO caf\xe9 d\xe9j\xe0 vu\r\n".encode("latin-1") * 20)
    expect["latin1.log"] = ({"ok", "partial"}, "")
    # truncated and corrupt SQLite
    db_path = run / "profile.sqlite"
    con = sqlite3.connect(db_path)
    con.execute("CREATE TABLE StringIds (id INTEGER, value TEXT)")
    con.executemany("INSERT INTO StringIds VALUES (?, ?)", [(i, "s" * 200) for i in range(2000)])
    con.commit()
    con.close()
    db = db_path.read_bytes()
    db_path.write_bytes(db[: len(db) // 3])
    expect["profile.sqlite"] = ({"failed"}, "")
    (run / "corrupt.sqlite").write_bytes(db[:100] + bytes(rnd.randrange(256) for _ in range(8192)))
    expect["corrupt.sqlite"] = ({"failed"}, "")
    # double gzip, all zero, a duplicate (hard link), an unranked trace beside ranked ones
    (run / "twice.json.gz").write_bytes(gzip.compress(gzip.compress(good)))
    expect["twice.json.gz"] = ({"ignored"}, "compressed twice")
    (run / "zeros.json").write_bytes(bytes(65536))
    expect["zeros.json"] = ({"ignored"}, "only zero bytes")
    os.link(run / "rank0.pt.trace.json", run / "zlink.pt.trace.json")
    expect["zlink.pt.trace.json"] = ({"ignored"}, "duplicate of rank0.pt.trace.json")
    (run / "trace.json").write_bytes(_dump(_trace(None)))
    expect["trace.json"] = ({"ignored"}, "names no rank")
    # symlinks: a loop, an escape out of RUN_DIR; a FIFO
    os.symlink("loop_b", run / "loop_a")
    os.symlink("loop_a", run / "loop_b")
    expect["loop_a"] = ({"ignored"}, "loop")
    (outside / "secret.json").write_bytes(good)
    os.symlink(outside / "secret.json", run / "escape.json")
    expect["escape.json"] = ({"ignored"}, "outside RUN_DIR")
    os.mkfifo(run / "fifo.json")
    expect["fifo.json"] = ({"ignored"}, "not a regular file")
    return expect


def test_hostile_run_folder(tmp_path: Path):
    run, outside = tmp_path / "run", tmp_path / "outside"
    run.mkdir()
    outside.mkdir()
    expect = _build_hostile_run(run, outside)
    proc, doc = _run(run, tmp_path / "out", peak_kb=tmp_path / "peak_kb")
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout, proc.stderr
    assert proc.returncode == 0, proc.stderr
    assert doc is not None
    sources = _sources(doc)
    for path, (statuses, words) in expect.items():
        row = sources.get(path)
        assert row is not None, f"{path} missing from the sources table"
        assert row["status"] in statuses, (path, row)
        assert words in (row.get("message") or ""), (path, row)
        assert "\n" not in (row.get("message") or ""), (path, row)
    assert int((tmp_path / "peak_kb").read_text()) < RSS_LIMIT_KB


@pytest.mark.parametrize(
    "name,content,code,status,words",
    [
        ("rank0.pt.trace.json", b'{"schemaVersion": 1, "traceEvents": [{"ph": "X", "cat": "ker', 2, "failed", "nothing usable"),
        ("trace.json", _dump(_trace(None)), 0, "ok", "analysed as rank 0"),
    ],
    ids=["cut_before_first_event", "lone_unranked_trace"],
)
def test_alone(tmp_path: Path, name: str, content: bytes, code: int, status: str, words: str):
    run = tmp_path / "run"
    run.mkdir()
    (run / name).write_bytes(content)
    proc, doc = _run(run, tmp_path / "out")
    assert proc.returncode == code, proc.stderr
    assert "Traceback" not in proc.stderr
    if doc is not None:
        row = _sources(doc)[name]
        assert row["status"] == status and words in row["message"], row
    else:
        assert code == 2 and len(proc.stderr.strip().splitlines()) <= 2, proc.stderr
