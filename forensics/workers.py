"""A small process pool that can always be stopped.

``concurrent.futures.ProcessPoolExecutor`` keeps a manager thread that the interpreter joins at exit.
When a worker is terminated while it writes a result (Ctrl-C in the middle of a parse), that thread
blocks forever on the half-written message and the process never exits. This pool has no threads:
the caller's thread sends each worker one chunk at a time over its own pipe and waits on the pipes
and the process sentinels together, so stopping is terminate, join, kill, and nothing is left to
join. A worker that dies (the OOM killer) costs its chunk, reported through ``lost``, not the run.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from multiprocessing import get_context
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from typing import Any, Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")


def _init_worker() -> None:
    """Workers leave SIGINT to the parent (which ends them) and die with it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: no orphan if the parent is killed
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


def run_pool(
    fn: Callable[[T], R],
    items: Sequence[T],
    n_workers: int,
    lost: Callable[[T, str], R],
    done: Callable[[int, R], None],
    chunk_size: int = 1,
) -> None:
    """Call ``fn`` on every item in ``n_workers`` spawned processes; ``done(index, result)`` as each ends.

    ``fn`` must be a module-level function. ``lost(item, why)`` stands in for the results of a worker
    that died. Any exception in the caller's thread (KeyboardInterrupt, a SIGTERM handler's
    SystemExit) stops every worker before it propagates.
    """
    ctx = get_context("spawn")  # not fork: Polars' thread pool does not survive fork
    indices = list(range(len(items)))
    run = _Run(items, iter([indices[i : i + chunk_size] for i in range(0, len(indices), chunk_size)]), lost, done)
    workers: list[_Worker] = []
    try:
        for _ in range(min(n_workers, len(items))):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_serve, args=(child, fn), daemon=True)
            proc.start()
            child.close()
            workers.append(_Worker(proc, parent))
        _drive(workers, run)
    finally:
        stop(workers)


def _drive(workers: list[_Worker], run: _Run[Any, Any]) -> None:
    for w in workers:
        _feed(w, run)
    while busy := [w for w in workers if w.chunk]:
        ready = wait([w.conn for w in busy] + [w.proc.sentinel for w in busy])
        for w in busy:
            if w.conn in ready:
                _receive(w, run)
            elif w.proc.sentinel in ready:
                _fail_chunk(w, run, f"its worker process died (exit code {w.proc.exitcode})")
    for chunk in run.chunks:  # every worker died: nothing is dropped unannounced
        for i in chunk:
            run.done(i, run.lost(run.items[i], "no worker process was left to run it"))


def _feed(w: _Worker, run: _Run[Any, Any]) -> None:
    w.chunk = next(run.chunks, [])
    if w.chunk:
        w.conn.send([run.items[i] for i in w.chunk])


def _receive(w: _Worker, run: _Run[Any, Any]) -> None:
    try:
        results = w.conn.recv()
    except (EOFError, OSError):
        w.proc.join(1.0)
        _fail_chunk(w, run, f"its worker process died (exit code {w.proc.exitcode})")
        return
    for i, res in zip(w.chunk, results):
        run.done(i, res)
    _feed(w, run)


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
