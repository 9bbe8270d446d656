"""#28 item 2: a node shutdown read from kernel logs (a kernel panic, the kernel's `reboot:` line, systemd-shutdown's
final stage, logind's announcement) is a host fault of node_health, and the root of the communication failure its
peers report. Real public text first (tests/field_excerpts.py names each source), then the wording of the other
forms as the kernel and systemd print them, then the simulator's node_reboot scenario."""

from __future__ import annotations

from pathlib import Path

import pytest
from forensics.parsers.kernel_log.messages import classify

from forensics.pipeline import analyze
from tests import field_excerpts as fx
from tests.conftest import shared_path
from tests.kernlog_helpers import detect, kernel_frame


def _shutdowns(text: str) -> list:
    found = detect({"kernel_events": kernel_frame(text, "logs/dmesg.log")}, "node_health")
    return [f for f in found if f.metrics["category"] == "shutdown"]


@pytest.mark.parametrize("text,last_words", [(fx.SHUTDOWN_SYSTEMD, "Sending SIGKILL to remaining processes..."),
                                             (fx.SHUTDOWN_RESTART, "Restarting system")],
                         ids=["systemd_shutdown", "kernel_restart"])
def test_a_real_reboot_is_one_critical_host_fault(text: str, last_words: str):
    (f,) = _shutdowns(text)
    assert f.severity.value == "critical" and f.kind == "host_fault" and f.title == "The host shut down or rebooted"
    assert f.metrics["last_words"] == last_words and f.metrics["panic"] is False


def test_a_real_kernel_panic_names_its_reason():
    (f,) = _shutdowns(fx.KERNEL_PANIC)
    assert f.severity.value == "critical" and f.metrics["panic"] is True
    assert f.title == "Kernel panic on the host (Fatal exception in interrupt)"


@pytest.mark.parametrize("line,what", [
    # kernel/reboot.c (pr_fmt "reboot: "): kernel_restart, kernel_power_off, kernel_halt
    ("reboot: Restarting system", "kernel"), ("reboot: Power down", "kernel"), ("reboot: System halted", "kernel"),
    # systemd's shutdown.c as PID 1, with and without the ident a journal strips
    ("systemd-shutdown[1]: Syncing filesystems and block devices.", "systemd"),
    ("Sending SIGTERM to remaining processes...", "systemd"),
    # systemd-logind's wall message before the shutdown, and panic()'s line
    ("System is powering down.", "logind"), ("System is rebooting.", "logind"),
    ("Kernel panic - not syncing: Attempted to kill init! exitcode=0x0000000b", "panic"),
])
def test_every_wording_of_the_class(line: str, what: str):
    kind, fields = classify(line)
    assert kind == "shutdown" and fields["what"] == what


@pytest.mark.parametrize("line", ["reboot: Rebooting in 5 seconds..", "Watchdog: system is powering on",
                                  "systemd[1]: Started Update UTMP about System Boot/Shutdown."])
def test_near_misses_are_not_a_shutdown(line: str):
    assert classify(line)[0] != "shutdown"


def test_a_real_reboot_on_the_peer_is_the_root_of_the_real_connection_reset(tmp_path: Path):
    # two real texts in one run folder, joined for this test by host name: the NCCL lines of shared log 19 up to
    # the socket reset on A03-R28-I49-3-9000018 (its channel lines place the peer on A03-R28-I49-2-6000166; the
    # CUDA failure that really followed is left out), and the Raspberry Pi reboot above as the peer's dmesg
    src = shared_path("nccl_logs", "19_v2.10.3_2node_ib_gdrdma_socket_reset_cuda_illegal_memory_access.log")
    lines = src.read_text().splitlines(keepends=True)
    cut = next(i for i, ln in enumerate(lines) if "Cuda failure" in ln)
    run = tmp_path / "run"
    (run / "A03-R28-I49-2-6000166").mkdir(parents=True)
    (run / "nccl.log").write_text("".join(lines[:cut]))
    (run / "A03-R28-I49-2-6000166" / "dmesg.log").write_text(fx.SHUTDOWN_SYSTEMD)
    a = analyze(run, workers=1)
    (down,) = [f for f in a.findings if f.detector == "node_health"]
    (fail,) = [f for f in a.findings if f.detector == "nccl_comm_failure"]
    assert down.hosts == ("A03-R28-I49-2-6000166",) and fail.metrics["peer_host"] == "A03-R28-I49-2-6000166"
    assert fail.caused_by == (down.id,)
    (inc,) = a.incidents
    assert inc.root_cause == down.id


def test_simulated_node_reboot_roots_its_peers_comm_failure(tmp_path: Path):
    from forensics.simulate import simulate

    truth = simulate("node_reboot", tmp_path / "job", params={"layers": "1"}, steps=2)
    (fault,) = [x for x in truth["faults"] if x["kind"] == "node_shutdown"]
    a = analyze(tmp_path / "job", workers=1)
    (down,) = [f for f in a.findings if f.detector == "node_health"]
    (fail,) = [f for f in a.findings if f.detector == "nccl_comm_failure"]
    assert down.hosts == tuple(fault["hosts"]) and set(down.ranks) == set(fault["ranks"])
    assert not [g for g in a.findings if g.detector == "nccl_timeout"]  # NCCL failed at once, no watchdog
    assert fail.metrics["reporting_rank"] not in fault["ranks"] and fail.metrics["peer_host"] == fault["hosts"][0]
    assert fail.caused_by == (down.id,)
    (expected,) = truth["incidents"]
    assert expected["root"]["category"] == "shutdown" and expected["consequences"] == ["nccl_comm_failure"]
    roots = {i.root_cause for i in a.incidents if set(i.findings) & {down.id, fail.id}}
    assert roots == {down.id}


def test_a_shutdown_needs_more_than_one_node_in_the_simulator():
    from forensics.simulate import ScenarioError, build_job

    with pytest.raises(ScenarioError, match="more than"):
        build_job("node_reboot", 8, None, {})
