from __future__ import annotations

import gzip
import os
from pathlib import Path

import pytest
from forensics.parsers.discovery import classify, discover_and_parse, walk

KINETO_HEAD = b'{\n  "schemaVersion": 1,\n  "traceEvents": [\n  {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 1, "dur": 2}\n]}'
NCCL_LINES = b"epoch 1 loss 2.3\nnode1:1234:1234 [0] NCCL INFO Bootstrap : Using eth0:10.0.0.1<0>\nmore output\n"
DMESG_LINES = b"[ 1234.567890] NVRM: Xid (PCI:0000:3b:00): 79, pid=0, GPU has fallen off the bus.\n"


def _write(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def test_kinds_are_decided_by_content_not_name(tmp_path: Path):
    cases = {
        "a/noext": (KINETO_HEAD, "kineto"),
        "b/trace.txt.gz": (gzip.compress(KINETO_HEAD), "kineto"),
        "c/rank0.out": (NCCL_LINES, "nccl_log"),
        "d/messages.json": (DMESG_LINES, "dmesg"),
        "e/data.db": (b"SQLite format 3\x00" + b"\x00" * 100, "nsys"),
    }
    for rel, (data, kind) in cases.items():
        f = classify(_write(tmp_path / rel, data), rel)
        assert f.kind == kind, rel
        assert f.status is None, rel


def test_unrecognised_files_are_ignored_with_a_reason(tmp_path: Path):
    f = classify(_write(tmp_path / "notes.txt", b"just text\n"), "notes.txt")
    assert (f.kind, f.status) == ("unknown", "ignored")
    f = classify(_write(tmp_path / "blob.bin", b"\x00\x01\x02" * 100), "blob.bin")
    assert (f.kind, f.status) == ("unknown", "ignored") and "binary" in f.message
    f = classify(_write(tmp_path / "r.nsys-rep", b"\x00" * 10), "r.nsys-rep")
    assert f.status == "ignored" and "nsys export" in f.message


def test_empty_and_corrupt_traces_fail_with_one_line_reason(tmp_path: Path):
    f = classify(_write(tmp_path / "rank0.pt.trace.json", b""), "rank0.pt.trace.json")
    assert (f.kind, f.status, f.message) == ("kineto", "failed", "empty file")
    bad = gzip.compress(KINETO_HEAD * 50)
    bad = bad[:10] + bytes(b ^ 0xFF for b in bad[10:40]) + bad[40:]
    f = classify(_write(tmp_path / "rank1.json.gz", bad), "rank1.json.gz")
    assert (f.kind, f.status) == ("kineto", "failed")
    assert "gzip" in f.message and "\n" not in f.message


def test_symlinks_out_of_run_dir_are_not_followed(tmp_path: Path):
    outside = _write(tmp_path / "outside" / "secret.log", NCCL_LINES)
    run = tmp_path / "run"
    _write(run / "rank0.log", NCCL_LINES)
    os.symlink(outside, run / "link.log")
    os.symlink(outside.parent, run / "linkdir")
    os.symlink(run / "rank0.log", run / "inside_link.log")
    found = {rel: reason for _, rel, reason in walk(run)}
    assert found["link.log"] == "symlink to a file outside RUN_DIR: not followed"
    assert found["linkdir"] == "symlinked directory: not followed"
    assert found["inside_link.log"] is None
    assert found["rank0.log"] is None


def test_every_file_becomes_a_source_row(tmp_path: Path):
    _write(tmp_path / "x.txt", b"hello\n")
    _write(tmp_path / "sub" / "y.log", NCCL_LINES)
    results = discover_and_parse(tmp_path, workers=1)
    assert [r.file.rel_path for r in results] == ["sub/y.log", "x.txt"]
    assert all(r.result.status in ("ok", "partial", "failed", "ignored") for r in results)


def test_json_that_is_not_a_trace_is_ignored_unless_named_like_one(tmp_path: Path):
    truth = classify(_write(tmp_path / "truth.json", b'{\n  "schema": "forensics-sim-truth/1",\n  "x": 1}'), "truth.json")
    assert (truth.kind, truth.status) == ("unknown", "ignored") and "ground truth" in truth.message
    report = classify(
        _write(tmp_path / "out/findings.json", b'{"schema_version": 1, "tool": {"name": "forensics", "version": "0"}}'),
        "out/findings.json",
    )
    assert (report.kind, report.status) == ("unknown", "ignored") and "report" in report.message
    config = classify(_write(tmp_path / "config.json", b'{"hidden_size": 4096}'), "config.json")
    assert (config.kind, config.status, config.message) == ("unknown", "ignored", "JSON, but not a trace")
    # Named like a rank's trace but of the wrong shape: the trace parser reports why it failed.
    broken = classify(_write(tmp_path / "rank3.json", b'{"hidden_size": 4096}'), "rank3.json")
    assert (broken.kind, broken.status) == ("kineto", None)


def _ranked(rank: int) -> bytes:
    return KINETO_HEAD.replace(b'"schemaVersion": 1,', b'"schemaVersion": 1, "distributedInfo": {"rank": %d},' % rank)


def test_run_dir_may_be_a_single_file(tmp_path: Path):
    from forensics.pipeline import load

    path = _write(tmp_path / "job" / "rank3.pt.trace.json", _ranked(3))
    sources, frames = load(path)
    assert sources.select("path", "status", "rank").rows() == [("rank3.pt.trace.json", "ok", 3)]
    assert frames["kernels"].height == 1


def test_same_file_under_several_paths_is_analysed_once(tmp_path: Path):
    run = tmp_path / "run"
    _write(run / "a" / "rank0.json", _ranked(0))
    os.link(run / "a" / "rank0.json", run / "b_hardlink.json")
    os.symlink("a/rank0.json", run / "0_symlink.json")  # sorts first, but the regular file wins
    _write(run / "c" / "copy.json", _ranked(0))
    _write(run / "c" / "other.json", _ranked(1))  # same size, other content: not a duplicate
    by_path = {r.file.rel_path: r for r in discover_and_parse(run)}
    assert by_path["a/rank0.json"].result.status == "ok"
    assert by_path["c/other.json"].result.status == "ok"
    for dup in ("b_hardlink.json", "0_symlink.json", "c/copy.json"):
        res = by_path[dup].result
        assert res.status == "ignored" and res.message.startswith("duplicate of a/rank0.json"), (dup, res.message)
        assert by_path[dup].file.kind == "kineto"


def test_file_vanished_between_discovery_and_parsing_is_a_failed_source(tmp_path: Path):
    from forensics.parsers.discovery import discover, parse_one

    path = _write(tmp_path / "rank0.json", _ranked(0))
    (f,) = discover(tmp_path)
    path.unlink()
    res = parse_one(f, tmp_path).result
    assert res.status == "failed" and "vanished" in res.message


def test_special_files(tmp_path: Path):
    _write(tmp_path / "zeros.json", bytes(10_000))
    _write(tmp_path / "twice.json.gz", gzip.compress(gzip.compress(KINETO_HEAD)))
    os.mkfifo(tmp_path / "pipe")
    os.symlink("loop2", tmp_path / "loop1")
    os.symlink("loop1", tmp_path / "loop2")
    got = {r.file.rel_path: (r.result.status, r.result.message) for r in discover_and_parse(tmp_path)}
    assert got["zeros.json"][0] == "ignored" and "only zero bytes" in got["zeros.json"][1]
    assert got["twice.json.gz"][0] == "ignored" and "compressed twice" in got["twice.json.gz"][1]
    assert got["pipe"][0] == "ignored" and "not a regular file" in got["pipe"][1]
    assert got["loop1"][0] == "ignored" and "loop" in got["loop1"][1]


def test_unranked_trace_is_rank_0_alone_and_ignored_beside_ranked_ones(tmp_path: Path):
    lone = tmp_path / "lone"
    _write(lone / "trace.json", KINETO_HEAD)
    (item,) = discover_and_parse(lone)
    assert (item.result.status, item.result.rank) == ("ok", 0)
    assert "analysed as rank 0" in item.result.message
    assert item.result.frames["kernels"]["rank"].to_list() == [0]
    both = tmp_path / "both"
    _write(both / "trace.json", KINETO_HEAD)
    _write(both / "x.json", _ranked(0))
    got = {r.file.rel_path: r.result for r in discover_and_parse(both)}
    assert got["x.json"].status == "ok" and got["x.json"].rank == 0
    assert got["trace.json"].status == "ignored" and "names no rank" in got["trace.json"].message
    assert not got["trace.json"].frames


# Long lines the sniffers once took seconds on (the old NCCL-line regex: 8.6 s on 100 KB of compact JSON).
# benchmarks/sniff_bench.py times them; the test holds what they are classified as.
LONG_LINES = {
    "metrics.json": b'{"m":[' + b'"a:1:2 [0",' * 95_000 + b'"x"]}',
    "long.log": b"x" * (1 << 20),
    "tags.log": b"a] NCCL INFO" * 90_000,
    "equals.txt": b"=" * (1 << 20),
    "sram.txt": b"SRAM Correctable" + b" " * (1 << 20),
}


def test_long_lines_are_classified_as_what_they_are(tmp_path: Path):
    kinds = {name: classify(_write(tmp_path / name, data), name).kind for name, data in LONG_LINES.items()}
    assert kinds == {name: "unknown" for name in LONG_LINES}


_DRIVER = """
import signal, sys, time
from pathlib import Path
from forensics.parsers import kineto
from forensics.parsers.discovery import discover_and_parse

# Top level, so the spawned workers (which import this script) run it too: each trace takes 50 ms,
# and parsing lasts well past the signal however fast the machine (small traces are batched).
_add = kineto.KinetoBatch.add
def _slow_add(self, path, ctx):
    Path(sys.argv[2]).touch()  # a worker is parsing: the test signals now
    time.sleep(0.05)
    return _add(self, path, ctx)
kineto.KinetoBatch.add = _slow_add

def _term(*_):
    raise SystemExit(143)

if __name__ == "__main__":
    signal.signal(signal.SIGTERM, _term)
    try:
        discover_and_parse(Path(sys.argv[1]), workers=2)
    except KeyboardInterrupt:
        sys.exit(130)
    sys.exit(0)
"""


def _children(pid: int) -> list[int]:
    import subprocess

    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True).stdout
    return [int(x) for x in out.split()]


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state != "Z"



@pytest.mark.parametrize("sig,code", [("SIGINT", 130), ("SIGTERM", 143)])
def test_interrupt_mid_parse_ends_every_worker(tmp_path: Path, sig: str, code: int):
    """SIGINT / SIGTERM while the pool parses: the call returns promptly with the interrupt, and no
    worker process is left behind."""
    import signal
    import subprocess
    import sys
    import time

    run = tmp_path / "run"
    for rank in range(400):  # many files: the pool is used, and parsing lasts well past the signal
        _write(run / f"rank{rank}.json", _ranked(rank))
    script = tmp_path / "driver.py"
    script.write_text(_DRIVER)
    parsing = tmp_path / "parsing"
    proc = subprocess.Popen([sys.executable, str(script), str(run), str(parsing)])
    deadline = time.monotonic() + 120  # hang guards, not measurements
    workers: list[int] = []
    while time.monotonic() < deadline and (len(workers) < 2 or not parsing.exists()) and proc.poll() is None:
        time.sleep(0.05)
        workers = [p for p in _children(proc.pid) if _alive(p)]
    assert proc.poll() is None and len(workers) >= 2 and parsing.exists(), "the pool never started parsing"
    # mid-parse: a worker has started on the 400 traces of 50 ms each, so parsing lasts well past the signal
    proc.send_signal(getattr(signal, sig))
    assert proc.wait(timeout=60) == code
    end = time.monotonic() + 60
    while any(_alive(p) for p in workers) and time.monotonic() < end:
        time.sleep(0.1)
    assert not [p for p in workers if _alive(p)], "worker processes left behind"
