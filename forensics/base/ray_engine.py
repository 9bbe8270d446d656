"""Ray as an engine: one function over many items as Ray tasks, for `forensics triage` (a job per task)
and `forensics analyze` (a unit of files per task).

Ray is optional (``pip install 'trace-forensics[ray]'``); it is imported only when this engine runs.
"""

from __future__ import annotations

import errno
import logging
import os
import socket
import sys
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
#: what Ray says when a cluster with token authentication refused this client (in the cause of its ConnectionError)
_REFUSED = ("InvalidAuthToken", "AuthenticationError", "Unauthenticated")
_TOKEN_HOWTO = ("set RAY_AUTH_MODE=token and RAY_AUTH_TOKEN (or RAY_AUTH_TOKEN_PATH, a file) to the cluster's token; "
                "`ray get-auth-token` on its head node prints it")


def connect(ray: Any, address: str | None) -> None:
    """``ray.init``; a cluster that cannot be reached, refuses the credentials or names no host is the user's
    to fix (UsageError, exit 2, one line), never an internal error."""
    if address and address != "auto":
        _check_reachable(address)
    with _stderr_captured(bool(address)) as said:
        try:
            ray.init(address=address, include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING)
        except Exception as exc:
            problem = _connect_problem(ray, exc, address, said())
            if problem is None:
                raise
            raise UsageError(problem) from None


def _connect_problem(ray: Any, exc: Exception, address: str | None, stderr: str) -> str | None:
    """The one line for a failed ``ray.init`` that is the user's to fix; None for anything else (a bug)."""
    where = address or "a new local session"
    auth_error = getattr(ray.exceptions, "AuthenticationError", ())  # Ray >= 2.52
    if isinstance(exc, auth_error) and "no authentication token was found" in str(exc):
        return f"RAY_AUTH_MODE=token but no Ray token was found to connect to {where}: {_TOKEN_HOWTO}"
    if isinstance(exc, auth_error) or any(word in _chain_text(exc) + stderr for word in _REFUSED):
        return (f"the Ray cluster at {where} refused this client's credentials (its token is missing or wrong: "
                f"{_first_line(exc)}): {_TOKEN_HOWTO}")
    if "timed out during startup" in str(exc):  # a bare Exception from Ray when a raylet did not come up in 30 s
        return (f"Ray could not start {where} ({_first_line(exc)}): the machine may be overloaded; try again, or "
                "use --engine local")
    if isinstance(exc, (ConnectionError, TimeoutError, ValueError, PermissionError)):
        return (f"cannot use the Ray cluster at {where} ({_first_line(exc)}): check --ray-address (host:port of a "
                "running `ray start --head`, or ray://host:10001)")
    return None


def _chain_text(exc: BaseException) -> str:
    """The messages of ``exc`` and its causes (Ray puts the refusal in the cause's text, a formatted traceback)."""
    parts, seen = [], set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        parts.append(str(cur))
        cur = cur.__cause__ or cur.__context__
    return "\n".join(parts)


@contextmanager
def _stderr_captured(on: bool) -> Iterator[Callable[[], str]]:
    """File descriptor 2 into a temporary file while connecting to a cluster (``on``): Ray's C++ client writes a
    warning line per connection retry (20 of them for a refused token) straight to it, and a refusal is
    said as one line. Yields a function that reads what was written."""
    import tempfile  # only here: the Ray engine connecting to a cluster

    if not on:
        yield lambda: ""
        return
    sys.stderr.flush()
    try:
        saved = os.dup(2)
    except OSError:  # no fd 2 (a closed stderr): nothing to keep clean
        yield lambda: ""
        return
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)

        def said() -> str:
            sys.stderr.flush()
            tmp.seek(0)
            return tmp.read(1 << 20).decode("utf-8", "replace")

        try:
            yield said
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)


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
