"""Where reports go and how they are written, so that nobody ever sees a torn set of outputs.

``check_out_dir`` refuses an output folder before any parsing starts (a file, a system folder, a
folder that cannot be written, a folder inside the input). ``OutputSet`` writes a run's files.

The guarantee, stated honestly:

* Every file is first written completely (and fsync'ed) to a hidden temporary file in the folder
  it belongs to, then moved over the old one with ``os.replace``, which is atomic for that file.
* All temporary files of a run are written before the first rename. A failure or an interrupt
  while writing them (full disk, read-only folder, Ctrl-C) removes them and leaves the previous
  outputs untouched.
* The renames of one run happen in one short burst while SIGINT and SIGTERM are held back and an
  exclusive ``flock`` on the output folder is held. Two runs into one folder therefore never
  interleave their renames: the folder ends with the whole set of one run or the other, and an
  interrupt lands before or after the burst, never inside it.
* Not covered: a SIGKILL, a power loss or a crash of the machine inside the burst (milliseconds)
  can leave some files renamed and others not; a reader listing the folder during the burst can
  see a mix; ``flock`` is advisory and may not hold across NFS clients. Hidden ``.*.tmp`` files of
  a killed run may stay behind; they are never read.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import signal
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from forensics.base.errors import ForensicsError

# Folders whose whole tree belongs to the operating system.
SYSTEM_TREES = tuple(
    Path(p) for p in ("/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/libx32", "/proc", "/sbin", "/sys",
                      "/usr")
)
# Folders that are fine to write below but never to fill with report files themselves.
SYSTEM_EXACT = tuple(Path(p) for p in ("/", "/home", "/media", "/mnt", "/opt", "/run", "/srv", "/var"))

Writer = Callable[[Path], None]


class OutputError(ForensicsError):
    """The output folder is unusable or a write failed (exit 2; previous outputs stay intact)."""


def _nearest_existing(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def check_out_dir(out_dir: Path, inputs: Sequence[Path] = ()) -> Path:
    """Refuse an output folder that cannot or must not receive reports; return it resolved.

    Only looks at the file system (no write), so it costs microseconds and runs before parsing.
    """
    if out_dir.exists() and not out_dir.is_dir():
        raise OutputError(f"--out {out_dir} exists and is not a folder")
    real = out_dir.resolve()
    if real in SYSTEM_EXACT or any(real == t or real.is_relative_to(t) for t in SYSTEM_TREES):
        raise OutputError(f"--out {out_dir} is a system folder ({real}); choose a folder of your own")
    for inp in inputs:
        inp_real = inp.resolve()
        if inp_real.is_dir() and real.is_relative_to(inp_real):
            raise OutputError(f"--out {out_dir} is inside RUN_DIR {inp}; forensics never writes into the run folder")
    base = _nearest_existing(real)
    if not base.is_dir():
        raise OutputError(f"--out {out_dir} cannot be created: {base} is not a folder")
    if not os.access(base, os.W_OK | os.X_OK):
        raise OutputError(f"--out {out_dir} is not writable ({base})")
    return real


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _describe(exc: OSError) -> str:
    return exc.strerror or str(exc)


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """Hold SIGINT/SIGTERM back for a moment: they are delivered (and raise) right after."""
    sigs = {signal.SIGINT, signal.SIGTERM}
    old = signal.pthread_sigmask(signal.SIG_BLOCK, sigs)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


@contextlib.contextmanager
def _folder_locked(folder: Path) -> Iterator[None]:
    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


class OutputSet:
    """The files one run writes into one folder, committed together (see the module docstring)."""

    def __init__(self, out_dir: Path) -> None:
        self.out_dir = out_dir
        self._writers: list[tuple[str, Writer]] = []
        self._stale: list[str] = []

    def add(self, rel: str, write: Writer) -> None:
        """``write(path)`` creates the file at ``path`` (a temporary name; it is renamed later)."""
        self._writers.append((rel, write))

    def add_bytes(self, rel: str, data: bytes) -> None:
        def write(path: Path) -> None:
            path.write_bytes(data)

        self.add(rel, write)

    def add_text(self, rel: str, text: str) -> None:
        self.add_bytes(rel, text.encode("utf-8"))

    def remove(self, rel: str) -> None:
        """A file left by an earlier run that would mislead next to this run's set (removed on commit)."""
        self._stale.append(rel)

    @property
    def names(self) -> list[str]:
        return [rel for rel, _ in self._writers]

    def commit(self) -> None:
        """Write every file to a temporary name, then rename them all; OutputError on any failure."""
        token = f"{os.getpid()}.{secrets.token_hex(4)}"
        moves: list[tuple[Path, Path]] = []
        target = self.out_dir
        try:
            self.out_dir.mkdir(parents=True, exist_ok=True)
            for rel, write in self._writers:
                target = self.out_dir / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                tmp = target.parent / f".{target.name}.{token}.tmp"
                moves.append((tmp, target))
                write(tmp)
                _fsync_file(tmp)
            target = self.out_dir
            with _signals_held(), _folder_locked(self.out_dir):
                for tmp, target in moves:
                    os.replace(tmp, target)
                for rel in self._stale:
                    if rel not in self.names:
                        (self.out_dir / rel).unlink(missing_ok=True)
        except OSError as exc:
            raise OutputError(f"cannot write {target}: {_describe(exc)}; earlier outputs left as they were") from None
        finally:
            for tmp, _ in moves:
                with contextlib.suppress(OSError):
                    tmp.unlink(missing_ok=True)


def write_parquet(df: Any, path: Path, metadata: dict[str, str] | None = None) -> None:
    """``df`` (a Polars frame) as Parquet at ``path``, ``metadata`` in the file's key-value metadata; Polars' own
    I/O error (e.g. "No space left on device (os error 28)") is raised as the OSError an :class:`OutputSet`
    writer reports."""
    import polars as pl  # here: `forensics --version` and the output checks need no Polars

    try:
        df.write_parquet(path, metadata=metadata)
    except pl.exceptions.ComputeError as exc:
        raise OSError(str(exc).splitlines()[0] if str(exc) else "write failed") from exc


def write_one(path: Path, data: bytes) -> None:
    """One file, atomically (temporary file in the same folder, then rename)."""
    outs = OutputSet(path.parent)
    outs.add_bytes(path.name, data)
    outs.commit()
