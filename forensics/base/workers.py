"""A small process pool that can always be stopped.

``concurrent.futures.ProcessPoolExecutor`` keeps a manager thread that the interpreter joins at exit.
When a worker is terminated while it writes a result (Ctrl-C in the middle of a parse), that thread
blocks forever on the half-written message and the process never exits. This pool has no threads:
the caller's thread sends each worker one chunk at a time over its own pipe and waits on the pipes
and the process sentinels together, so stopping is terminate, join, kill, and nothing is left to
join. A worker that dies (the OOM killer) costs its chunk, reported through ``lost``, not the run.

Memory bound (``memory_limit``): while workers are busy the caller's thread wakes every
:data:`POLL_S` seconds and reads each busy worker's resident set from ``/proc/<pid>/statm``; a worker
over the limit is killed, its chunk reported through ``lost`` with :func:`over_limit_reason`, and (with
``respawn``) a fresh worker takes the next chunk. Not ``RLIMIT_AS``/``RLIMIT_DATA``: they bound virtual
memory (a Polars worker reserves several times its resident set), and a refused allocation aborts
Polars' Rust allocator with a backtrace on the terminal instead of telling the parent which job it was.
A spike faster than the poll can still overshoot for up to :data:`POLL_S` seconds.
"""

from __future__ import annotations

import io
import os
import pickle
import signal
import struct
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from multiprocessing import get_context
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from typing import Any, Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")

POLL_S = 0.1
"""How often busy workers' resident memory is read when a limit is set."""
_PAGE = os.sysconf("SC_PAGE_SIZE")


def over_limit_reason(limit: int) -> str:
    """Why a chunk was lost when its worker went over ``limit`` bytes."""
    return f"its worker exceeded the worker memory limit of {limit // 2**20} MB"


def resident_bytes(pid: int) -> int:
    """Resident set of ``pid`` (Linux /proc); 0 when it is gone or unreadable."""
    try:
        with open(f"/proc/{pid}/statm") as fh:
            return int(fh.read().split()[1]) * _PAGE
    except (OSError, IndexError, ValueError):
        return 0


def _init_worker() -> None:
    """Workers leave SIGINT to the parent (which ends them) and die with it; they keep freed memory for reuse."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        import ctypes  # only in a pool worker, on Linux (prctl)

        ctypes.CDLL("libc.so.6").prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: no orphan if the parent is killed
    except (OSError, AttributeError):
        pass
    keep_freed_memory()


MMAP_THRESHOLD = 32 << 20
TRIM_THRESHOLD = 64 << 20


def keep_freed_memory() -> None:
    """glibc's malloc told to serve blocks below MMAP_THRESHOLD from its heap and to keep up to TRIM_THRESHOLD of
    freed heap (M_MMAP_THRESHOLD, M_TRIM_THRESHOLD; the values its own dynamic thresholds end at), in the workers and
    in the process that receives their results. By default a block of a few MB (a dump read, a unit's pickled
    frames, the buffer a result is received into) is a fresh mmap whose pages fault in again each time: 4,096
    Flight Recorder dumps cost 1.3 M page faults in the workers and 0.8 M in the parent (about 6 of 37 CPU-s);
    with these 0.6 M and 0.3 M. No-op without glibc."""
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-3, MMAP_THRESHOLD)
        libc.mallopt(-1, TRIM_THRESHOLD)
    except (OSError, AttributeError):
        pass


def _serve(conn: Connection, fn: Callable[[Any], Any]) -> None:
    _init_worker()
    while True:
        try:
            chunk = conn.recv()
        except EOFError:
            return
        if chunk is None:
            return
        conn.send([fn(item) for item in chunk])


@dataclass
class _Worker:
    proc: BaseProcess
    conn: Connection
    chunk: list[int] = field(default_factory=list)  # indices of the items it is working on


@dataclass
class _Run(Generic[T, R]):
    items: Sequence[T]
    chunks: Iterator[list[int]]
    lost: Callable[[T, str], R]
    done: Callable[[int, R], None]
    start: Callable[[], _Worker]
    memory_limit: int | None = None
    respawn: bool = False


def _starter(fn: Callable[[Any], Any]) -> Callable[[], _Worker]:
    ctx = get_context("spawn")  # not fork: Polars' thread pool does not survive fork

    def start() -> _Worker:
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=_serve, args=(child, fn), daemon=True)
        proc.start()
        child.close()
        return _Worker(proc, parent)

    return start


class Started:
    """Workers for ``fn`` started ahead of their work: their start-up (interpreter, imports) overlaps what the caller
    does meanwhile (discovery). Hand them to :func:`run_pool`, which ends them, or :meth:`stop` them."""

    def __init__(self, fn: Callable[[Any], Any], n_workers: int) -> None:
        self.fn, self.start = fn, _starter(fn)
        self.workers: list[_Worker] = []
        try:
            for _ in range(n_workers):
                self.workers.append(self.start())
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        stop(self.workers)
        self.workers = []


def run_pool(
    fn: Callable[[T], R],
    items: Sequence[T],
    n_workers: int,
    lost: Callable[[T, str], R],
    done: Callable[[int, R], None],
    chunk_size: int = 1,
    memory_limit: int | None = None,
    respawn: bool = False,
    started: Started | None = None,
) -> None:
    """Call ``fn`` on every item in ``n_workers`` spawned processes; ``done(index, result)`` as each ends.

    ``fn`` must be a module-level function. ``lost(item, why)`` stands in for the results of a worker
    that died or went over ``memory_limit`` (resident bytes; None: no limit). With ``respawn`` a new
    worker replaces each one lost, else the others carry on alone. Any exception in the caller's
    thread (KeyboardInterrupt, a SIGTERM handler's SystemExit) stops every worker before it propagates.
    ``started``: workers of ``fn`` already started (:class:`Started`), used first; ended here like the others.
    """
    indices = list(range(len(items)))
    chunks = iter([indices[i : i + chunk_size] for i in range(0, len(indices), chunk_size)])
    run = _Run(items, chunks, lost, done, _starter(fn), memory_limit, respawn)
    want = min(n_workers, len(items))
    ready = started.workers if started is not None and started.fn is fn else []
    workers: list[_Worker] = ready[:want]
    if started is not None:
        stop([w for w in started.workers if w not in workers])  # more than the items need, or for another fn
        started.workers = []
    keep_freed_memory()  # this process receives every result: as in the workers
    try:
        while len(workers) < want:
            workers.append(run.start())
        _drive(workers, run)
    finally:
        stop(workers)


def _drive(workers: list[_Worker], run: _Run[Any, Any]) -> None:
    for w in workers:
        _feed(w, run)
    timeout = POLL_S if run.memory_limit is not None else None
    while busy := [w for w in workers if w.chunk]:
        ready = wait([w.conn for w in busy] + [w.proc.sentinel for w in busy], timeout)
        for w in busy:
            if w.conn in ready:
                if not _receive(w, run):
                    _lose_worker(workers, w, run, f"its worker process died (exit code {w.proc.exitcode})")
            elif w.proc.sentinel in ready:
                _lose_worker(workers, w, run, f"its worker process died (exit code {w.proc.exitcode})")
            elif run.memory_limit is not None and resident_bytes(w.proc.pid or 0) > run.memory_limit:
                _lose_worker(workers, w, run, over_limit_reason(run.memory_limit))
    for chunk in run.chunks:  # every worker died: nothing is dropped unannounced
        for i in chunk:
            run.done(i, run.lost(run.items[i], "no worker process was left to run it"))


def _lose_worker(workers: list[_Worker], w: _Worker, run: _Run[Any, Any], why: str) -> None:
    """End ``w`` (dead or over its limit), report its chunk lost and, with ``respawn``, start its replacement."""
    if w.proc.is_alive():
        w.proc.kill()  # not terminate: a worker over its memory limit must not grow for 2 s more
    stop([w])
    _fail_chunk(w, run, why)
    if run.respawn:
        new = run.start()
        workers[workers.index(w)] = new
        _feed(new, run)


def _feed(w: _Worker, run: _Run[Any, Any]) -> None:
    w.chunk = next(run.chunks, [])
    if w.chunk:
        w.conn.send([run.items[i] for i in w.chunk])


def _receive(w: _Worker, run: _Run[Any, Any]) -> bool:
    """Hand on ``w``'s results and give it the next chunk; False when it died instead of answering."""
    try:
        results = receive(w.conn)
    except (EOFError, OSError):
        w.proc.join(1.0)
        return False
    for i, res in zip(w.chunk, results):
        run.done(i, res)
    _feed(w, run)
    return True


def receive(conn: Connection) -> Any:
    """``conn.recv()`` read straight into one buffer of the message's size. ``Connection.recv`` asks ``os.read`` for
    all that remains (a fresh bytes object of that size for each ~200 KB the socket hands over) and copies each
    piece into a growing BytesIO: 2.5 of the parent's 31 CPU-s for the ~1 GB of frames of 4,096 Flight Recorder
    dumps. The framing is ``multiprocessing.connection``'s: a signed 4-byte big-endian length, or -1 and an
    8-byte one."""
    with io.FileIO(conn.fileno(), "rb", closefd=False) as raw:
        (size,) = struct.unpack("!i", _read_exact(raw, 4, first=True))
        if size == -1:
            (size,) = struct.unpack("!Q", _read_exact(raw, 8))
        return pickle.loads(_read_exact(raw, size))


def _read_exact(raw: io.FileIO, size: int, first: bool = False) -> bytearray:
    buf = bytearray(size)
    view = memoryview(buf)
    got = 0
    while got < size:
        n = raw.readinto(view[got:])
        if not n:
            if first and got == 0:
                raise EOFError
            raise OSError("got end of file during message")
        got += n
    view.release()
    return buf


def _fail_chunk(w: _Worker, run: _Run[Any, Any], why: str) -> None:
    for i in w.chunk:
        run.done(i, run.lost(run.items[i], why))
    w.chunk = []


def stop(workers: list[_Worker]) -> None:
    """End every worker now: terminate, wait up to 2 s, kill the rest, reap all."""
    for w in workers:
        if w.proc.is_alive():
            w.proc.terminate()
    deadline = time.monotonic() + 2.0
    for w in workers:
        w.proc.join(max(0.0, deadline - time.monotonic()))
        if w.proc.is_alive():
            w.proc.kill()
            w.proc.join(1.0)
        w.conn.close()
