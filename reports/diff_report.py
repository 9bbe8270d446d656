"""diff.json and diff.md: what changed between BASE and NEW (:mod:`forensics.diff`)."""

from __future__ import annotations

from typing import Any

import orjson
from forensics.reports.markdown import md_text

from forensics import __version__
from forensics.diff import RunDiff, RunProfile

SCHEMA = "forensics-diff/1"


def _run(p: RunProfile, path: str) -> dict[str, Any]:
    return {"name": p.name, "path": path, "ranks": p.ranks, "steps": p.steps, "step_ms": round(p.step_ms, 3),
            "buckets_ms": {k: round(v, 3) for k, v in p.buckets.items()},
            "categories_ms": {k: round(v, 3) for k, v in sorted(p.categories.items())}, "nccl": p.nccl}


def to_json(d: RunDiff, base_path: str, new_path: str) -> dict[str, Any]:
    """The diff as data (schema in docs/diff.md)."""
    return {
        "schema": SCHEMA,
        "tool": {"name": "forensics", "version": __version__},
        "verdict": d.verdict,
        "delta_ms_per_step": d.delta_ms,
        "delta_fraction": d.delta_frac,
        "base": _run(d.base, base_path),
        "new": _run(d.new, new_path),
        "contributors": d.contributors,
        "kernels": d.kernels,
        "nccl_changes": d.nccl_changes,
        "findings": d.findings,
        "incidents": d.incidents,
    }


def render_json(d: RunDiff, base_path: str, new_path: str) -> bytes:
    return orjson.dumps(to_json(d, base_path, new_path), option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS)


def _cell(v: Any) -> str:
    """Numbers are ours and stay as they are; any text may come from the input and is escaped."""
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.3f}"
    return str(v) if isinstance(v, (int, _Ours)) else md_text(v)


def _table(head: list[str], rows: list[list[Any]]) -> list[str]:
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    out += ["| " + " | ".join(_cell(v) for v in row) + " |" for row in rows]
    return out + [""]


class _Ours(str):
    """Text this module wrote (a signed number): not escaped."""


def _signed(v: float) -> str:
    return _Ours(f"{v:+.3f}")


def render_md(d: RunDiff) -> str:
    lines = [f"# forensics diff: {md_text(d.base.name)} -> {md_text(d.new.name)}", "", f"**{md_text(d.verdict)}**", ""]
    lines += _table(["", "BASE", "NEW"], [
        ["mean step (ms)", d.base.step_ms, d.new.step_ms],
        ["ranks x steps", f"{d.base.ranks} x {d.base.steps}", f"{d.new.ranks} x {d.new.steps}"],
    ])
    lines += ["## Where the delta comes from (ms per step, parts add up to the delta)", ""]
    lines += _table(["part", "delta ms"], [[c["what"], _signed(c["delta_ms"])] for c in d.contributors])
    if d.nccl_changes:
        lines += ["## NCCL configuration changes", ""]
        lines += _table(["aspect", "removed", "added"],
                        [[c["aspect"], ", ".join(c["removed"]), ", ".join(c["added"])] for c in d.nccl_changes])
    if d.kernels:
        lines += ["## Kernels that changed most (ms per rank and step)", ""]
        lines += _table(["kernel", "category", "change", "BASE ms", "NEW ms", "delta ms"],
                        [[k["kernel"][:120], k["category"], k["change"], k["base_ms"], k["new_ms"],
                          _signed(k["delta_ms"])] for k in d.kernels])
    for what, sets in (("Incidents", d.incidents), ("Findings", d.findings)):
        for change in ("appeared", "resolved"):
            if sets.get(change):
                lines += [f"## {what} {change} in NEW" if change == "appeared" else f"## {what} resolved in NEW", ""]
                lines += [f"- {md_text(t)}" for t in sets[change]] + [""]
    return "\n".join(lines)
