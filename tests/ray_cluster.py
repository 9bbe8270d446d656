"""A Ray cluster of two nodes started as separate processes, as an operator starts one: `ray start --head` and
`ray start --address HEAD` (a second node on the same machine, its own temporary folder), both with token
authentication (``RAY_AUTH_MODE=token``, the token in a file named by ``RAY_AUTH_TOKEN_PATH``, Ray >= 2.52).

Every port is picked free, each node has 1 CPU and a small object store, so it fits a 2-core CI machine beside
another run. Each ``ray start --block`` is the leader of its own session, and every Ray process it starts (GCS,
raylet, agents, task workers) stays in that session: :meth:`RayCluster.stop` ends the two sessions by their ids,
SIGTERM first (``ray start --block`` then stops its processes in order), SIGKILL for what is left, and raises when
a process survives. Not ``ray stop``: it ends every Ray process on the machine, other users' included.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

START_TIMEOUT_S = 180.0
STOP_TIMEOUT_S = 30.0
START_TRIES = 5
# A raylet aborts when its agents (Python processes) have not reported their ports in time: 15 s for the dashboard
# agent (fixed in Ray 2.60), RAY_agent_register_timeout_ms for the runtime-env agent. At load 20+ on two cores the
# dashboard agent's imports alone took 14 s: hence the retries of a node's start (START_TRIES).
# RAY_prestart_worker_first_driver=0: by default the head's raylet starts a worker as soon as a driver connects, and
# the second node only when its lease is granted; a small job's few short tasks then all ran on the head's warm
# worker before the second node's worker had imported (at load 1.5 here, every run), and "both nodes parsed" failed.
# With no prestart both nodes start their worker for the job at the same point and the tasks are shared.
_SLOW = {"RAY_agent_register_timeout_ms": "120000", "RAY_prestart_worker_first_driver": "0"}
OBJECT_STORE_BYTES = 100 * 2**20  # Ray's minimum is 75 MiB


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def session_pids(sids: set[int]) -> list[int]:
    """Processes whose session id is in ``sids`` (Linux /proc)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
        if fields[0] != "Z" and int(fields[3]) in sids:
            found.append(int(entry))
    return found


def _ray_start(*args: str) -> list[str]:
    """``ray start`` by the interpreter running the tests: its workers import this checkout's forensics."""
    return [sys.executable, "-m", "ray.scripts.scripts", "start", "--block", "--disable-usage-stats",
            "--include-log-monitor", "false",  # one Python process less per node: no driver streams task output
            "--num-cpus", "1", "--object-store-memory", str(OBJECT_STORE_BYTES),
            "--node-manager-port", str(free_port()), "--object-manager-port", str(free_port()),
            "--metrics-export-port", str(free_port()), "--dashboard-agent-listen-port", str(free_port()),
            "--dashboard-agent-grpc-port", str(free_port()), "--runtime-env-agent-port", str(free_port()), *args]


@dataclass
class RayCluster:
    folder: Path  # short: Ray's socket paths below it must stay under 108 bytes
    token_file: Path
    port: int = field(default_factory=free_port)
    nodes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def env(self, **extra: str) -> dict[str, str]:
        """The environment of a client with the cluster's token (``extra`` overrides; "" removes a variable)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
        env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(self.token_file), RAY_USAGE_STATS_ENABLED="0")
        env.update(extra)
        return {k: v for k, v in env.items() if v != ""}

    def start(self) -> None:
        self._node("head", "--head", "--port", str(self.port), "--include-dashboard", "false",
                   "--dashboard-port", str(free_port()))
        _settle({p.pid for p in self.nodes})  # the head's agents still import: the second node's agents need the CPU
        self._node("node2", "--address", self.address)
        self._wait_for_both_nodes()

    def _node(self, name: str, *args: str) -> None:
        """Start a node; again (new ports) when it fails, up to :data:`START_TRIES` times: `ray start` gives a raylet
        30 s to register, which a loaded 2-core machine can miss."""
        for attempt in range(START_TRIES):
            log = self.folder / f"{name}.log"
            with log.open("wb") as fh:
                proc = subprocess.Popen(_ray_start(*args, "--temp-dir", str(self.folder / name)), env=self.env(**_SLOW),
                                        cwd=self.folder, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
            self.nodes.append(proc)
            deadline = time.monotonic() + START_TIMEOUT_S
            while b"Ray runtime started" not in log.read_bytes():
                if proc.poll() is not None or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
            else:
                return
            if attempt == START_TRIES - 1:
                raise RuntimeError(f"`ray start` of {name} did not start: {self.log_tail(name)}")
            self.nodes.remove(proc)
            _end_sessions([proc])

    def _wait_for_both_nodes(self) -> None:
        """Until a client with the token sees two live nodes and 2 CPUs (the second node has registered)."""
        check = ("import logging, sys, time, ray\n"
                 "ray.init(address=sys.argv[1], log_to_driver=False, logging_level=logging.WARNING)\n"
                 "deadline = time.monotonic() + float(sys.argv[2])\n"
                 "while sum(n['Alive'] for n in ray.nodes()) < 2 or ray.cluster_resources().get('CPU') != 2:\n"
                 "    assert time.monotonic() < deadline, (ray.nodes(), ray.cluster_resources())\n"
                 "    time.sleep(0.5)\n")
        res = subprocess.run([sys.executable, "-c", check, self.address, str(START_TIMEOUT_S)], env=self.env(),
                             cwd=self.folder, capture_output=True, text=True, timeout=START_TIMEOUT_S + 60)
        if res.returncode != 0:
            raise RuntimeError(f"the cluster's two nodes did not come up: {res.stderr[-2000:]}")

    def log_tail(self, name: str) -> str:
        return (self.folder / f"{name}.log").read_text(errors="replace")[-2000:]

    def tasks_run(self, name: str, function: str) -> int:
        """How many tasks of ``function`` node ``name`` has run: each worker's log has a line per task it ran."""
        logs = {p.resolve() for p in (self.folder / name).glob("session_*/logs/worker-*.out")}  # session_latest links
        marker = f":task_name:{function}\n"
        return sum(p.read_text(errors="replace").count(marker) for p in logs)

    def stop(self) -> None:
        """End both sessions: SIGTERM, then SIGKILL after :data:`STOP_TIMEOUT_S`; raise if a process is left."""
        _end_sessions(self.nodes)


def _cpu_ticks(sids: set[int]) -> int:
    """CPU clock ticks (user + system) used so far by the live processes of the sessions ``sids``."""
    total = 0
    for pid in session_pids(sids):
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])
    return total


def _settle(sids: set[int], timeout: float = 60.0) -> None:
    """Wait until the sessions ``sids`` use less than a fifth of a core (or ``timeout``)."""
    hz, deadline = os.sysconf("SC_CLK_TCK"), time.monotonic() + timeout
    before = _cpu_ticks(sids)
    while time.monotonic() < deadline:
        time.sleep(1.0)
        now = _cpu_ticks(sids)
        if now - before < hz / 5:
            return
        before = now


def _end_sessions(leaders: list[subprocess.Popen[bytes]]) -> None:
    """End the sessions of ``leaders`` (each `ray start --block`): SIGTERM to the leaders, SIGKILL to every process
    of their sessions still there after :data:`STOP_TIMEOUT_S`; raise if one is left."""
    sids = {p.pid for p in leaders}
    for proc in reversed(leaders):
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while session_pids(sids) and time.monotonic() < deadline:
        time.sleep(0.2)
    for pid in session_pids(sids):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for proc in leaders:
        proc.wait(timeout=10)
    deadline = time.monotonic() + 10
    while (left := session_pids(sids)) and time.monotonic() < deadline:
        time.sleep(0.2)
    if left:
        raise RuntimeError(f"Ray processes left after stopping the cluster: {left}")


def new_cluster() -> RayCluster:
    folder = Path(tempfile.mkdtemp(prefix="frray-", dir="/tmp"))
    token_file = folder / "token"
    token_file.write_text(os.urandom(16).hex())
    return RayCluster(folder, token_file)


def remove(cluster: RayCluster) -> None:
    shutil.rmtree(cluster.folder, ignore_errors=True)
