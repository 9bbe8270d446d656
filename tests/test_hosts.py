from __future__ import annotations

from forensics.base.hosts import short_host


def test_domain_is_dropped_addresses_kept_and_empty_is_none():
    assert short_host("node7.cluster.example.org") == "node7"
    assert short_host(' "ault43.cscs.ch" ') == "ault43"
    assert short_host("hgx-5200") == "hgx-5200"
    assert short_host("10.0.3.17") == "10.0.3.17"
    assert short_host("fe80::1") == "fe80::1"
    assert short_host("") is None and short_host(None) is None and short_host("  ") is None
