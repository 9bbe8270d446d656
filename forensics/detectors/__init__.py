"""Detector registry.

A detector is one module in this package holding one function ``detect`` decorated with
:func:`detector`: a pure function ``(JobContext, Settings) -> list[Finding]`` over the job's one
:class:`forensics.context.JobContext`. Its settings are a frozen dataclass whose fields are the
detector's named, documented thresholds. Modules are discovered automatically, so
adding a detector is adding a module (plus its fixtures and tests).

A detector never returns ``[]`` for "I could not look": when its inputs are missing it is skipped
with a reason, either because a frame in ``requires`` is absent or empty, or because it raised
:class:`Skip` itself.

Every detector's docstring has the sections ``What it detects``, ``Why it matters``,
``How it measures`` and ``What to do`` (a test enforces it); ``forensics rules`` prints them.
"""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from forensics.context import JobContext
from forensics.errors import UsageError
from forensics.findings import Finding, Skipped
from forensics.frames import JobFrames

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


def build_config(spec: DetectorSpec, overrides: Mapping[str, str]) -> Any:
    """The detector's config with ``overrides`` (field name -> text) applied and type-checked."""
    fields = {f.name: f for f in dataclasses.fields(spec.config)}
    values: dict[str, Any] = {}
    defaults = spec.config()
    for key, text in overrides.items():
        if key not in fields:
            raise UsageError(
                f"detector {spec.name!r} has no setting {key!r}; known: {', '.join(sorted(fields))}"
            )
        current = getattr(defaults, key)
        try:
            if isinstance(current, bool):
                values[key] = text.lower() in ("1", "true", "yes", "on")
            elif isinstance(current, int):
                values[key] = int(text)
            elif isinstance(current, float):
                values[key] = float(text)
            else:
                values[key] = text
        except ValueError:
            raise UsageError(f"{spec.name}.{key}: {text!r} is not a {type(current).__name__}") from None
    return dataclasses.replace(defaults, **values)


def parse_overrides(items: list[str]) -> dict[str, dict[str, str]]:
    """``["straggler.min_slowdown=0.05"]`` -> ``{"straggler": {"min_slowdown": "0.05"}}``."""
    out: dict[str, dict[str, str]] = {}
    for item in items:
        name, sep, value = item.partition("=")
        det, dot, key = name.partition(".")
        if not sep or not dot or not det or not key:
            raise UsageError(f"--set expects DETECTOR.SETTING=VALUE, got {item!r}")
        out.setdefault(det.strip(), {})[key.strip()] = value.strip()
    return out


def run_detectors(
    frames: JobFrames,
    overrides: Mapping[str, Mapping[str, str]] | None = None,
    only: list[str] | None = None,
) -> tuple[list[Finding], list[Skipped]]:
    registry = load_all()
    overrides = overrides or {}
    unknown = (set(overrides) | set(only or [])) - set(registry)
    if unknown:
        raise UsageError(f"unknown detector(s): {', '.join(sorted(unknown))}; known: {', '.join(registry)}")
    findings: list[Finding] = []
    skipped: list[Skipped] = []
    ctx = JobContext(frames)
    for name, spec in registry.items():
        if only and name not in only:
            continue
        config = build_config(spec, overrides.get(name, {}))
        missing = [f for f in spec.requires if not frames.has(f)]
        if missing:
            skipped.append(Skipped(name, f"needs {' and '.join(missing)}, which no source provided"))
            continue
        if spec.requires_any and not any(frames.has(f) for f in spec.requires_any):
            skipped.append(
                Skipped(name, f"needs one of {', '.join(spec.requires_any)}, which no source provided")
            )
            continue
        try:
            findings.extend(spec.func(ctx, config))
        except Skip as skip:
            skipped.append(Skipped(name, str(skip)))
    return findings, skipped
