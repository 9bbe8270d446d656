"""The product of detectors: findings and skip records, and their JSON form.

The JSON form follows ``forensics/schema/findings.schema.json`` (a vendored copy of the project's
contract). A finding's ``id`` is a fingerprint of what it is about, so the same input gives the same
id on every run and across batch runs.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from enum import Enum
from typing import Any


class Severity(str, Enum):
    CRITICAL = "critical"
    WARNING = "warning"
    INFO = "info"

    @property
    def rank(self) -> int:
        """Higher is worse; used for sorting and for ``--fail-on``."""
        return {"info": 1, "warning": 2, "critical": 3}[self.value]


MetricValue = float | int | str | bool | None


@dataclass(frozen=True)
class Finding:
    detector: str
    severity: Severity
    title: str
    summary: str
    remediation: str
    ranks: tuple[int, ...] = ()
    hosts: tuple[str, ...] = ()
    gpus: tuple[str, ...] = ()
    metrics: dict[str, MetricValue] = field(default_factory=dict)
    evidence: tuple[dict[str, Any], ...] = ()
    gpu_seconds_lost: float | None = None
    fraction_of_step: float | None = None
    # What makes two findings "the same" beyond detector, ranks, hosts and gpus
    # (e.g. the process group or the Xid incident); part of the id.
    key: str = ""
    confidence: str = "medium"
    related: tuple[str, ...] = ()
    # Set by forensics.incidents.correlate, never by detectors; not part of the id.
    incident: str | None = None
    caused_by: tuple[str, ...] = ()

    @property
    def id(self) -> str:
        parts = [
            self.detector,
            self.key,
            ",".join(map(str, sorted(self.ranks))),
            ",".join(sorted(self.hosts)),
            ",".join(sorted(self.gpus)),
        ]
        digest = hashlib.sha1("|".join(parts).encode()).hexdigest()[:12]
        return f"{self.detector}-{digest}"

    @property
    def scope(self) -> str:
        """Who caused it, in words ("ranks 4; hosts n1; GPUs 0000:9a:00.0"); empty when nobody is named."""
        parts = []
        if self.ranks:
            parts.append("ranks " + ", ".join(map(str, sorted(self.ranks))))
        if self.hosts:
            parts.append("hosts " + ", ".join(sorted(self.hosts)))
        if self.gpus:
            parts.append("GPUs " + ", ".join(sorted(self.gpus)))
        return "; ".join(parts)

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "detector": self.detector,
            "severity": self.severity.value,
            "confidence": self.confidence,
            "title": self.title,
            "summary": self.summary,
            "ranks": sorted(self.ranks),
            "hosts": sorted(self.hosts),
            "gpus": sorted(self.gpus),
            "metrics": {k: _json_number(v) for k, v in self.metrics.items()},
            "evidence": [dict(e) for e in self.evidence],
            "remediation": self.remediation,
            "impact": {
                "gpu_seconds_lost": _json_number(self.gpu_seconds_lost),
                "fraction_of_step": _json_number(self.fraction_of_step),
            },
            "related": list(self.related),
            "incident": self.incident,
            "caused_by": list(self.caused_by),
        }


def _json_number(v: MetricValue) -> MetricValue:
    # NaN/inf are not JSON; a metric we could not compute is null.
    if isinstance(v, float) and (v != v or v in (float("inf"), float("-inf"))):
        return None
    return v


@dataclass(frozen=True)
class Skipped:
    detector: str
    reason: str

    def to_json(self) -> dict[str, str]:
        return {"detector": self.detector, "reason": self.reason}


def sort_findings(findings: list[Finding]) -> list[Finding]:
    """Worst first: severity, then GPU-time lost, then id for a stable order."""
    return sorted(
        findings,
        key=lambda f: (-f.severity.rank, -(f.gpu_seconds_lost or 0.0), f.detector, f.id),
    )
