"""Detector registry.

A detector is one module in this package holding one function ``detect`` decorated with
:func:`detector`: a pure function ``(JobContext, Settings) -> list[Finding]`` over the job's one
:class:`forensics.facts.context.JobContext`. Its settings are a frozen dataclass whose fields are declared
with :func:`forensics.base.settings.setting` (type, default, unit, valid range or choices, one line of doc);
``--set`` is validated against that declaration and ``forensics rules`` prints it. Modules are discovered automatically, so
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
from forensics.base.findings import Finding, Skipped
from forensics.base.frames import JobFrames
from forensics.base.settings import build
from forensics.facts.context import JobContext

DOC_SECTIONS = ("What it detects", "Why it matters", "How it measures", "What to do")


class Skip(Exception):
    """Raised by a detector whose inputs exist but cannot support the analysis; the message is the reason."""


@dataclass(frozen=True)
class DetectorSpec:
    name: str
    func: Callable[[JobContext, Any], list[Finding]]
    requires: tuple[str, ...]
    requires_any: tuple[str, ...]
    config: type
    doc: str


REGISTRY: dict[str, DetectorSpec] = {}

F = TypeVar("F", bound=Callable[..., list[Finding]])


def detector(
    name: str,
    *,
    settings: type,
    requires: tuple[str, ...] = (),
    requires_any: tuple[str, ...] = (),
) -> Callable[[F], F]:
    """Register a detector. ``requires``: frames that must all have rows; ``requires_any``: at least one."""

    def register(func: F) -> F:
        if name in REGISTRY:
            raise ValueError(f"detector {name!r} registered twice")
        module = importlib.import_module(func.__module__)
        REGISTRY[name] = DetectorSpec(
            name=name,
            func=func,
            requires=requires,
            requires_any=requires_any,
            config=settings,
            doc=(module.__doc__ or "").strip(),
        )
        return func

    return register


def load_all() -> dict[str, DetectorSpec]:
    """Import every detector module of this package (idempotent) and return the registry."""
    for info in pkgutil.iter_modules(__path__):
        if not info.name.startswith("_"):
            importlib.import_module(f"{__name__}.{info.name}")
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
            findings.extend(spec.func(ctx, settings[name]))
        except Skip as skip:
            skipped.append(Skipped(name, str(skip)))
    return findings, skipped
