"""The package layout as a contract (issue #25, item 1): layers import only downward, no import cycles, no
private names taken across modules, no function-level imports that hide either.

Every module of forensics/, parsers/ (forensics.parsers) and reports/ (forensics.reports) belongs to one layer
of :data:`LAYERS`; a module may import from its own layer and the layers below. Imports are read from the whole
syntax tree: module level, ``if TYPE_CHECKING:`` blocks and function bodies alike, so a function-level import
cannot hide an upward arrow or a cycle. docs/architecture.md describes the layers.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import ROOT

# Lowest first. A module belongs to the layer of the longest prefix that names it ("forensics" alone is the
# package root, which declares the version and imports nothing).
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("base", ("forensics", "forensics.base")),
    ("parsers", ("forensics.parsers",)),
    ("facts", ("forensics.facts",)),
    ("detectors", ("forensics.detectors",)),
    ("incidents", ("forensics.incidents",)),
    ("pipeline", ("forensics.pipeline",)),
    ("analyses", ("forensics.diff", "forensics.fleet", "forensics.simulate")),
    ("reports", ("forensics.reports",)),
    ("cli", ("forensics.cli", "forensics.__main__")),
)

# Folder -> import name (pyproject.toml's package-dir).
FOLDERS = {"forensics": "forensics", "parsers": "forensics.parsers", "reports": "forensics.reports"}

# Nothing is allowed: the incidents <-> verdict cycle is gone (incidents split into model / rules / linking /
# cost / verdict, #25 item 2). Kept as data so the tests below still say what an allowance would be.
ALLOWED_CYCLES: set[frozenset[str]] = set()
ALLOWED_PRIVATE: set[tuple[str, str, str]] = set()
ALLOWED_LAZY: set[tuple[str, str]] = set()

# The CLI imports what each command runs inside the command: `forensics --version` or `rules` never pays
# for polars and the parsers (and the entry point answers `--version` before it imports the CLI at all).
# Nothing else imports forensics modules inside a function.
LAZY_IMPORTERS = {"forensics.cli", "forensics.__main__"}


@dataclass(frozen=True)
class Edge:
    source: str
    target: str
    names: tuple[str, ...]  # the names a ``from`` import takes (empty for ``import x``)
    line: int
    in_function: bool


def module_name(path: Path, root: Path = ROOT) -> str:
    rel = path.relative_to(root).with_suffix("")
    parts = [FOLDERS[rel.parts[0]], *rel.parts[1:]]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def library_modules(root: Path = ROOT) -> dict[str, Path]:
    return {module_name(p, root): p for folder in FOLDERS for p in sorted((root / folder).rglob("*.py"))}


def _absolute(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, *([node.module] if node.module else [])])


def _internal(name: str, modules: Iterable[str]) -> str | None:
    """The library module ``name`` names (itself, else its longest enclosing module); None outside."""
    known = set(modules)
    while name:
        if name in known:
            return name
        name = name.rpartition(".")[0]
    return None


def imports(module: str, source: str, modules: Iterable[str], is_package: bool = False) -> list[Edge]:
    """Every import of a library module in ``source``, wherever it stands in the syntax tree."""
    modules = set(modules)
    edges: list[Edge] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inside = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.Import):
                for alias in child.names:
                    if (target := _internal(alias.name, modules)) is not None:
                        edges.append(Edge(module, target, (), child.lineno, inside))
            elif isinstance(child, ast.ImportFrom):
                base = _absolute(module, is_package, child)
                for alias in child.names:
                    sub = f"{base}.{alias.name}"
                    if sub in modules:  # `from package import submodule`
                        edges.append(Edge(module, sub, (), child.lineno, inside))
                    elif (target := _internal(base, modules)) is not None:
                        edges.append(Edge(module, target, (alias.name,), child.lineno, inside))
            visit(child, inside)

    visit(ast.parse(source), False)
    return edges


def layer_of(module: str) -> int | None:
    best: tuple[int, int] | None = None  # (prefix length, layer index)
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            exact = prefix == "forensics"
            if module == prefix or (not exact and module.startswith(prefix + ".")):
                if best is None or len(prefix) > best[0]:
                    best = (len(prefix), index)
    return None if best is None else best[1]


def upward(edges: Iterable[Edge]) -> list[str]:
    bad = []
    for e in edges:
        src, dst = layer_of(e.source), layer_of(e.target)
        if src is not None and dst is not None and dst > src:
            bad.append(f"{e.source}:{e.line} ({LAYERS[src][0]}) imports {e.target} ({LAYERS[dst][0]})")
    return bad


def _reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    """Modules reachable from ``start`` over one import or more."""
    seen: set[str] = set()
    todo = list(graph.get(start, ()))
    while todo:
        node = todo.pop()
        if node not in seen:
            seen.add(node)
            todo.extend(graph.get(node, ()))
    return seen


def cycles(edges: Iterable[Edge]) -> list[frozenset[str]]:
    """The import cycles: groups of modules that each reach every other (or a module importing itself)."""
    graph: dict[str, set[str]] = {}
    for e in edges:
        graph.setdefault(e.source, set()).add(e.target)
    reach = {v: _reachable(graph, v) for v in graph}
    found = {frozenset(w for w in reach[v] if v in reach.get(w, ())) for v in graph if v in reach[v]}
    return sorted(found, key=sorted)


def private_names(edges: Iterable[Edge]) -> list[tuple[str, str, str]]:
    return [(e.source, e.target, n) for e in edges if e.source != e.target
            for n in e.names if n.startswith("_") and not n.startswith("__")]


def lazy(edges: Iterable[Edge]) -> list[Edge]:
    return [e for e in edges if e.in_function and e.source not in LAZY_IMPORTERS]


@pytest.fixture(scope="module")
def graph() -> tuple[dict[str, Path], list[Edge]]:
    modules = library_modules()
    edges = [e for name, path in modules.items()
             for e in imports(name, path.read_text(encoding="utf-8"), modules, path.name == "__init__.py")]
    return modules, edges


def test_every_module_belongs_to_a_layer(graph):
    modules, _ = graph
    assert not [m for m in modules if layer_of(m) is None]


def test_layers_import_only_downward(graph):
    _, edges = graph
    assert not upward(edges), "imports that point up a layer:\n" + "\n".join(upward(edges))


def test_no_import_cycles(graph):
    _, edges = graph
    found = set(cycles(edges))
    assert not found - ALLOWED_CYCLES, "import cycles:\n" + "\n".join(sorted(" <-> ".join(sorted(c)) for c in found))
    assert not ALLOWED_CYCLES - found, "an allowed cycle is gone: remove it from ALLOWED_CYCLES"


def test_no_private_names_across_modules(graph):
    _, edges = graph
    taken = set(private_names(edges))
    assert not taken - ALLOWED_PRIVATE, "\n".join(f"{s} takes {n} from {t}" for s, t,
                                                  n in sorted(taken - ALLOWED_PRIVATE))
    assert not ALLOWED_PRIVATE - taken, "an allowed private import is gone: remove it from ALLOWED_PRIVATE"


def test_no_function_level_imports_of_the_package_outside_the_cli(graph):
    _, edges = graph
    hidden = {(e.source, e.target) for e in lazy(edges)}
    assert not hidden - ALLOWED_LAZY, "\n".join(f"{e.source}:{e.line} imports {e.target} inside a function"
                                                for e in lazy(edges) if (e.source, e.target) not in ALLOWED_LAZY)


def test_only_the_cli_imports_reports(graph):
    """Data code never depends on rendering (a stricter reading of the layers: nothing beside the reports
    themselves and the CLI imports them, whatever layer it sits in)."""
    _, edges = graph
    bad = [f"{e.source}:{e.line} imports {e.target}" for e in edges
           if layer_of(e.target) == layer_of("forensics.reports") and e.source != "forensics.cli"
           and layer_of(e.source) != layer_of("forensics.reports")]
    assert not bad, "data code imports rendering:\n" + "\n".join(bad)


# --- each check fires: probe sources ---------------------------------------------------------------------

PROBE_MODULES = {"forensics", "forensics.base", "forensics.base.frames", "forensics.facts", "forensics.facts.context",
                 "forensics.parsers", "forensics.parsers.kernel_log", "forensics.reports", "forensics.reports.html",
                 "forensics.pipeline", "forensics.detectors", "forensics.detectors.gpu_hw_error",
                 "forensics.detectors.gpu_hw_error.kernel"}


def _probe(module: str, source: str, is_package: bool = False) -> list[Edge]:
    return imports(module, source, PROBE_MODULES, is_package)


@pytest.mark.parametrize("source", [
    "from forensics.facts.context import JobContext",
    "import forensics.facts.context",
    "from forensics.facts import context",
    "from ..facts import context",
    "if TYPE_CHECKING:\n    from forensics.facts.context import JobContext",
    "def f():\n    from forensics.facts.context import JobContext",
    "class C:\n    def f(self):\n        import forensics.facts.context as c",
])
def test_an_upward_import_in_any_form_is_found(source):
    edges = _probe("forensics.parsers.kernel_log", source)
    assert [e.target for e in edges] == ["forensics.facts.context"]
    assert upward(edges)


def test_downward_and_same_layer_imports_pass():
    edges = _probe("forensics.facts.context",
                   "from forensics.base.frames import JobFrames\nfrom forensics import __version__")
    assert [e.target for e in edges] == ["forensics.base.frames", "forensics"] and not upward(edges)


def test_the_layer_is_the_longest_prefix():
    assert layer_of("forensics") == 0 and layer_of("forensics.base.frames") == 0
    assert layer_of("forensics.parsers.nccl_log") == 1 and layer_of("forensics.cli") == len(LAYERS) - 1
    assert layer_of("forensics.pipeline_extra") is None and layer_of("forensicsx") is None


def test_a_cycle_hidden_in_a_function_is_found():
    edges = (_probe("forensics.facts.context", "def f():\n    from forensics.base.frames import x")
             + _probe("forensics.base.frames", "from forensics.facts.context import JobContext"))
    assert cycles(edges) == [frozenset({"forensics.facts.context", "forensics.base.frames"})]
    assert lazy(edges) and upward(edges)


def test_a_longer_cycle_and_a_self_import_are_found():
    a, b, c = "forensics.base", "forensics.base.frames", "forensics.facts"
    edges = [Edge(a, b, (), 1, False), Edge(b, c, (), 1, False), Edge(c, a, (), 1, False), Edge(c, c, (), 1, False),
             Edge("forensics.pipeline", a, (), 1, False)]
    assert cycles(edges) == [frozenset({a, b, c})]
    assert cycles([Edge(a, a, (), 1, False)]) == [frozenset({a})]
    assert cycles([Edge(a, b, (), 1, False), Edge(c, b, (), 1, False)]) == []


def test_a_package_importing_its_submodule_is_an_edge_not_a_cycle():
    init = _probe("forensics.detectors.gpu_hw_error", "from .kernel import kernel_incidents", is_package=True)
    part = _probe("forensics.detectors.gpu_hw_error.kernel", "from forensics.detectors import Skip")
    assert [e.target for e in init] == ["forensics.detectors.gpu_hw_error.kernel"]
    assert [e.target for e in part] == ["forensics.detectors"]
    assert cycles(init + part) == []


def test_a_private_name_taken_across_modules_is_found():
    edges = _probe("forensics.facts.context", "from forensics.parsers.kernel_log import _ctime_ns, __version__, ok")
    assert private_names(edges) == [("forensics.facts.context", "forensics.parsers.kernel_log", "_ctime_ns")]


def test_a_function_level_import_outside_the_cli_is_found():
    source = "def f():\n    from forensics.base.frames import JobFrames"
    assert lazy(_probe("forensics.pipeline", source)) and not lazy(_probe("forensics.cli", source))


def test_a_reports_import_outside_the_cli_is_found():
    edges = _probe("forensics.pipeline", "from forensics.reports import html")
    assert [e.target for e in edges] == ["forensics.reports.html"] and upward(edges)
