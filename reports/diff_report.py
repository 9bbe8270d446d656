"""diff.json and diff.md: what changed between BASE and NEW (:mod:`forensics.diff`)."""

from __future__ import annotations

from typing import Any

import orjson
from forensics.reports.markdown import md_text

from forensics import __version__
from forensics.diff import RunDiff, RunProfile, Side

SCHEMA = "forensics-diff/2"


def _run(p: RunProfile, side: Side | None, path: str) -> dict[str, Any]:
    out: dict[str, Any] = {"name": p.name, "path": path, "ranks": p.ranks, "steps": p.steps, "nccl": p.nccl,
                           "versions": p.versions}
    if side is not None:
        out.update({"compared_steps": side.steps, "step_ms": side.step_ms, "buckets_ms": side.buckets,
                    "categories_ms": side.categories})
    return out


def _steps(d: RunDiff) -> dict[str, Any]:
    al = d.alignment
    return {"how": al.how, "warmup": al.warmup, "pairs": [list(p) for p in al.pairs],
            "dropped": {"base": al.dropped_base, "new": al.dropped_new}, "deltas": d.steps}


def to_json(d: RunDiff, base_path: str, new_path: str) -> dict[str, Any]:
    """The diff as data (schema in docs/diff.md)."""
    return {
        "schema": SCHEMA,
        "tool": {"name": "forensics", "version": __version__},
        "verdict": d.verdict,
        "delta_ms_per_step": d.delta_ms,
        "delta_fraction": d.delta_frac,
        "delta_spread_ms": d.spread_ms,
        "delta_ms_mean": d.delta_ms_mean,
        "steps": _steps(d),
        "base": _run(d.base, d.base_side, base_path),
        "new": _run(d.new, d.new_side, new_path),
        "contributors": d.contributors,
        "kernels": d.kernels,
        "nccl_changes": d.nccl_changes,
        "version_changes": d.version_changes,
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


def _steps_md(d: RunDiff) -> list[str]:
    al = d.alignment
    drop = f"{al.warmup} warm-up step(s) dropped from each run" if al.warmup else "no warm-up step dropped"
    lines = ["## Steps compared", "",
             f"{len(al.pairs)} pair(s), aligned by {al.how}; {drop}; not compared: BASE "
             f"{_ids(al.dropped_base)}, NEW {_ids(al.dropped_new)}.", ""]
    return lines + _table(["BASE step", "NEW step", "BASE ms", "NEW ms", "delta ms"],
                          [[p["base_step"], p["new_step"], p["base_ms"], p["new_ms"], _signed(p["delta_ms"])]
                           for p in d.steps])


def _ids(steps: list[int]) -> str:
    return ", ".join(str(s) for s in steps) or "none"


def _changes_md(d: RunDiff) -> list[str]:
    lines: list[str] = []
    if d.nccl_changes:
        lines += ["## NCCL configuration changes", ""]
        lines += _table(["aspect", "removed", "added"],
                        [[c["aspect"], ", ".join(c["removed"]), ", ".join(c["added"])] for c in d.nccl_changes])
    if d.version_changes:
        lines += ["## Software version changes", ""]
        lines += _table(["component", "BASE", "NEW"],
                        [[c["component"], ", ".join(c["base"]), ", ".join(c["new"])] for c in d.version_changes])
    if d.kernels:
        lines += ["## Kernels that changed most (ms per rank and step, over the compared steps)", ""]
        lines += _table(["kernel", "category", "change", "BASE ms", "NEW ms", "delta ms"],
                        [[k["kernel"][:120], k["category"], k["change"], k["base_ms"], k["new_ms"],
                          _signed(k["delta_ms"])] for k in d.kernels])
    return lines


def render_md(d: RunDiff) -> str:
    lines = [f"# forensics diff: {md_text(d.base.name)} -> {md_text(d.new.name)}", "", f"**{md_text(d.verdict)}**", ""]
    bs, ns = d.base_side, d.new_side
    lines += _table(["", "BASE", "NEW"], [
        ["median step (ms)", bs.step_ms if bs else None, ns.step_ms if ns else None],
        ["ranks x steps", f"{d.base.ranks} x {d.base.steps}", f"{d.new.ranks} x {d.new.steps}"],
    ])
    lines += _steps_md(d)
    lines += ["## Where the delta comes from (ms per step: median over the aligned steps, mean, range)", ""]
    lines += _table(["part", "median ms", "mean ms", "range ms"],
                    [[c["what"], _signed(c["delta_ms"]), _signed(c["mean_ms"]),
                      _Ours(f"{c['spread_ms'][0]:+.3f} .. {c['spread_ms'][1]:+.3f}")] for c in d.contributors])
    lines += _changes_md(d)
    for what, sets in (("Incidents", d.incidents), ("Findings", d.findings)):
        for change in ("appeared", "resolved"):
            if sets.get(change):
                lines += [f"## {what} {change} in NEW" if change == "appeared" else f"## {what} resolved in NEW", ""]
                lines += [f"- {md_text(t)}" for t in sets[change]] + [""]
    return "\n".join(lines)
