"""The packages' imports run one way and in no circle (read from the sources, not by importing them).

Layers, lowest first: ``marius_py.errors`` (the user-facing error, importing nothing of ours);
``marius_py.orderings`` (numpy alone); ``marius_py.storage``; ``marius_py.pipeline``; the rest of
``marius_py`` (model, trainer, API, CLI). A module may import its own layer and those below. Imports
under ``if TYPE_CHECKING:`` are annotations, not dependencies; imports inside functions are.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import marius_py
import marius_py.orderings
import marius_py.pipeline
import marius_py.storage

PACKAGES = {"marius_py": marius_py, "marius_py.orderings": marius_py.orderings,
            "marius_py.storage": marius_py.storage, "marius_py.pipeline": marius_py.pipeline}
LAYERS = ["marius_py.errors", "marius_py.orderings", "marius_py.storage", "marius_py.pipeline", "marius_py"]
THIRD_PARTY_OF_ORDERINGS = {"numpy"}


def modules() -> dict[str, Path]:
    """Every module of the four packages by its dotted name."""
    found = {}
    for name, package in PACKAGES.items():
        root = Path(package.__path__[0])
        for path in root.rglob("*.py"):
            parts = [p for p in path.relative_to(root).with_suffix("").parts if p != "__init__"]
            found[".".join([name, *parts])] = path
    return found


def imported_names(path: Path, module: str) -> set[tuple[str, str]]:
    """What ``module`` imports, outside ``if TYPE_CHECKING:`` blocks: (name, fallback) pairs, the fallback the
    package a ``from package import name`` takes ``name`` from when it is not a module."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names: set[tuple[str, str]] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            names.update((alias.name, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = module.split(".")
                package = parts[:len(parts) - node.level + (path.name == "__init__.py")]
                base = ".".join(package + ([base] if base else []))
            names.update((f"{base}.{alias.name}", base) for alias in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)
    visit(tree)
    return names


def dependency_graph() -> dict[str, set[str]]:
    """Module -> our modules it imports (a package's ``__init__`` under the package's name)."""
    known = modules()
    graph = {}
    for module, path in known.items():
        targets = {name if name in known else fallback for name, fallback in imported_names(path, module)}
        graph[module] = {target for target in targets if target in known and target != module}
    return graph


def layer(module: str) -> int:
    return next(i for i, name in enumerate(LAYERS) if module == name or module.startswith(name + ".")
                or name == "marius_py")


def test_imports_never_reach_a_higher_layer():
    upward = sorted(f"{m} imports {d}" for m, targets in dependency_graph().items() for d in targets
                    if layer(d) > layer(m))
    assert upward == []


def test_no_module_imports_itself_through_others():
    graph = dependency_graph()
    cycles = strongly_connected(graph)
    assert cycles == []


def test_orderings_need_numpy_alone():
    third_party = set()
    for module, path in modules().items():
        if layer(module) == LAYERS.index("marius_py.orderings"):
            for name, _ in imported_names(path, module):
                top = name.split(".")[0]
                if top and top != "marius_py" and top not in sys.stdlib_module_names:
                    third_party.add(top)
    assert third_party <= THIRD_PARTY_OF_ORDERINGS


def test_the_checks_find_a_planted_cycle_and_an_upward_import():
    graph = {"marius_py.storage.a": {"marius_py.pipeline.b"}, "marius_py.pipeline.b": {"marius_py.storage.a"}}
    assert strongly_connected(graph) == [["marius_py.pipeline.b", "marius_py.storage.a"]]
    assert layer("marius_py.pipeline.b") > layer("marius_py.storage.a")
    assert layer("marius_py.errors") < layer("marius_py.orderings.ordering") < layer("marius_py.trainer")


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Groups of two or more modules that import one another (Tarjan's algorithm, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    groups.append(sorted(group))
    return groups


def test_no_bench_or_test_puts_the_checkout_on_the_import_path():
    """marius_py.storage, .pipeline and .orderings exist only as installed (package_dir): a process importing
    marius_py from the checkout's root (sys.path, PYTHONPATH) lacks them, as a worker spawned by a test
    against the installed wheel did."""
    root = Path(__file__).resolve().parent.parent
    inserted = re.compile(r"sys\.path\.insert\(0, str\(Path\(__file__\)\.resolve\(\)((?:\.parent)+)\)\)")
    found = []
    for folder in ("bench", "tests"):
        for path in sorted((root / folder).rglob("*.py")):
            if path == Path(__file__).resolve():
                continue  # (its own patterns)
            depth = len(path.relative_to(root).parts)  # (parents from the file up to the checkout's root)
            for number, line in enumerate(path.read_text().splitlines(), 1):
                match = inserted.search(line)
                if (match and match.group(1).count(".parent") == depth) or "str(REPO) + os.pathsep" in line \
                        or "sys.path.insert(0, str(REPO))" in line:
                    found.append(f"{path.relative_to(root)}:{number}")
    assert not found, found
