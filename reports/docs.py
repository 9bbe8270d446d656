"""Every generated document, regenerated in one place: `forensics docs` writes them, `forensics docs --check`
fails when one differs from its source (the detectors' declarations, the incident rules, the frame specs, the
collectives table's schema).

- docs/detectors.md: each detector's DetectorDoc and settings (`forensics rules --format md`);
- docs/incidents.md: the part between its ``<!-- generated: rules -->`` and ``<!-- end generated -->`` markers
  (the rules table and the finding kinds the detectors declare); the prose around it is written by hand;
- docs/frames.md: every frame's columns, dtypes and units;
- docs/collectives.md: the columns of collectives.parquet;
- reports/templates/compiled.json: the Python code of report.html's and diff.html's templates (what Jinja2 would
  generate from them on every run otherwise).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from forensics.reports import html, rules
from forensics.reports.view_collectives import schema_markdown

from forensics.base import frames
from forensics.detectors import load_all
from forensics.incidents import kinds_markdown, rules_markdown

START, END = "<!-- generated: rules -->\n", "<!-- end generated -->"


def _detectors(_: str) -> str:
    return rules.markdown(load_all().values())


def _incidents(current: str) -> str:
    """The hand-written page with its generated part replaced."""
    if START not in current or END not in current:
        raise ValueError(f"docs/incidents.md lacks the markers {START.strip()} ... {END}")
    generated = rules_markdown() + "\n\n### Finding kinds\n\n" + kinds_markdown() + "\n"
    return current[: current.index(START) + len(START)] + generated + current[current.index(END):]


GENERATED: dict[str, Callable[[str], str]] = {
    "docs/detectors.md": _detectors,
    "docs/incidents.md": _incidents,
    "docs/frames.md": lambda _: frames.render_markdown(),
    "docs/collectives.md": lambda _: schema_markdown(),
    "reports/templates/compiled.json": lambda _: html.template_code(),
}
"""Path (relative to the checkout) -> its text, given the file's current text."""


def stale(root: Path) -> list[str]:
    """The generated documents under ``root`` that differ from what their sources generate today."""
    out = []
    for rel, make in GENERATED.items():
        path = root / rel
        current = path.read_text(encoding="utf-8") if path.is_file() else ""
        if make(current) != current:
            out.append(rel)
    return out


def write(root: Path) -> list[str]:
    """Regenerate every document under ``root``; returns those that changed."""
    changed = stale(root)
    for rel in changed:
        path = root / rel
        path.write_text(GENERATED[rel](path.read_text(encoding="utf-8") if path.is_file() else ""), encoding="utf-8")
    return changed
