"""The gpu_hw_error detector's settings, apart from the detector so that its parts can name them."""

from __future__ import annotations

from dataclasses import dataclass

from forensics.base.settings import setting
from forensics.base.xid_catalog import POLICIES


@dataclass(frozen=True)
class GpuHwErrorConfig:
    """Xid grading policy and the windows that group hardware events into incidents."""

    policy: str = setting("default", choices=POLICIES,
                          doc="Xid severity policy: default (research consensus), strict (Azure NHC/imbue/DCGM), "
                              "lenient (NVIDIA catalog/gcm)")
    incident_gap_s: float = setting(300.0, unit="s", low=0.0,
                                    doc="events on the same GPU (switch, port, host) closer than this are one incident")
    sympathetic_window_s: float = setting(10.0, unit="s", low=0.0,
                                          doc="Xid 43/45/154, GSP and device lines join the incident they follow within this")
    aer_xid_window_s: float = setting(5.0, unit="s", low=0.0,
                                      doc="a fatal AER and an Xid 79 / fallen-off-the-bus on one host this close are one incident")
    precursor_window_s: float = setting(600.0, unit="s", low=0.0,
                                        doc="corrected AER on a port up to this long before its fatal AER are its precursors")
    untimed_line_window: int = setting(5, unit="lines", low=0,
                                       doc="logs without timestamps: events at most this many lines apart may share an incident")
    corrected_aer_min_count: int = setting(3, unit="errors", low=1,
                                           doc="corrected AER errors on one port within corrected_aer_window_s for a finding")
    corrected_aer_window_s: float = setting(60.0, unit="s", low=0.0, doc="window for corrected_aer_min_count")
    node_level_min_fraction: float = setting(0.5, unit="fraction of GPUs", low=0.0, high=1.0,
                                             doc="one throttle reason on this share of a node's GPUs (and >= 2) is node-level")
    max_evidence: int = setting(20, unit="lines", low=1,
                                doc="evidence lines kept per finding (the total is in evidence_total)")
    fleet_min_hosts: int = setting(3, unit="hosts", low=1,
                                   doc="one GSP/firmware Xid (62, 119, 120) on this many hosts points at software")
