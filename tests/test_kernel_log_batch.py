"""Many small kernel logs (one a node) are parsed as a batch (one frame build, one boot and bus-id pass
for all of them): a batch must give each file exactly what parsing it alone gives, rows, status, message
and host, and never let one file's records number another file's boots or place its times, even when
both files name the same host."""

from __future__ import annotations

import functools
import gzip
import shutil
from pathlib import Path

import polars as pl
import pytest
from forensics.parsers import discovery, kernel_log
from forensics.parsers.bounded_read import LongLines
from forensics.parsers.kernel_log import batch, prefixes
from forensics.parsers.result import ParseContext, ParseResult

from forensics.pipeline import load
from forensics.simulate import simulate
from tests.conftest import shared_path

XID = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus."
# Two logs of one node (a rotated log and the current one): the same host, monotonic stamps that
# overlap and a boot in each. Parsed together as one host they would share boots and boot times.
SAME_HOST = {
    "nodeA/kern.log.1": (
        "Mar  5 10:00:00 nodeA kernel: [   10.000000] Linux version 6.1\n"
        "Mar  5 10:00:02 nodeA kernel: [   12.000000] " + XID + "\n"
        "nodeA: [   13.000000] NVRM: The NVIDIA GPU 0000:c3:00.0\n"
    ),
    "nodeA/kern.log": (
        "nodeA: [   14.000000] NVRM: fallen off the bus and is not responding to commands.\n"
        "nodeA: [   50.000000] " + XID + "\n"
        "nodeA: [    2.000000] kernel: Linux version 6.2\n"
        "nodeA: [    3.000000] " + XID + "\n"
    ),
}
# The styles of tests/test_kernel_log_formats.py, one file each.
STYLES = {
    "kmsg.log": "3,339,5140900,-;" + XID + "\n SUBSYSTEM=pci\n6,340,5140901,-;NET: Registered\n",
    "talos_pdsh.log": (
        "10.20.30.29: kern:     err: [2023-04-02T08:26:23.184031611Z]: " + XID + "\n"
        "node01: [  123.456] " + XID + "\n"
    ),
    "tail_headers.log": "==> a.log <==\n[ 9000.0] " + XID
    + "\n[   10.0] kernel: Linux version 6.1\n==> b.log <==\n[ 5000.0] " + XID + "\n",
    "human.log": "[Feb14 05:03] " + XID + "\n[  +0.500000] " + XID + "\n",
    "ctime.log": "[Sun Feb 23 16:24:18 2025] " + XID + "\n[四 3月 20 21:01:25 2025] " + XID + "\n",
    "journal.log": "Mon 2024-01-08 12:34:57 UTC node3 kernel: " + XID
    + "\nMon 2024-01-08 12:34:58 UTC node3 systemd[1]: Started x\n",
    "wall.log": "Message from syslogd@node7 at Mar  3 11:22:33 ...\n kernel:[  88.0] BUG: soft lockup - CPU#3 stuck "
                "for 22s! [py:42]\n",
    "empty.log": "",
}


def _write(folder: Path) -> list[str]:
    """Fixture files in ``folder``, of every kind a batch meets: styles, one host in two files,
    undecodable bytes (partial), a line over the cap (partial), a broken gzip (fails)."""
    names = []
    for name, text in {**STYLES, **SAME_HOST}.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text, encoding="utf-8")
        names.append(name)
    (folder / "bad_bytes.log.gz").write_bytes(gzip.compress(b"[ 1.0] " + XID.encode()
                                                            + b"\n[ 2.0] bad \xff\xfe bytes\n"))
    (folder / "long_line.log").write_bytes(b"[ 1.0] " + XID.encode() + b"\n[ 2.0] " + b"y" * 500 + b"\n[ 3.0] x\n")
    (folder / "broken.log.gz").write_bytes(gzip.compress(b"[ 1.0] x\n" * 1000)[:40])
    return names + ["bad_bytes.log.gz", "long_line.log", "broken.log.gz"]


@pytest.fixture
def _small_record_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(batch, "LongLines", functools.partial(LongLines, 200))


def _alone(folder: Path, names: list[str]) -> list[ParseResult]:
    return [kernel_log.parse(folder / n, ParseContext(folder, n)) for n in names]


def _same_as_alone(folder: Path, names: list[str]) -> tuple[list[ParseResult], pl.DataFrame]:
    """Parse ``names`` one by one and as one batch; assert the same results and rows; the batch's."""
    alone = _alone(folder, names)
    batch = kernel_log.KernelLogBatch()
    early = {n: batch.add(folder / n, ParseContext(folder, n)) for n in names}
    results, frames = batch.finish()
    late = iter(results)
    for name, one in zip(names, alone):
        got = early[name] or next(late)
        assert (got.status, got.message, got.host, got.rank) == (one.status, one.message, one.host, one.rank), name
    assert next(late, None) is None
    expected = pl.concat([r.frames["kernel_events"] for r in alone if r.frames])
    assert frames["kernel_events"].schema == expected.schema
    assert frames["kernel_events"].equals(expected)
    return alone, frames["kernel_events"]


@pytest.mark.usefixtures("_small_record_cap")
def test_a_batch_of_every_style_gives_each_file_what_parsing_it_alone_gives(tmp_path: Path):
    names = _write(tmp_path)
    alone, df = _same_as_alone(tmp_path, names)
    status = {n: r.status for n, r in zip(names, alone)}
    assert (status["broken.log.gz"], status["bad_bytes.log.gz"], status["long_line.log"]) == ("failed", "partial",
                                                                                              "partial")
    assert "long_line.log line 2" in alone[names.index("long_line.log")].message
    # the two files of nodeA keep their own boots (numbered from 0 in each) and bus ids: the GPU named
    # last in kern.log.1 does not reach the fallen-off-the-bus record that opens kern.log
    for name, boots, buses in (("nodeA/kern.log.1", [1, 1, 1], [None, "0000:3b:00.0", "0000:c3:00.0"]),
                               ("nodeA/kern.log", [0, 0, 1, 1], [None, "0000:3b:00.0", None, "0000:3b:00.0"])):
        rows = df.filter(pl.col("source") == name)
        assert rows["host"].to_list() == ["nodeA"] * len(boots)
        assert rows["boot"].to_list() == boots and rows["pci_bus_id"].to_list() == buses, name
    # kern.log.1's syslog lines give its boot time (10:00:00 - 10 s): its monotonic-only line is
    # placed; kern.log has no wall stamp of its own, so none of its lines is
    placed = df.filter(pl.col("source").str.starts_with("nodeA/")).select("source", "wall_source").rows()
    assert [w for s, w in placed if s == "nodeA/kern.log"] == [None] * 4
    assert [w for s, w in placed if s == "nodeA/kern.log.1"][2] == "boot_time"


def test_a_batch_of_the_real_samples_gives_each_file_what_parsing_it_alone_gives():
    folder = shared_path("dmesg")
    names = sorted(p.name for p in folder.glob("*.log"))
    assert len(names) >= 25
    _same_as_alone(folder, names)


def test_a_batch_of_simulated_kernel_logs_gives_each_file_what_parsing_it_alone_gives(tmp_path: Path):
    out = tmp_path / "sim"
    simulate("xid79", out, ranks=32, steps=1, params={"layers": "2", "rank": "4"})
    names = sorted(p.relative_to(out).as_posix() for p in (out / "kernel").rglob("*") if p.is_file())
    assert len(names) == 4  # one node a style: monotonic, dmesg -T, syslog, ISO
    _, df = _same_as_alone(out, names)
    assert df["source"].unique().len() == 4 and (df["kind"] == "xid").any()


@pytest.mark.usefixtures("_small_record_cap")
def test_a_run_folder_of_kernel_logs_is_parsed_as_one_batch_with_the_same_frames(tmp_path: Path,
                                                                                 monkeypatch: pytest.MonkeyPatch):
    names = _write(tmp_path)
    found = {f.rel_path: f for f in discovery.discover(tmp_path)}
    names = [n for n in names if found[n].kind == "dmesg" and found[n].status is None]
    assert "empty.log" not in names and len(names) == len(STYLES) + len(SAME_HOST) + 2  # an empty file is ignored
    builds: list[int] = []
    real = batch._frame
    monkeypatch.setattr(batch, "_frame", lambda files: builds.append(len(files)) or real(files))
    sources, frames = load(tmp_path, workers=1)
    assert builds == [len(names) - 1]  # one frame build for all but the broken file
    alone = _alone(tmp_path, names)
    for n, one in zip(names, alone):
        row = sources.filter(pl.col("path") == n).row(0, named=True)
        assert (row["status"], row["message"], row["host"]) == (one.status, one.message, one.host), n
    expected = pl.concat([r.frames["kernel_events"] for n, r in sorted(zip(names, alone)) if r.frames])
    assert frames["kernel_events"].equals(expected)


def test_a_failed_batch_build_costs_nothing_but_a_parse_one_by_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    for name in ("a.log", "b.log"):
        shutil.copyfile(shared_path("dmesg", "01_xid79_after_pcie_aer_surprise_down_tesla.log"), tmp_path / name)
    (tmp_path / "b.log").write_text((tmp_path / "b.log").read_text() + "[ 99.0] " + XID + "\n")
    alone = _alone(tmp_path, ["a.log", "b.log"])
    real = batch._frame
    monkeypatch.setattr(batch, "_frame", lambda files: real(files) if len(files) == 1 else 1 / 0)
    sources, frames = load(tmp_path, workers=1)
    assert sources["status"].to_list() == [r.status for r in alone] == ["ok", "ok"]
    assert frames["kernel_events"].equals(pl.concat([r.frames["kernel_events"] for r in alone]))


def test_kernel_logs_have_a_batch_parser():
    assert discovery.BATCH_PARSERS["dmesg"] == "forensics.parsers.kernel_log:KernelLogBatch"


def test_the_first_character_table_never_hides_a_peeler_that_would_match(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch):
    # A line is offered only to the peelers its first character allows (kernel_log.prefixes._PEELER_STARTS, kept by hand
    # beside the patterns): on every style and every real sample, the records must be those that
    # offering each line to all 17 peelers gives.
    names = _write(tmp_path)
    real = shared_path("dmesg")
    paths = [tmp_path / n for n in names] + sorted(real.glob("*.log"))
    texts = [(p.name, p.read_bytes().decode("utf-8", "replace")) for p in paths if not p.name.endswith(".gz")]
    assert len(texts) >= 35

    def frames() -> list[pl.DataFrame]:
        return [kernel_log.parse_text(text, name).frames["kernel_events"] for name, text in texts]

    filtered = frames()
    every = tuple(p for p, _ in prefixes._PEELER_STARTS)
    monkeypatch.setattr(prefixes, "_peelers_for", lambda c: every)
    for (name, _), got, want in zip(texts, filtered, frames()):
        assert got.equals(want), name
