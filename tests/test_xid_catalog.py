"""The Xid catalog data file and its policies."""

from __future__ import annotations

import csv

import pytest

from forensics.base.xid_catalog import CATALOG_PATH, LEVELS, RECOVERY_ACTIONS, lookup, nvlink5_severity

ACTIONS = {"RESTART_APP", "RESET_GPU", "REBOOT_NODE", "DRAIN_NODE", "RMA_CANDIDATE", "INSPECT_PCIE", "INSPECT_LINK",
           "CHECK_COOLING", "CHECK_POWER", "INVESTIGATE_SW", "INVESTIGATE_STORAGE", "NONE"}


def test_every_row_uses_the_vocabulary():
    with CATALOG_PATH.open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == len({r["xid"] for r in rows}) > 50
    for r in rows:
        for p in ("", "strict_", "lenient_"):
            assert r[p + "severity"] in LEVELS, r
            assert set(r[p + "action"].split(";")) <= ACTIONS, r


def test_policies_differ_exactly_on_63_92_109_121():
    with CATALOG_PATH.open(newline="") as fh:
        codes = sorted(int(r["xid"]) for r in csv.DictReader(fh))
    differ = [x for x in codes
              if len({(lookup(x, p).severity, lookup(x, p).action) for p in ("default", "strict", "lenient")}) > 1]
    assert differ == [63, 92, 109, 121]
    assert [lookup(x, "strict").severity for x in differ] == ["HIGH"] * 4
    assert [lookup(x, "lenient").severity for x in differ] == ["INFO", "INFO", "WARNING", "INFO"]


def test_research_consensus_severities():
    # the "usually critical" set of the research notes, and the application-level set
    for x in (48, 62, 64, 79, 95, 119, 120, 140, 143):
        assert lookup(x).severity == "CRITICAL", x
    for x in (13, 31, 43, 45, 68):
        assert lookup(x).severity == "WARNING" and lookup(x).xid_class in ("app", "sympathetic"), x
    assert lookup(79).catalog_immediate == "RESTART_BM" and "REBOOT_NODE" in lookup(79).action


def test_unknown_xid_and_bad_policy():
    u = lookup(999)
    assert not u.known and u.severity == "WARNING" and "unknown Xid 999" in u.description
    with pytest.raises(ValueError):
        lookup(79, "paranoid")


def test_nvlink5_and_recovery_action_rules():
    assert nvlink5_severity("NETIR_BER_EVENT", False, 3, 0)[0] == "INFO"
    assert nvlink5_severity("RLW_SRC_TRACK", False, 12, 0)[2] == "XID_154_EVAL"
    assert nvlink5_severity("NETIR", True, -1, 0)[0] == "HIGH"
    assert nvlink5_severity("NETIR_LINK_EVT", True, 8, 4)[0] == "CRITICAL"
    assert nvlink5_severity("NETIR_LINK_EVT", True, 8, 0x25)[0] == "HIGH"  # the peer is the source
    assert nvlink5_severity("NETIR_LINK_DOWN", True, 17, 4)[:2] == ("CRITICAL", "RESET_GPU;INSPECT_LINK")
    assert nvlink5_severity("NETIR_LINK_DOWN", False, 17, 4)[0] == "WARNING"
    assert nvlink5_severity("MSE_WATCHDOG", True, -1, None)[:2] == ("HIGH", "RESET_GPU")
    assert RECOVERY_ACTIONS["Drain P2P"][0] == "HIGH" and RECOVERY_ACTIONS["None"][0] == "INFO"
