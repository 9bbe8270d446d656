"""The process pool: results for every item, in any order, even when a worker dies."""

from __future__ import annotations

import os
import threading
import time
from multiprocessing import get_context

import pytest

from forensics.base.workers import Started, over_limit_reason, receive, resident_bytes, run_pool

MB = 2**20
LIMIT = 400 * MB


def square_or_die(x: int) -> int:
    if x == 7:
        os._exit(9)  # as the OOM killer would end it
    return x * x


def _lost(x: int, why: str) -> int:
    assert "died" in why or "no worker" in why
    return -x


def grow_or_square(x: int) -> int:
    """Item 3 keeps allocating (and touching) memory, well past LIMIT, unless its worker is ended first."""
    if x == 3:
        held = []
        while len(held) < 60:  # 3 GB at most: the test fails, rather than the machine, if nothing stops it
            held.append(b"x" * (50 * MB))
            time.sleep(0.02)
        return -1
    return x * x


def _lost_memory(x: int, why: str) -> int:
    assert why == over_limit_reason(LIMIT) == "its worker exceeded the worker memory limit of 400 MB"
    return -x


def worker_pid(x: int) -> int:
    return os.getpid()


def test_workers_started_ahead_are_used_and_every_one_ended():
    early = Started(worker_pid, 3)
    procs = [w.proc for w in early.workers]
    got: dict[int, int] = {}
    run_pool(worker_pid, list(range(8)), 2, _lost, got.__setitem__)  # another run, its own workers: early kept
    assert len(got) == 8 and not set(got.values()) & {p.pid for p in procs}
    assert all(p.is_alive() for p in procs)
    got.clear()
    run_pool(worker_pid, list(range(8)), 2, _lost, got.__setitem__, started=early)
    assert set(got.values()) <= {p.pid for p in procs[:2]} and len(got) == 8  # two of the three did the work
    assert early.workers == [] and not any(p.is_alive() for p in procs)  # the unused third ended too


def test_workers_started_ahead_and_not_needed_are_stopped():
    early = Started(worker_pid, 2)
    procs = [w.proc for w in early.workers]
    early.stop()
    assert early.workers == [] and not any(p.is_alive() for p in procs)


def test_every_item_gets_a_result():
    got: dict[int, int] = {}
    run_pool(square_or_die, list(range(7)), 2, _lost, got.__setitem__, chunk_size=2)
    assert got == {i: i * i for i in range(7)}


def test_a_dead_worker_costs_its_chunk_only():
    got: dict[int, int] = {}
    run_pool(square_or_die, list(range(20)), 2, _lost, got.__setitem__, chunk_size=3)
    assert sorted(got) == list(range(20))
    chunk_of_7 = {6, 7, 8}  # chunks are [0,1,2], [3,4,5], [6,7,8], ...
    assert {i for i, v in got.items() if v < 0} == chunk_of_7
    assert all(got[i] == i * i for i in got if i not in chunk_of_7)


def test_when_every_worker_dies_the_rest_is_reported_lost():
    got: dict[int, int] = {}
    run_pool(square_or_die, [7, 7, 1, 2, 3], 2, _lost, got.__setitem__, chunk_size=1)
    assert got == {0: -7, 1: -7, 2: -1, 3: -2, 4: -3}


def test_with_respawn_a_dead_worker_is_replaced_and_only_its_item_is_lost():
    got: dict[int, int] = {}
    run_pool(square_or_die, [7, 1, 7, 2], 1, _lost, got.__setitem__, respawn=True)
    assert got == {0: -7, 1: 1, 2: -7, 3: 4}  # one worker: each item after a death ran in its replacement


def test_a_worker_over_the_memory_limit_is_ended_and_replaced():
    got: dict[int, int] = {}
    run_pool(grow_or_square, list(range(6)), 1, _lost_memory, got.__setitem__, memory_limit=LIMIT, respawn=True)
    assert got == {0: 0, 1: 1, 2: 4, 3: -3, 4: 16, 5: 25}  # 3 lost to the limit (its own result would be -1)


def test_resident_bytes_reads_proc():
    ballast = b"y" * (64 * MB)
    assert resident_bytes(os.getpid()) >= len(ballast)
    assert resident_bytes(0) == 0  # no such process: 0, not an error


@pytest.mark.parametrize("obj", [[], {"a": 1}, list(range(300_000)), b"x" * (3 << 20)])
def test_receive_reads_what_send_wrote(obj):
    a, b = get_context("spawn").Pipe()
    sender = threading.Thread(target=a.send, args=(obj,))  # a large message fills the socket before it is read
    sender.start()
    try:
        assert receive(b) == obj
    finally:
        sender.join()
        a.close()
        b.close()


def test_receive_at_end_of_file_and_mid_message():
    a, b = get_context("spawn").Pipe()
    a.close()
    with pytest.raises(EOFError):
        receive(b)
    b.close()
    a, b = get_context("spawn").Pipe()
    os.write(a.fileno(), b"\x00\x00\x01\x00abc")  # a 256-byte message cut after 3 bytes
    a.close()
    with pytest.raises(OSError, match="end of file during message"):
        receive(b)
    b.close()
