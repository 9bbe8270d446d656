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


class Role(str, Enum):
    """The part a kind of finding plays in an incident."""

    FAULT = "fault"  # something broke: a GPU, a host, a NIC, a CUDA context, a transport
    HANG = "hang"  # ranks stopped making progress: a timed-out, desynchronised or abandoned collective
    SLOWDOWN = "slowdown"  # the job ran, slower than it should: a slow rank, a slow link
    SYMPTOM = "symptom"  # what others see of a cause: waiting, exposed communication, idle GPUs, bubbles
    CONFIG = "config"  # a setting or setup that makes the job slower than its hardware allows

    @property
    def default_stage(self) -> int:
        """Where this role sits in a causal chain by default: faults and configuration first, symptoms last."""
        return {"fault": 0, "config": 0, "hang": 2, "slowdown": 2, "symptom": 3}[self.value]


@dataclass(frozen=True)
class FindingKind:
    """One kind of finding a detector emits, declared on its ``@detector``.

    ``name`` is the vocabulary incident rules match (several detectors may declare the same kind, with the same
    role and stage); ``meaning`` says what a finding of this kind is; ``remediation`` is the default advice.
    ``stage`` orders kinds in a causal chain (a rule only links a lower stage to a higher one, so links never
    form a cycle); it defaults to the role's :attr:`Role.default_stage`. ``ends_job``: a finding of this kind
    means the job died of it (the verdict says so) even when no watchdog timeout costs it as a hang."""

    name: str
    meaning: str
    role: Role
    remediation: str
    stage: int | None = None
    ends_job: bool = False

    @property
    def tier(self) -> int:
        return self.role.default_stage if self.stage is None else self.stage


@dataclass(frozen=True)
class When:
    """When what a finding describes happened: a span of epoch ns, or explicitly unknown.

    ``basis`` says how the detector placed it ("watchdog log stamp minus the collective's run time",
    "the profiled window") or, when unknown, why it could not."""

    start_ns: int | None
    end_ns: int | None
    basis: str

    def __post_init__(self) -> None:
        if (self.start_ns is None) != (self.end_ns is None):
            raise ValueError("a time span has both ends or neither")
        if self.start_ns is not None and self.end_ns is not None and self.start_ns > self.end_ns:
            raise ValueError(f"time span ends before it starts: {self.start_ns} > {self.end_ns}")

    @staticmethod
    def span(start_ns: int, end_ns: int, basis: str) -> When:
        return When(int(start_ns), int(end_ns), basis)

    @staticmethod
    def unknown(why: str) -> When:
        return When(None, None, "unknown: " + why)

    @property
    def known(self) -> bool:
        return self.start_ns is not None

    def to_json(self) -> dict[str, Any]:
        return {"start_ns": self.start_ns, "end_ns": self.end_ns, "basis": self.basis}


NOT_PLACED = When.unknown("its detector did not place it in time")


@dataclass(frozen=True)
class CostBasis:
    """What an incident's cost is computed from, as the detector measured it.

    A slowdown is costed from :attr:`Finding.gpu_seconds_lost` (excess time x steps x GPUs). A fatal hang
    (``fatal``) is costed from when the job died (``died_ns``), how long the hung collective ran (``hung_s``)
    and how many ranks waited for it (``waiting_ranks``); any of them may be unknown."""

    fatal: bool = False
    died_ns: int | None = None
    hung_s: float | None = None
    waiting_ranks: int | None = None


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
    # Typed facts other layers read (never the metrics): the declared kind, when, where, and the cost basis.
    kind: str = ""  # one of the kinds its detector declares (FindingKind.name)
    when: When = NOT_PLACED
    process_group: str | None = None  # the communicator / process group it is about, where one is
    waited_for: tuple[int, ...] = ()  # ranks this finding's ranks (or victims) waited for
    victims: tuple[int, ...] = ()  # ranks that waited because of this finding's ranks
    xids: tuple[int, ...] = ()  # the Xid numbers a GPU finding reports, as the driver logged them
    cost: CostBasis = CostBasis()

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
        """Who caused it, in words ("ranks 4; hosts n1; GPUs 0000:9a:00.0; process group 0"); empty when nobody is
        named."""
        parts = []
        if self.ranks:
            parts.append("ranks " + ", ".join(map(str, sorted(self.ranks))))
        if self.hosts:
            parts.append("hosts " + ", ".join(sorted(self.hosts)))
        if self.gpus:
            parts.append("GPUs " + ", ".join(sorted(self.gpus)))
        if self.process_group:
            parts.append("process group " + self.process_group)
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
            "kind": self.kind,
            "when": self.when.to_json(),
            "process_group": self.process_group,
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
