"""The package's layers, checked by reading every module's imports (function-local ones included).

The rules (``docs/architecture.md`` explains them):

1. A module imports only modules of its own layer or of layers below it. Layers that share a number are siblings
   and never import each other (analysis, quality and studies read rows; none needs another).
2. No import circle, at any size, counting function-local imports.
3. No module of the package imports the root facade ``specterbench`` (it is for plugin authors).
4. Function-local imports of the package only in ``specterbench.cli`` (the CLI imports a command's module when the
   command runs). Imports under ``if TYPE_CHECKING:`` are annotations, not dependencies, and are not counted.
5. No module imports another module's private names (``from x import _y``).
6. No module past ``MAX_LINES`` lines.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: import name -> source folder of the installed package and of its built-in strategies
PACKAGES = {"specterbench": ROOT / "specterbench", "specterbench.baselines": ROOT / "baselines"}

#: bottom to top; a tuple of several names is one layer of siblings
LAYERS: tuple[tuple[str, ...], ...] = (
    ("specterbench.errors", "specterbench.version"),
    ("specterbench.engine",),
    ("specterbench.strategy",),
    ("specterbench.catalog",),
    ("specterbench.plugins", "specterbench.baselines"),
    ("specterbench.runfiles",),
    ("specterbench.bench",),
    ("specterbench.analysis", "specterbench.quality", "specterbench.studies"),
    ("specterbench.testing",),
    ("specterbench.cli", "specterbench.__main__"),
)
#: groups of one layer that may import each other (the built-in strategies register through the plugin layer)
SAME_GROUP = {frozenset({"specterbench.plugins", "specterbench.baselines"}),
              frozenset({"specterbench.cli", "specterbench.__main__"})}
LOCAL_IMPORTS_ALLOWED = ("specterbench.cli",)
MAX_LINES = 400


@dataclass(frozen=True)
class Import:
    source: str  # importing module
    target: str  # imported module of the package
    line: int
    local: bool  # inside a function
    names: tuple[str, ...]  # names taken with ``from target import ...``


def modules() -> dict[str, Path]:
    found = {}
    for prefix, folder in PACKAGES.items():
        for path in sorted(folder.rglob("*.py")):
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join([prefix, *parts])] = path
    return found


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imports_of(name: str, path: Path, known: dict[str, Path]) -> list[Import]:
    is_package = path.name == "__init__.py"
    found: list[Import] = []

    def resolve(module: str | None, level: int) -> str:
        if not level:
            return module or ""
        base = name.split(".") if is_package else name.split(".")[:-1]
        base = base[: len(base) - (level - 1)]
        return ".".join(base + ([module] if module else []))

    def owner(target: str) -> str | None:
        while target and target not in known:
            target = target.rpartition(".")[0]
        return target or None

    def walk(node: ast.AST, local: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                for sub in child.orelse:
                    walk(sub, local)
                continue
            inner = local or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.Import):
                for alias in child.names:
                    target = owner(alias.name)
                    if target:
                        found.append(Import(name, target, child.lineno, inner, ()))
            elif isinstance(child, ast.ImportFrom):
                base = resolve(child.module, child.level)
                for alias in child.names:
                    full = f"{base}.{alias.name}"
                    if full in known:  # ``from pkg import module``
                        found.append(Import(name, full, child.lineno, inner, ()))
                    else:
                        target = owner(base)
                        if target:
                            found.append(Import(name, target, child.lineno, inner, (alias.name,)))
            walk(child, inner)

    walk(ast.parse(path.read_text(), str(path)), False)
    return [i for i in found if i.target != name]


def layer_of(module: str) -> tuple[int, str]:
    best = None
    for index, layer in enumerate(LAYERS):
        for group in layer:
            if module == group or module.startswith(group + "."):
                if best is None or len(group) > len(best[1]):
                    best = (index, group)
    if best is None:
        raise AssertionError(f"{module} is in no layer: add it to LAYERS in {Path(__file__).name}")
    return best


@pytest.fixture(scope="module")
def graph():
    known = modules()
    return known, [imp for name, path in known.items() for imp in imports_of(name, path, known)]


def test_every_module_belongs_to_a_layer(graph):
    known, _ = graph
    for module in known:
        if module != "specterbench":
            layer_of(module)


def test_no_module_imports_a_higher_layer_or_a_sibling(graph):
    _, edges = graph
    bad = []
    for imp in edges:
        if imp.source == "specterbench" or imp.target == "specterbench":
            continue
        (src_layer, src_group), (dst_layer, dst_group) = layer_of(imp.source), layer_of(imp.target)
        sibling = (src_layer == dst_layer and src_group != dst_group
                   and frozenset({src_group, dst_group}) not in SAME_GROUP)
        if dst_layer > src_layer or sibling:
            bad.append(f"{imp.source}:{imp.line} imports {imp.target} ({dst_group} is "
                       f"{'a sibling' if sibling else 'above'} {src_group})")
    assert not bad, "\n".join(bad)


def test_no_import_circles(graph):
    known, edges = graph
    out = defaultdict(set)
    for imp in edges:
        out[imp.source].add(imp.target)
    index, low, stack, on_stack, circles = {}, {}, [], set(), []

    def visit(v):  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in out[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for v in known:
        if v not in index:
            visit(v)
    assert not circles, "import circles:\n" + "\n".join(" <-> ".join(c) for c in circles)


def test_no_module_imports_the_root_facade(graph):
    _, edges = graph
    bad = [f"{i.source}:{i.line}" for i in edges if i.target == "specterbench" and i.source != "specterbench"]
    assert not bad, "import from the module that defines it, not from the root facade: " + ", ".join(bad)


def test_function_local_imports_of_the_package_only_in_the_cli(graph):
    _, edges = graph
    bad = [f"{i.source}:{i.line} imports {i.target} inside a function" for i in edges
           if i.local and not i.source.startswith(LOCAL_IMPORTS_ALLOWED)]
    assert not bad, "\n".join(bad)


def test_no_module_imports_private_names(graph):
    _, edges = graph
    bad = [f"{i.source}:{i.line} takes {n} from {i.target}" for i in edges for n in i.names
           if n.startswith("_") and not n.startswith("__")]
    assert not bad, "\n".join(bad)


def test_no_module_is_past_the_line_limit(graph):
    known, _ = graph
    long = {m: n for m, p in known.items() if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"split by idea (limit {MAX_LINES} lines): " + ", ".join(f"{m} {n}" for m, n in long.items())


def test_every_module_imports_first_in_a_fresh_interpreter(graph):
    """The static rules, held at run time: each module imports with nothing of the package loaded before it."""
    import subprocess
    import sys

    known, _ = graph
    names = sorted(m for m in known if m != "specterbench.__main__")
    script = ("import importlib, sys\n"
              f"for name in {names!r}:\n"
              "    for loaded in [m for m in sys.modules if m.startswith('specterbench')]:\n"
              "        del sys.modules[loaded]\n"
              "    importlib.import_module(name)\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr.strip().splitlines()[-3:]


def test_the_suite_mirrors_the_layers():
    """Each test folder is named after a part of the package (``contract`` for ``strategy.py``); only meta-tests of
    the whole package sit at the top."""
    parts = {group.rpartition(".")[2] for layer in LAYERS for group in layer} | {"contract"}
    folders = {p.name for p in (ROOT / "tests").iterdir() if p.is_dir() and not p.name.startswith((".", "_"))}
    assert folders <= parts, f"test folders with no layer: {sorted(folders - parts)}"
    loose = {p.name for p in (ROOT / "tests").glob("test_*.py")}
    meta = {"test_layers.py", "test_layout.py", "test_comments.py", "test_outside_plugins.py"}
    assert loose <= meta, f"move into a layer's folder: {sorted(loose)}"
