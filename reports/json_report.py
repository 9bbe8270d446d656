"""findings.json, following forensics/schema/findings.schema.json."""

from __future__ import annotations

from typing import Any

import orjson

from forensics import __version__
from forensics.pipeline import Analysis, run_header


def build(analysis: Analysis) -> dict[str, Any]:
    steps = analysis.frames["steps"]
    steps_analyzed = int(steps["step"].n_unique()) if steps.height else None
    return {
        "schema_version": 1,
        "tool": {"name": "forensics", "version": __version__},
        "run": {
            "path": str(analysis.run_dir),
            **run_header(analysis),
            "coverage": analysis.context.coverage,
            "steps_analyzed": steps_analyzed,
            "sources": [_source(row) for row in analysis.sources.iter_rows(named=True)],
        },
        "findings": [f.to_json() for f in analysis.findings],
        "skipped": [s.to_json() for s in analysis.skipped],
        "incidents": [i.to_json() for i in analysis.incidents],
    }


# Source kinds the findings.json contract (../shared/findings.schema.json) enumerates; a newer kind is written as
# `unknown` with its real name in `format` (the contract allows extra keys on a source) until the contract lists it.
CONTRACT_KINDS = frozenset({"kineto", "nsys", "nccl_log", "dmesg", "nvidia_smi", "unknown"})


def _source(row: dict[str, Any]) -> dict[str, Any]:
    out = {k: row[k] for k in ("path", "kind", "rank", "host", "status", "message")}
    if out["kind"] not in CONTRACT_KINDS:
        out["format"], out["kind"] = out["kind"], "unknown"
    return out


def render(analysis: Analysis) -> bytes:
    return orjson.dumps(build(analysis), option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS)
