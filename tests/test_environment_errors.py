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


# Real text from the real libraries (#28 item 9): each error below is raised by the library itself, not written here.

def _raised_by(write) -> BaseException:
    """What ``write()`` raises (it must raise)."""
    try:
        write()
    except BaseException as exc:  # noqa: BLE001 -- the library's own exception is the test data
        return exc
    raise AssertionError("the write did not fail")


def test_a_full_disk_as_the_kernel_and_polars_report_it():
    # /dev/full answers every write with ENOSPC: the kernel's error through CPython (OSError errno 28), and
    # through Polars' Rust writer, which raises a ComputeError (not an OSError) ending in `(os error 28)`
    import polars as pl

    def py_write() -> None:
        with open("/dev/full", "w") as f:
            f.write("x")

    for exc in (_raised_by(py_write), _raised_by(lambda: pl.DataFrame({"a": [1]}).write_parquet("/dev/full"))):
        said = environment_problem(exc)
        assert said is not None and said.startswith("no space left on the device"), repr(exc)


def test_a_missing_extra_as_the_import_system_reports_it(tmp_path: Path):
    # `import ray` fails as it does without the extra (ModuleNotFoundError from the import system, name='ray'):
    # the CLI in a fresh interpreter with ray blocked says which extra to install, exit 2, one line
    import subprocess
    import sys

    code = ("import sys; sys.modules['ray'] = None; sys.argv = ['forensics', 'analyze', sys.argv[1], '--out', "
            "sys.argv[2], '--engine', 'ray', '-q']; from forensics.cli import main; main()")
    res = subprocess.run([sys.executable, "-c", code, str(ROOT / "sample_traces" / "xid79"), str(tmp_path / "out")],
                         capture_output=True, text=True, cwd=ROOT)
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert res.returncode == 2 and len(lines) == 1, res.stderr
    assert "pip install 'trace-forensics[ray]'" in lines[0] and "bug" not in res.stderr


def test_ray_refusals_in_rays_own_words():
    # Ray's AuthenticationError with Ray's own messages (ray/_private/authentication/authentication_constants.py,
    # Ray 2.52+), and the ConnectionError Ray raises for an address it cannot find (ray/_private/services.py,
    # canonicalize_bootstrap_address_or_die); the cluster is reachable, so ray.init is what refuses
    ray = require_ray()
    from ray._private.authentication import authentication_constants as words

    from forensics.base import ray_engine

    found = "Could not find any running Ray instance. Please specify the one to connect to by setting the " \
            "`--address` flag or `RAY_ADDRESS` environment variable."
    cases = [(ray.exceptions.AuthenticationError(words.TOKEN_INVALID_ERROR_MESSAGE), "refused this client's"),
             (ray.exceptions.AuthenticationError(words.TOKEN_AUTH_ENABLED_BUT_NO_TOKEN_FOUND_ERROR_MESSAGE),
              "no Ray token was found"),
             (ConnectionError(found), "cannot use the Ray cluster")]
    for exc, said in cases:
        def init(exc: BaseException = exc, **kwargs: object) -> None:
            raise exc

        with socket.socket() as listener:  # one listener per case: each connect check takes its backlog slot
            listener.bind(("127.0.0.1", 0))
            listener.listen(1)
            fake = SimpleNamespace(init=init, exceptions=ray.exceptions)
            with pytest.raises(UsageError, match=said):
                ray_engine.connect(fake, f"127.0.0.1:{listener.getsockname()[1]}")
