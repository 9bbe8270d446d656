"""forensics.base.outputs: the --out checks and the all-or-nothing writing of a run's output set."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from forensics.base import outputs
from forensics.base.outputs import OutputError, OutputSet, check_out_dir
from tests.conftest import ROOT, folder_files, write_old_outputs


def _new_set(folder: Path, tag: str) -> OutputSet:
    outs = OutputSet(folder)
    for name in ("findings.json", "summary.md", "report.html"):
        outs.add_bytes(name, f"{tag}:{name}".encode())
    return outs


# --- check_out_dir ---------------------------------------------------------------------------------


def test_existing_file_is_refused(tmp_path: Path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(OutputError, match="exists and is not a folder"):
        check_out_dir(tmp_path / "f")


@pytest.mark.parametrize("folder",
                         ["/", "/usr", "/usr/local/share/x", "/etc", "/proc/self", "/sys", "/dev", "/bin", "/boot",
                                    "/lib", "/var", "/home"])
def test_system_folders_are_refused(folder: str):
    with pytest.raises(OutputError, match="system folder"):
        check_out_dir(Path(folder))


def test_folder_inside_the_input_is_refused(tmp_path: Path):
    run = tmp_path / "run"
    (run / "sub").mkdir(parents=True)
    for out in (run, run / "sub", run / "new" / "deeper"):
        with pytest.raises(OutputError, match="inside RUN_DIR"):
            check_out_dir(out, [run])
    check_out_dir(tmp_path / "elsewhere", [run])  # a sibling is fine


def test_a_symlink_into_the_input_is_seen_through(tmp_path: Path):
    run = tmp_path / "run"
    run.mkdir()
    (tmp_path / "link").symlink_to(run)
    with pytest.raises(OutputError, match="inside RUN_DIR"):
        check_out_dir(tmp_path / "link" / "out", [run])


def test_a_path_below_a_file_cannot_be_created(tmp_path: Path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(OutputError, match="is not a folder"):
        check_out_dir(tmp_path / "f" / "out")


def test_unwritable_folder_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    # root ignores permission bits, so the kernel's answer is replaced for this folder only
    real_access = os.access
    monkeypatch.setattr(outputs.os, "access", lambda p, mode: False if Path(p) == tmp_path else real_access(p, mode))
    with pytest.raises(OutputError, match="not writable"):
        check_out_dir(tmp_path / "new" / "out")


# --- OutputSet -------------------------------------------------------------------------------------


def test_commit_replaces_the_whole_set_and_removes_stale_files(tmp_path: Path):
    write_old_outputs(tmp_path)
    (tmp_path / "crash.txt").write_text("old crash")
    outs = _new_set(tmp_path, "new")
    outs.remove("crash.txt")
    outs.commit()
    assert folder_files(tmp_path) == {n: f"new:{n}".encode() for n in ("findings.json", "report.html", "summary.md")}


def test_write_error_leaves_the_previous_set_and_no_temporary_file(tmp_path: Path):
    old = write_old_outputs(tmp_path)
    outs = _new_set(tmp_path, "new")

    def disk_full(path: Path) -> None:
        path.write_bytes(b"partial")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    outs.add("report.html", disk_full)
    with pytest.raises(OutputError, match="No space left on device"):
        outs.commit()
    assert folder_files(tmp_path) == old


def test_interrupt_while_writing_leaves_the_previous_set(tmp_path: Path):
    old = write_old_outputs(tmp_path)
    outs = _new_set(tmp_path, "new")

    def interrupted(path: Path) -> None:
        path.write_bytes(b"half")
        raise KeyboardInterrupt

    outs.add("zzz.json", interrupted)
    with pytest.raises(KeyboardInterrupt):
        outs.commit()
    assert folder_files(tmp_path) == old


def test_dev_full_is_a_write_error(tmp_path: Path):
    """A real ENOSPC from the kernel: the writer copies to /dev/full before writing its file."""
    if not Path("/dev/full").exists():
        pytest.fail("/dev/full missing on this Linux machine")
    old = write_old_outputs(tmp_path)
    outs = _new_set(tmp_path, "new")

    def via_dev_full(path: Path) -> None:
        with open("/dev/full", "wb") as fh:
            fh.write(b"x" * 10)
            fh.flush()

    outs.add("findings.json", via_dev_full)
    with pytest.raises(OutputError, match="No space left"):
        outs.commit()
    assert folder_files(tmp_path) == old


_WRITER = """
import sys
from pathlib import Path
from forensics.base.outputs import OutputSet
folder, tag = Path(sys.argv[1]), sys.argv[2]
for i in range(40):
    outs = OutputSet(folder)
    for name in ("findings.json", "summary.md", "report.html", "extra.bin"):
        outs.add_bytes(name, f"{tag}-{i}".encode() * (2000 if name == "extra.bin" else 1))
    outs.commit()
"""


def test_concurrent_runs_leave_one_runs_set(tmp_path: Path):
    procs = [subprocess.Popen([sys.executable, "-c", _WRITER, str(tmp_path), tag], cwd=ROOT) for tag in ("a", "b")]
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    files = folder_files(tmp_path)
    assert sorted(files) == ["extra.bin", "findings.json", "report.html", "summary.md"]  # no temporary files left
    values = {files[n] for n in ("findings.json", "summary.md", "report.html")}
    assert len(values) == 1, files.keys()  # one run's set, not a mix
    assert files["extra.bin"] == next(iter(values)) * 2000


def test_renames_of_two_runs_never_interleave(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Both runs reach their renames at the same moment and each rename is slow: without the folder lock
    the renames would interleave and the folder would end with a mix."""
    import threading

    real_replace = os.replace

    def slow_replace(src: Path, dst: Path) -> None:
        real_replace(src, dst)
        time.sleep(0.01)

    monkeypatch.setattr(outputs.os, "replace", slow_replace)
    barrier = threading.Barrier(2)
    errors: list[BaseException] = []

    def run(tag: str) -> None:
        outs = OutputSet(tmp_path)
        names = ["findings.json", "summary.md", "report.html", "triage.md"]
        for name in names if tag == "a" else names[::-1]:  # opposite orders: lockstep renames would mix
            outs.add_bytes(name, f"{tag}:{name}".encode())
        outs.add("zz_last.txt", lambda p: (p.write_bytes(f"{tag}:".encode()), barrier.wait()) and None)
        try:
            outs.commit()
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(tag,)) for tag in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    files = folder_files(tmp_path)
    tags = {data.split(b":")[0] for data in files.values()}
    assert len(tags) == 1, files
