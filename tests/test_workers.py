"""The process pool: results for every item, in any order, even when a worker dies."""

from __future__ import annotations

import os

from forensics.workers import run_pool


def square_or_die(x: int) -> int:
    if x == 7:
        os._exit(9)  # as the OOM killer would end it
    return x * x


def _lost(x: int, why: str) -> int:
    assert "died" in why or "no worker" in why
    return -x


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
