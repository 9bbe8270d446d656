"""#28 item 8: the machine's state is a usage error (exit 2, one line saying what to do), never "a bug" (exit 3):
a Ray address that cannot be reached or refuses the credentials, a missing optional extra, a full disk."""

from __future__ import annotations

import errno
import socket
from pathlib import Path
from types import SimpleNamespace

import pytest

from forensics.base.errors import UsageError
from forensics.cli import environment_problem
from tests.conftest import ROOT, require_ray, run_cli


def _closed_port() -> int:
    """A local TCP port nobody listens on (bound, then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_unreachable_ray_address_is_a_usage_error(tmp_path: Path):
    require_ray()
    addr = f"127.0.0.1:{_closed_port()}"
    res = run_cli("analyze", str(ROOT / "sample_traces" / "xid79"), "--out", str(tmp_path / "out"),
                  "--engine", "ray", "--ray-address", addr, "-q")
    assert res.returncode == 2, res.stderr
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and f"cannot reach the Ray cluster at {addr}" in lines[0], res.stderr
    assert "bug" not in res.stderr and "Traceback" not in res.stderr


def test_ray_address_that_is_not_host_port_is_a_usage_error(tmp_path: Path):
    require_ray()
    res = run_cli("triage", str(ROOT / "sample_traces"), "--out", str(tmp_path / "out"),
                  "--engine", "ray", "--ray-address", "no-port-here", "-q")
    assert res.returncode == 2 and "is not HOST:PORT" in res.stderr, res.stderr


class _AuthError(Exception):
    pass


def test_a_cluster_that_refuses_the_token_is_a_usage_error():
    from forensics.base import ray_engine

    with socket.socket() as listener:  # reachable, so the check passes and ray.init is what refuses
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        port = listener.getsockname()[1]

        def init(**kwargs: object) -> None:
            raise _AuthError("Authentication failed: token mismatch")

        fake = SimpleNamespace(init=init, exceptions=SimpleNamespace(AuthenticationError=_AuthError))
        with pytest.raises(UsageError, match="refused this client's credentials.*RAY_AUTH_TOKEN"):
            ray_engine.connect(fake, f"127.0.0.1:{port}")


@pytest.mark.parametrize("exc", [
    OSError(errno.ENOSPC, "No space left on device", "/data/out/findings.json"),
    OSError(errno.EDQUOT, "Disk quota exceeded"),
    OSError("parquet write failed: No space left on device (os error 28)"),
])
def test_a_full_disk_is_said_as_such(exc: OSError):
    said = environment_problem(exc)
    assert said is not None and said.startswith("no space left on the device")


def test_a_missing_optional_extra_names_the_extra():
    said = environment_problem(ModuleNotFoundError("No module named 'ray'", name="ray"))
    assert said == "this needs the optional module ray: pip install 'trace-forensics[ray]'"


@pytest.mark.parametrize("exc", [ValueError("x"), OSError(errno.EACCES, "denied"),
                                 ModuleNotFoundError("No module named 'polars'", name="polars")])
def test_other_errors_stay_bugs(exc: Exception):
    assert environment_problem(exc) is None
