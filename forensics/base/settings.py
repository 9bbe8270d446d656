"""Detector settings declared as data.

Each detector declares its settings as a frozen dataclass whose fields are made with :func:`setting`:
name (the field name), type (the annotation, one of ``bool``, ``int``, ``float``, ``str``), default,
unit, valid range (``low``/``high``, inclusive) or ``choices``, and one line of doc. ``--set`` validates
text against that declaration (:func:`parse_value`), ``forensics rules`` prints it (:func:`describe`).

    @dataclass(frozen=True)
    class Settings:
        min_slowdown: float = setting(0.05, unit="fraction of step", low=0.0, high=1.0,
                                      doc="smallest slowdown reported")
        policy: str = setting("default", choices=("default", "strict", "lenient"), doc="Xid policy")
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import polars as pl

from forensics.base.errors import UsageError

_META = "forensics.setting"
_TYPES: dict[str, type] = {"bool": bool, "int": int, "float": float, "str": str}
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


@dataclass(frozen=True)
class SettingSpec:
    """One declared setting; ``type`` is resolved from the dataclass annotation."""

    name: str
    type: type
    default: Any
    unit: str
    doc: str
    low: float | None = None
    high: float | None = None
    choices: tuple[str, ...] | None = None
    regex: bool = False

    @property
    def allowed(self) -> str:
        """What values are valid, in words (for errors and the rules table)."""
        if self.choices:
            return "one of " + ", ".join(self.choices)
        if self.type is bool:
            return "true or false"
        if self.regex:
            return "a regular expression"
        if self.type is str:
            return "any text"
        lo = "-inf" if self.low is None else _num(self.low)
        hi = "inf" if self.high is None else _num(self.high)
        kind = "an integer" if self.type is int else "a number"
        return f"{kind} in [{lo}, {hi}]"


def _num(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else str(v)


def setting(
    default: Any,
    *,
    doc: str,
    unit: str = "",
    low: float | None = None,
    high: float | None = None,
    choices: tuple[str, ...] | None = None,
    regex: bool = False,
) -> Any:
    """A dataclass field carrying its declaration; use as the default of a settings field.

    ``low``/``high``: inclusive bounds of a number; ``choices``: the only valid texts; ``regex``: the
    text must be a valid (Polars/Rust) regular expression.
    """
    meta = {"unit": unit, "doc": doc, "low": low, "high": high, "choices": choices, "regex": regex}
    return dataclasses.field(default=default, metadata={_META: meta})


def specs(cls: type) -> list[SettingSpec]:
    """The declared settings of a settings dataclass, in declaration order."""
    out = []
    for f in dataclasses.fields(cls):
        meta = f.metadata.get(_META)
        if meta is None:
            raise TypeError(f"{cls.__name__}.{f.name} is not declared with forensics.base.settings.setting()")
        typ = _TYPES.get(f.type if isinstance(f.type, str) else f.type.__name__)
        if typ is None:
            raise TypeError(f"{cls.__name__}.{f.name}: settings are bool, int, float or str, not {f.type}")
        out.append(SettingSpec(f.name, typ, f.default, meta["unit"], meta["doc"], meta["low"], meta["high"],
                               meta["choices"], meta["regex"]))
    return out


def parse_value(detector: str, spec: SettingSpec, text: str) -> Any:
    """``text`` as a valid value of ``spec``, or UsageError naming the key and what is allowed."""
    key = f"{detector}.{spec.name}"
    bad = UsageError(f"--set {key}={text!r}: expected {spec.allowed}")
    raw = text.strip()
    if spec.type is bool:
        if raw.lower() in _TRUE:
            return True
        if raw.lower() in _FALSE:
            return False
        raise bad
    if spec.type is str:
        if (spec.choices and raw not in spec.choices) or (spec.regex and not _is_regex(raw)):
            raise bad
        return raw
    try:
        value: float = int(raw) if spec.type is int else float(raw)
    except ValueError:
        raise bad from None
    if not math.isfinite(value):
        raise bad
    if (spec.low is not None and value < spec.low) or (spec.high is not None and value > spec.high):
        raise bad
    return value


def _is_regex(text: str) -> bool:
    """Whether Polars (which runs the detectors' patterns) accepts ``text`` as a regular expression."""
    try:
        pl.Series([""]).str.contains(text)
    except pl.exceptions.ComputeError:
        return False
    return True


def build(detector: str, cls: type, overrides: dict[str, str]) -> Any:
    """An instance of ``cls`` with the validated ``overrides`` (setting name -> text) applied."""
    by_name = {s.name: s for s in specs(cls)}
    values = {}
    for key, text in overrides.items():
        spec = by_name.get(key)
        if spec is None:
            known = ", ".join(sorted(by_name)) or "none"
            raise UsageError(f"--set {detector}.{key}: {detector} has no setting {key!r} (known: {known})")
        values[key] = parse_value(detector, spec, text)
    return cls(**values)


def describe(cls: type) -> list[dict[str, str]]:
    """Rows for the rules table: name, type, default, unit, allowed, doc."""
    return [
        {"name": s.name, "type": s.type.__name__, "default": str(s.default).lower() if s.type is bool
         else str(s.default), "unit": s.unit, "allowed": s.allowed, "doc": s.doc}
        for s in specs(cls)
    ]
