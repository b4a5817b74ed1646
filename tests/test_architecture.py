"""The shape of the code: no import cycles, a leaf accelerator base, family knowledge only in adapters.

These read the source (no model runs). Every import is an edge of the graph, including those deferred
inside functions (for heavy dependencies and a fast `kinegen --help`): a deferred import that closes a
cycle is still a cycle (the old registry that imported the caches to register them was one). Imports
under `if TYPE_CHECKING:` are annotations only and are not edges.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "kinegen"


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in ROOT.rglob("*.py")}


def _imports(node: ast.AST):
    """Every import statement of a module, at any depth, except those under ``if TYPE_CHECKING:``."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.Import, ast.ImportFrom)):
            yield child
        elif isinstance(child, ast.If) and isinstance(child.test, ast.Name) and child.test.id == "TYPE_CHECKING":
            yield from (i for c in child.orelse for i in _imports_of(c))
        else:
            yield from _imports(child)


def _imports_of(node: ast.AST):
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        yield node
    else:
        yield from _imports(node)


def _edges(name: str) -> set[str]:
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in _imports(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        else:
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            targets = [base] + [f"{base}.{a.name}" for a in node.names]
        for t in targets:
            # importing a.b.c runs a, a.b and a.b.c
            parts = t.split(".")
            for i in range(1, len(parts) + 1):
                cand = ".".join(parts[:i])
                # The root is lazy (see the test below); a module's own packages are already being
                # imported when it runs (a package's __init__ may import its submodules).
                if cand in MODULES and cand != "kinegen" and not f"{name}.".startswith(f"{cand}."):
                    out.add(cand)
    return out


GRAPH = {name: _edges(name) for name in MODULES}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_the_graph_sees_real_edges():
    assert "kinegen.accelerators.base" in GRAPH["kinegen.caching.map_guided"] or any(
        "kinegen.accelerators.base" in GRAPH[m] for m in GRAPH if m.startswith("kinegen.caching"))
    assert "kinegen.caching.diffusers_caches" in GRAPH["kinegen.accelerators.catalog"]


def test_the_root_package_imports_lazily():
    """``kinegen/__init__`` resolves its public names on first use (importlib, not import statements)."""
    assert GRAPH["kinegen"] == set()


def test_no_import_cycle_in_kinegen():
    assert _cycles(GRAPH) == []


def test_the_cycle_finder_finds_cycles():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


@pytest.mark.parametrize("leaf", ["kinegen.accelerators.base", "kinegen.errors", "kinegen.text"])
def test_leaf_modules_import_nothing_above_them(leaf):
    allowed = {"kinegen.errors", "kinegen.text", "kinegen.accelerators"}
    assert GRAPH[leaf] <= allowed, GRAPH[leaf] - allowed


def test_accelerator_packages_do_not_import_the_catalogue():
    for name, deps in GRAPH.items():
        if name.startswith(("kinegen.caching", "kinegen.sparse_attn", "kinegen.adapters")):
            assert "kinegen.accelerators.catalog" not in deps, name


FAMILY_NAMES = {"wan", "hunyuan_video", "cogvideox", "flux", "flux_kontext", "mpgan"}


def test_family_names_are_compared_only_inside_adapters():
    """No `if name == "wan"` outside kinegen/adapters: family knowledge lives in the family's adapter."""
    offenders = []
    for name, path in MODULES.items():
        if name.startswith("kinegen.adapters"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare):
                for side in [node.left, *node.comparators]:
                    consts = side.elts if isinstance(side, (ast.Tuple, ast.List, ast.Set)) else [side]
                    if any(isinstance(c, ast.Constant) and c.value in FAMILY_NAMES for c in consts):
                        offenders.append(f"{name}:{node.lineno}")
    assert offenders == []
