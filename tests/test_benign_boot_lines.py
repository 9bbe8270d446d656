"""#28 item 4: NIC and PCIe lines that are normal at boot or on a cable event give no node_health finding; the
documented list (forensics.facts.host_events.BENIGN_NIC_LINES) is tried on real boot logs, and a fault still counts."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from forensics.facts.host_events import BENIGN_NIC_LINES
from tests import field_excerpts as fx
from tests.conftest import ROOT, run_cli, shared_path


def _findings(tmp_path: Path, text: str) -> list[dict]:
    run = tmp_path / "run"
    (run / "kernel").mkdir(parents=True)
    (run / "kernel" / "dmesg.log").write_text(text)
    res = run_cli("analyze", str(run), "--out", str(tmp_path / "out"), "-q", "--fail-on", "never")
    assert res.returncode == 0, res.stderr
    return json.loads((tmp_path / "out" / "findings.json").read_text())["findings"]


@pytest.mark.parametrize("text", [fx.BOOT_REPLUG, fx.BOOT_SYSLOG], ids=["replug_dmesg", "probe_syslog"])
def test_real_boot_logs_of_healthy_nics_give_no_finding(tmp_path: Path, text: str):
    assert _findings(tmp_path, text) == []


def test_every_documented_benign_line_matches_real_text_or_its_cited_form():
    real = fx.BOOT_REPLUG + fx.BOOT_SYSLOG
    seen = [rx for rx, _, _ in BENIGN_NIC_LINES if re.search(rx, real)]
    assert len(seen) >= 2  # the Linux forms are on the real boot logs above
    assert all(src for _, _, src in BENIGN_NIC_LINES)


def test_docs_list_every_benign_line():
    doc = (ROOT / "docs" / "gpu_health.md").read_text()
    for rx, why, _ in BENIGN_NIC_LINES:
        assert why in doc, rx


def test_an_insufficient_power_event_still_warns(tmp_path: Path):
    bad = fx.BOOT_SYSLOG.replace("PCIe slot advertised sufficient power (27W)",
                                 "Detected insufficient power on the PCIe slot (25W)")
    found = _findings(tmp_path, bad)
    assert [(f["detector"], f["severity"]) for f in found] == [("node_health", "warning")], found


def test_shared_mlx5_boot_sample_stays_quiet(tmp_path: Path):
    text = shared_path("dmesg", "32_mlx5_ib_port_link_init_active_journal_hostname.log").read_text()
    assert _findings(tmp_path, text) == []
