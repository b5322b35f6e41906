"""Structure facts about the package, read from its source (no imports, no cluster).

The unit of layering is a *part*: a subpackage of ``tra_dask`` (``logical``,
``physical``, ``optimizer``, ``lowering``, ``runtime``, ``frontend``, ``programs``) or a
module at the package root (``types``, ``keys``, ``kernels``, ``node``, ``viz``,
``units``, ``api``, ``cli``), each its own part.  The facade ``tra_dask/__init__.py``
is a part too, named ``tra_dask``: it is not excluded, and since it imports (some of
it lazily) nearly everything, a module that imported names from it would close a
cycle; only the command line (``cli``), which nothing imports, does.  A subpackage's
own ``__init__`` belongs to its subpackage, so its re-exports of its own modules are
no edge.

Every ``import`` / ``from ... import`` statement counts, at module level *and* inside
functions (also under ``if TYPE_CHECKING``): a function-level import hides a cycle
from the interpreter, not from the layering.  Imports by name at run time
(``importlib.import_module``) are not edges; they are allowed only where
:data:`LATE_BOUND` says why (the facade's lazy attributes; a ``td.Array`` reaching
:mod:`tra_dask.api` to run on a cluster).
"""

from __future__ import annotations

import ast
import pathlib
from collections import defaultdict

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PKG = ROOT / "tra_dask"

FUNCTION_LEVEL_LIMIT = 40  # issue 40: "function-level internal imports under 40"


def _module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _part(module: str) -> str:
    """``tra_dask.optimizer.rules.fuse`` -> ``optimizer``; ``tra_dask.types`` -> ``types``;
    ``tra_dask`` (the facade) -> ``tra_dask``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "tra_dask"


def _is_module(module: str) -> bool:
    rel = pathlib.Path(*module.split("."))
    return (ROOT / rel).is_dir() or (ROOT / rel).with_suffix(".py").is_file()


class _Import:
    __slots__ = ("path", "line", "source", "target", "name", "in_function")

    def __init__(self, path, line, source, target, name, in_function):
        self.path, self.line, self.source, self.target = path, line, source, target
        self.name, self.in_function = name, in_function

    def __repr__(self):
        what = f"{self.target}.{self.name}" if self.name else self.target
        return f"{self.path.relative_to(ROOT)}:{self.line} imports {what}"


def _imports() -> list[_Import]:
    """Every import of a ``tra_dask`` module by a ``tra_dask`` module, one per name."""
    out = []
    for path in sorted(PKG.rglob("*.py")):
        module = _module_name(path)
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        tree = ast.parse(path.read_text(), str(path))

        def visit(node, in_function):
            for child in ast.iter_child_nodes(node):
                inner = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
                if isinstance(child, ast.Import):
                    for alias in child.names:
                        if alias.name.split(".")[0] == "tra_dask":
                            out.append(_Import(path, child.lineno, module, alias.name, None, in_function))
                elif isinstance(child, ast.ImportFrom):
                    if child.level:
                        base = package.split(".")
                        base = base[:len(base) - (child.level - 1)]
                        target = ".".join(base + ([child.module] if child.module else []))
                    else:
                        target = child.module or ""
                    if target.split(".")[0] != "tra_dask":
                        continue
                    for alias in child.names:
                        sub = f"{target}.{alias.name}"
                        if _is_module(sub):  # `from . import logical`: the module itself
                            out.append(_Import(path, child.lineno, module, sub, None, in_function))
                        else:
                            out.append(_Import(path, child.lineno, module, target, alias.name, in_function))
                visit(child, inner)

        visit(tree, False)
    return out


IMPORTS = _imports()

# the modules that import by name at run time, and why
LATE_BOUND = {
    "tra_dask": "PEP 562 lazy attributes: `import tra_dask` does not import the runtime (distributed)",
    "tra_dask.frontend.run": "cluster_api(): x.compute() / x.plan() / numpy.asarray(x) reach tra_dask.api, "
                             "which sits above the front-end; namespace(): x.__array_namespace__() is "
                             "tra_dask.array_api, which re-exports the front-end's namespace from above it",
}


def _late_bound() -> dict[str, list[str]]:
    out: dict[str, list[str]] = defaultdict(list)
    for path in sorted(PKG.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (isinstance(node, ast.Call) and isinstance(node.func, (ast.Attribute, ast.Name))
                    and getattr(node.func, "attr", getattr(node.func, "id", None)) in ("import_module", "__import__")):
                arg = node.args[0] if node.args else None
                out[_module_name(path)].append(arg.value if isinstance(arg, ast.Constant) else ast.unparse(arg))
    return dict(out)


def _graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = defaultdict(set)
    for imp in IMPORTS:
        a, b = _part(imp.source), _part(imp.target)
        if a != b:
            graph[a].add(b)
    return graph


def _cycles(graph) -> list[list[str]]:
    """The strongly connected components of more than one part (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_walk_sees_the_package():
    # guards the walk itself: it found the parts and the imports it should
    parts = {_part(i.source) for i in IMPORTS}
    assert {"logical", "physical", "optimizer", "lowering", "runtime", "frontend", "programs", "tra_dask"} <= parts
    assert any(i.in_function for i in IMPORTS)
    assert ("runtime", "optimizer") in {(_part(i.source), _part(i.target)) for i in IMPORTS}


def test_no_import_cycle_between_parts():
    graph = _graph()
    cycles = _cycles(graph)
    if cycles:
        detail = []
        for comp in cycles:
            members = set(comp)
            detail += [repr(i) for i in IMPORTS
                       if _part(i.source) in members and _part(i.target) in members
                       and _part(i.source) != _part(i.target)]
        pytest.fail(f"import cycle(s) between parts {cycles}:\n" + "\n".join(detail))


def test_the_facade_is_imported_only_by_the_command_line():
    bad = [i for i in IMPORTS if _part(i.target) == "tra_dask" and _part(i.source) not in ("tra_dask", "cli")]
    assert not bad, "\n".join(map(repr, bad))


def test_frontend_imports_neither_runtime_nor_calibration():
    bad = [i for i in IMPORTS if _part(i.source) == "frontend"
           and (_part(i.target) in ("runtime", "api", "cli") or "calibrat" in f"{i.target}.{i.name or ''}")]
    assert not bad, "\n".join(map(repr, bad))


def test_imports_by_name_are_declared():
    found = _late_bound()
    assert set(found) == set(LATE_BOUND), found
    assert sorted(found["tra_dask.frontend.run"]) == ["tra_dask.api", "tra_dask.array_api"]


def test_few_function_level_imports():
    statements = sorted({(i.path, i.line) for i in IMPORTS if i.in_function})
    where = defaultdict(int)
    for path, _ in statements:
        where[str(path.relative_to(ROOT))] += 1
    assert len(statements) < FUNCTION_LEVEL_LIMIT, f"{len(statements)} function-level imports: {dict(sorted(where.items()))}"


def test_no_private_name_crosses_parts():
    """A name with a leading underscore (a private function, class or module) is
    imported only inside its own part; what another part needs is public."""

    def private(imp):
        names = imp.target.split(".")[1:] + ([imp.name] if imp.name else [])
        return [n for n in names if n.startswith("_") and not n.startswith("__")]

    bad = [i for i in IMPORTS if private(i) and _part(i.source) != _part(i.target)]
    assert not bad, "\n".join(map(repr, bad))
