"""No function in forensics/, parsers/ or reports/ is longer than 80 lines (issue #12.3). Ruff checks the
complexity (C901) but has no length rule, so this test measures it with ast: from the `def` line (decorators
excluded) to the last line of the body, nested functions counted in their parent as well."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import ROOT

MAX_LINES = 80
FOLDERS = ("forensics", "parsers", "reports")


def long_functions(path: Path, limit: int = MAX_LINES) -> list[tuple[int, str, int]]:
    """(line, qualified name, length) of every function in ``path`` longer than ``limit`` lines."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found: list[tuple[int, str, int]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                name = f"{prefix}{child.name}"
                length = (child.end_lineno or child.lineno) - child.lineno + 1
                if length > limit:
                    found.append((child.lineno, name, length))
                visit(child, f"{name}.")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            else:
                visit(child, prefix)

    visit(tree, "")
    return found


def test_the_measure_counts_def_to_last_line(tmp_path: Path):
    body = [f"x{i} = {i}" for i in range(MAX_LINES - 1)]
    lines = ["@staticmethod", "def fits():", *(f"    {b}" for b in body), "", "", "class C:",
             "    def too_long(self):", *(f"        {b}" for b in body), "        return 1", ""]
    src = tmp_path / "m.py"
    src.write_text("\n".join(lines))
    # fits: def + 79 body lines = 80 (decorator not counted); C.too_long: def + 79 + return = 81
    assert long_functions(src) == [(lines.index("    def too_long(self):") + 1, "C.too_long", MAX_LINES + 1)]


def test_no_function_longer_than_80_lines():
    offenders = [f"{path.relative_to(ROOT)}:{line} {name} ({length} lines)"
                 for folder in FOLDERS for path in sorted((ROOT / folder).rglob("*.py"))
                 for line, name, length in long_functions(path)]
    assert not offenders, f"functions longer than {MAX_LINES} lines:\n" + "\n".join(offenders)
