"""Ray as an engine: one function over many items as Ray tasks, for `forensics triage` (a job per task)
and `forensics analyze` (a unit of files per task).

Ray is optional (``pip install 'trace-forensics[ray]'``); it is imported only when this engine runs.
"""

from __future__ import annotations

import errno
import logging
import socket
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
        connect(ray, address)
    try:
        yield max(1, int(ray.cluster_resources().get("CPU", 1)))
    finally:
        if opened:
            ray.shutdown()


#: how long the reachability check of --ray-address waits for a TCP connection (Ray's own init retries for minutes)
CONNECT_TIMEOUT_S = 5.0


def connect(ray: Any, address: str | None) -> None:
    """``ray.init``; a cluster that cannot be reached, refuses the credentials or names no host is the user's
    to fix (UsageError, exit 2), never an internal error."""
    if address and address != "auto":
        _check_reachable(address)
    try:
        ray.init(address=address, include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING)
    except ray.exceptions.AuthenticationError as exc:
        raise UsageError(f"the Ray cluster at {address} refused this client's credentials ({_first_line(exc)}): "
                         "set RAY_AUTH_TOKEN (or RAY_AUTH_MODE) as the cluster expects") from None
    except (ConnectionError, TimeoutError, ValueError, PermissionError) as exc:
        raise UsageError(f"cannot use the Ray cluster at {address or 'a new local session'} ({_first_line(exc)}): "
                         "check --ray-address (host:port of a running `ray start --head`, or "
                         "ray://host:10001)") from None


def _check_reachable(address: str) -> None:
    """A TCP connection to the address's host:port, so that a wrong --ray-address fails in seconds."""
    hostport = address.split("://", 1)[-1].rstrip("/")
    host, sep, port = hostport.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise UsageError(f"--ray-address {address!r} is not HOST:PORT (or ray://HOST:PORT)")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=CONNECT_TIMEOUT_S):
            pass
    except OSError as exc:
        why = "timed out" if isinstance(exc, TimeoutError) else (errno.errorcode.get(exc.errno or 0) or str(exc))
        raise UsageError(f"cannot reach the Ray cluster at {address} ({why}): start it (`ray start --head`) or "
                         "fix --ray-address") from None


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]


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
