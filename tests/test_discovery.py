from __future__ import annotations

import gzip
import os
from pathlib import Path

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
