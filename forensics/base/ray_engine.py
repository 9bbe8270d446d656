"""Ray as an engine: one function over many items as Ray tasks, for `forensics triage` (a job per task)
and `forensics analyze` (a unit of files per task).

Ray is optional (``pip install 'trace-forensics[ray]'``); it is imported only when this engine runs.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

from forensics.base.errors import UsageError

T = TypeVar("T")
R = TypeVar("R")


@contextmanager
def ray_session(address: str | None = None) -> Iterator[int]:
    """The Ray session already open (tests), else one opened here (``address``: an existing cluster;
    None: a local one) and closed on leaving; yields the cluster's CPU count."""
    try:
        import ray  # optional extra (trace-forensics[ray]): imported only when this engine runs
    except ImportError:
        raise UsageError("--engine ray needs Ray: pip install 'trace-forensics[ray]'") from None
    opened = not ray.is_initialized()
    if opened:
        ray.init(address=address, include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING)
    try:
        yield max(1, int(ray.cluster_resources().get("CPU", 1)))
    finally:
        if opened:
            ray.shutdown()


def ray_map(
    fn: Callable[[T], R],
    items: Sequence[T],
    lost: Callable[[T, str], R],
    done: Callable[[int, R], None],
    address: str | None = None,
    in_flight: int = 0,
) -> None:
    """Call ``fn`` on every item as a Ray task; ``done(index, result)`` as each ends (any order).

    Runs in :func:`ray_session` (``address``). ``lost(item, why)`` stands in for a task Ray could not
    run. At most ``in_flight`` tasks are submitted at once (0: twice the cluster's CPUs), so results do
    not pile up.
    """
    with ray_session(address) as cpus:
        import ray  # optional extra: present once ray_session has opened

        remote = ray.remote(num_cpus=1, max_retries=1)(fn)  # max_retries: a worker lost, not the item's error
        _drive(remote, items, lost, done, in_flight or 2 * cpus)


def _drive(remote: Any, items: Sequence[T], lost: Callable[[T, str], R], done: Callable[[int, R], None],
           limit: int) -> None:
    import ray  # optional extra: present once ray_session has opened

    pending: dict[Any, int] = {}
    todo = iter(range(len(items)))
    try:
        while True:
            while len(pending) < limit and (i := next(todo, None)) is not None:
                pending[remote.remote(items[i])] = i
            if not pending:
                break
            ready, _ = ray.wait(list(pending), num_returns=1)
            for ref in ready:
                i = pending.pop(ref)
                try:
                    res = ray.get(ref)
                except ray.exceptions.RayError as exc:
                    res = lost(items[i], f"its Ray task failed ({type(exc).__name__})")
                done(i, res)
    finally:
        for ref in pending:
            ray.cancel(ref, force=True)
