"""The Python package has no import circle, counting imports inside functions too.

A function-level import can hide a circle from the interpreter (it runs after both modules are
loaded) but not from a reader: two modules that need each other are one module in two files. So
every `import` and `from ... import` of a cyserve module, at any depth of the syntax tree, is an
edge here, and the graph they make must be acyclic. The Cython extension modules (a top-level
.pyx and the files it `include`s) are nodes too: their Python-level imports, which Cython writes
like Python's, are read line by line (a `cimport` is a compile-time import and is not one)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import cyserve

PKG = Path(cyserve.__file__).resolve().parent


_INCLUDE = re.compile(r"""^include\s+["']([^"']+)["']""", re.M)
# `import a.b [as c], ...` or `from [.]a import (x, ...`; `cimport` lines do not match.
_PYX_IMPORT = re.compile(r"^[ \t]*(?:import[ \t]+([\w.]+)|"
                         r"from[ \t]+(\.*)([\w.]*)[ \t]+import[ \t]+\(?[ \t]*([\w, \t]*))", re.M)


def _modules() -> dict[str, Path]:
    """Every module of the package by dotted name (a package is its __init__.py, an extension
    module its top-level .pyx)."""
    mods = {}
    for path in sorted(PKG.rglob("*.pyx")):
        if path.parent == PKG:
            mods[f"{PKG.name}.{path.stem}"] = path
    for path in sorted(PKG.rglob("*.py")):
        parts = list(path.relative_to(PKG.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        mods[".".join(parts)] = path
    return mods


def _resolve(module: str, is_package: bool, level: int, name: str | None) -> str:
    """The absolute name of `from <level dots><name> import ...` written in `module`."""
    if level == 0:
        return name or ""
    base = module.split(".")
    if not is_package:
        base.pop()  # a module's dots count from its package
    base = base[:len(base) - (level - 1)] if level > 1 else base
    return ".".join(base + ([name] if name else []))


def _pyx_imports(path: Path, seen: set[Path]) -> list[ast.stmt]:
    """The Python imports of a Cython file and of the files it includes, as ast nodes."""
    seen.add(path)
    text = path.read_text()
    nodes: list[ast.stmt] = []
    for m in _PYX_IMPORT.finditer(text):
        if m.group(1):
            nodes.append(ast.Import(names=[ast.alias(name=m.group(1))]))
        else:
            names = [n.split()[0] for n in m.group(4).split(",") if n.strip()]
            nodes.append(ast.ImportFrom(module=m.group(3) or None, level=len(m.group(2)),
                                        names=[ast.alias(name=n) for n in names]))
    for inc in _INCLUDE.findall(text):
        child = (path.parent / inc).resolve()
        if child not in seen and child.exists():
            nodes.extend(_pyx_imports(child, seen))
    return nodes


def _edges(mods: dict[str, Path]) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        is_package = path.name == "__init__.py"
        if path.suffix == ".pyx":
            nodes: list[ast.AST] = list(_pyx_imports(path, set()))
        else:
            nodes = list(ast.walk(ast.parse(path.read_text(), str(path))))
        for node in nodes:
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _resolve(mod, is_package, node.level, node.module)
                # `from pkg import name` imports the submodule pkg.name when there is one, and
                # otherwise takes a name from pkg itself.
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base
                           for a in node.names]
            for target in targets:
                # `import cyserve.x.y` needs cyserve.x.y; keep the longest known module name.
                while target and target not in mods:
                    target = target.rpartition(".")[0]
                if target and target != mod:
                    graph[mod].add(target)
    return graph


def _find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_the_graph_sees_the_package() -> None:
    graph = _edges(_modules())
    # Guards against a walker that finds nothing and so passes trivially.
    assert "cyserve.start" in graph["cyserve"]
    assert {"cyserve.serving", "cyserve.supervisor"} <= graph["cyserve.start"]
    assert "cyserve.start" in graph["cyserve.cli"]  # imported inside main()
    assert "cyserve._core" in graph["cyserve.serving"]  # imported inside functions
    assert "cyserve._core" in graph


def test_no_import_circle() -> None:
    cycle = _find_cycle(_edges(_modules()))
    assert cycle is None, "import circle: " + " -> ".join(cycle or [])


def test_a_circle_is_reported() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}
    assert _find_cycle(graph) == ["a", "b", "c", "a"]
