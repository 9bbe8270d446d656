"""Detector registry.

A detector is one module in this package holding one function ``detect`` decorated with
:func:`detector`: a pure function ``(JobContext, Settings) -> list[Finding]`` over the job's one
:class:`forensics.facts.context.JobContext`. Its settings are a frozen dataclass whose fields are declared
with :func:`forensics.base.settings.setting` (type, default, unit, valid range or choices, one line of doc);
``--set`` is validated against that declaration and ``forensics rules`` prints it. Modules are discovered automatically,
so
adding a detector is adding a module (plus its fixtures and tests).

A detector never returns ``[]`` for "I could not look": when its inputs are missing it is skipped
with a reason, either because a frame in ``requires`` is absent or empty, or because it raised
:class:`Skip` itself.

Every detector's docstring has the sections ``What it detects``, ``Why it matters``,
``How it measures`` and ``What to do`` (a test enforces it); ``forensics rules`` prints them.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from forensics.base.errors import UsageError
from forensics.base.findings import Finding, FindingKind, Skipped
from forensics.base.frames import JobFrames
from forensics.base.settings import build
from forensics.facts.context import JobContext

DOC_SECTIONS = ("What it detects", "Why it matters", "How it measures", "What to do")


@dataclass(frozen=True)
class DetectorDoc:
    """A detector's documentation as data (``forensics rules`` and docs/detectors.md print it).

    Each field is plain text with a little reST inline markup (````literal````); paragraphs are separated by a
    blank line."""

    summary: str  # one paragraph: what the detector is about
    detects: str  # What it detects
    matters: str  # Why it matters
    measures: str  # How it measures
    todo: str  # What to do

    def sections(self) -> list[tuple[str, str]]:
        """(section title, text) in the order of :data:`DOC_SECTIONS`."""
        return list(zip(DOC_SECTIONS, (self.detects, self.matters, self.measures, self.todo), strict=True))


class Skip(Exception):
    """Raised by a detector whose inputs exist but cannot support the analysis; the message is the reason."""


@dataclass(frozen=True)
class DetectorSpec:
    name: str
    func: Callable[[JobContext, Any], list[Finding]]
    requires: tuple[str, ...]
    requires_any: tuple[str, ...]
    config: type
    doc: DetectorDoc
    kinds: tuple[FindingKind, ...] = ()
    view: str | None = None

    def kind(self, name: str) -> FindingKind:
        """The declared kind ``name``; ValueError when this detector does not declare it."""
        for k in self.kinds:
            if k.name == name:
                return k
        raise ValueError(f"detector {self.name!r} emitted a finding of undeclared kind {name!r}; "
                         f"declared: {', '.join(k.name for k in self.kinds)}")


REGISTRY: dict[str, DetectorSpec] = {}

F = TypeVar("F", bound=Callable[..., list[Finding]])


def detector(
    name: str,
    *,
    settings: type,
    doc: DetectorDoc,
    requires: tuple[str, ...] = (),
    requires_any: tuple[str, ...] = (),
    kinds: tuple[FindingKind, ...],
    view: str | None = None,
) -> Callable[[F], F]:
    """Register a detector. ``doc``: its documentation; ``requires``: frames that must all have rows;
    ``requires_any``: at least one;
    ``kinds``: every kind of finding it emits (each finding's ``kind`` names one); ``view``: the report view
    (its anchor) that shows its evidence, if one does."""

    def register(func: F) -> F:
        if name in REGISTRY:
            raise ValueError(f"detector {name!r} registered twice")
        if not kinds:
            raise ValueError(f"detector {name!r} declares no kind of finding")
        _check_kinds(name, kinds)
        if not all(text.strip() for _, text in [("summary", doc.summary), *doc.sections()]):
            raise ValueError(f"detector {name!r}: every field of its DetectorDoc needs text")
        REGISTRY[name] = DetectorSpec(
            name=name,
            func=func,
            requires=requires,
            requires_any=requires_any,
            config=settings,
            doc=doc,
            kinds=kinds,
            view=view,
        )
        return func

    return register


def _check_kinds(name: str, kinds: tuple[FindingKind, ...]) -> None:
    """A kind declared by several detectors must play the same role at the same stage everywhere."""
    seen = declared_kinds()
    for k in kinds:
        other = seen.get(k.name)
        if other is not None and (other.role, other.tier) != (k.role, k.tier):
            raise ValueError(f"detector {name!r} declares kind {k.name!r} as {k.role.value} at stage {k.tier}; "
                             f"another detector declares it as {other.role.value} at stage {other.tier}")


def declared_kinds() -> dict[str, FindingKind]:
    """Every kind the detectors registered so far declare, by name (the wording of the declaring detector first by
    name, so docs do not depend on the order modules were imported in)."""
    out: dict[str, FindingKind] = {}
    for _, spec in sorted(REGISTRY.items()):
        for k in spec.kinds:
            out.setdefault(k.name, k)
    return out


def kind_of(finding: Finding) -> FindingKind | None:
    """The declared kind of ``finding``; None for a finding of no registered detector or kind."""
    spec = load_all().get(finding.detector) if not _PACKAGE_LOADED else REGISTRY.get(finding.detector)
    return next((k for k in spec.kinds if k.name == finding.kind), None) if spec else None


_PACKAGE_LOADED: list[bool] = []


def load_all() -> dict[str, DetectorSpec]:
    """Import every detector module of this package (once) and return the registry (with any detector
    registered from elsewhere, e.g. a test)."""
    if not _PACKAGE_LOADED:
        for info in pkgutil.iter_modules(__path__):
            if not info.name.startswith("_"):
                importlib.import_module(f"{__name__}.{info.name}")
        _PACKAGE_LOADED.append(True)
    return dict(sorted(REGISTRY.items()))


def parse_overrides(items: list[str]) -> dict[str, dict[str, str]]:
    """``["straggler.min_z=4"]`` -> ``{"straggler": {"min_z": "4"}}``, validated against the declared
    settings (unknown detector or key, wrong type, out of range, nan/inf: UsageError naming the key)."""
    out: dict[str, dict[str, str]] = {}
    for item in items:
        name, sep, value = item.partition("=")
        det, dot, key = name.partition(".")
        if not sep or not dot or not det.strip() or not key.strip():
            raise UsageError(f"--set expects DETECTOR.SETTING=VALUE, got {item!r}")
        out.setdefault(det.strip(), {})[key.strip()] = value.strip()
    build_settings(out)
    return out


def build_settings(
    overrides: Mapping[str, Mapping[str, str]] | None = None, only: list[str] | None = None
) -> dict[str, Any]:
    """Every detector's settings instance with the validated ``overrides`` applied (name -> settings)."""
    registry = load_all()
    overrides = overrides or {}
    unknown = sorted((set(overrides) | set(only or [])) - set(registry))
    if unknown:
        bad = ", ".join(unknown)
        keys = [f"{d}.{k}" for d in unknown for k in overrides.get(d, {})]
        where = f"--set {', '.join(keys)}: " if keys else ""
        raise UsageError(f"{where}unknown detector(s) {bad}; known: {', '.join(registry)}")
    return {name: build(name, spec.config, dict(overrides.get(name, {}))) for name, spec in registry.items()}


def _missing_inputs(spec: DetectorSpec, frames: JobFrames) -> str | None:
    """Why ``spec`` cannot run on ``frames`` (a frame it requires is absent or empty), or None."""
    missing = [f for f in spec.requires if not frames.has(f)]
    if missing:
        return f"needs {' and '.join(missing)}, which no source provided"
    if spec.requires_any and not any(frames.has(f) for f in spec.requires_any):
        return f"needs one of {', '.join(spec.requires_any)}, which no source provided"
    return None


def run_detectors(
    ctx: JobContext,
    overrides: Mapping[str, Mapping[str, str]] | None = None,
    only: list[str] | None = None,
    progress: Callable[[str, int, int], None] | None = None,
) -> tuple[list[Finding], list[Skipped]]:
    """Run every detector (or ``only`` those) over the job's one context; ``progress(name, done, total)``
    before each."""
    registry = load_all()
    settings = build_settings(overrides, only)
    findings: list[Finding] = []
    skipped: list[Skipped] = []
    chosen = [name for name in registry if not only or name in only]
    for done, name in enumerate(chosen):
        spec = registry[name]
        if progress:
            progress(name, done, len(chosen))
        why = _missing_inputs(spec, ctx.frames)
        if why:
            skipped.append(Skipped(name, why))
            continue
        try:
            found = spec.func(ctx, settings[name])
        except Skip as skip:
            skipped.append(Skipped(name, str(skip)))
            continue
        for f in found:
            spec.kind(f.kind)  # a finding of an undeclared kind is a bug in its detector: fail loudly
        findings.extend(found)
    return findings, skipped
