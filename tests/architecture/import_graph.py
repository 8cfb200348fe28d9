"""The import graph of a package, read with `ast` (nothing is imported), and the layer
rules of the architecture checked over it.

Every `import x`, `from x import y` (relative ones resolved against the importer's
package), and `importlib.import_module("x")` / `__import__("x")` with a literal name counts,
wherever it sits: module level, inside a function, under `if TYPE_CHECKING:`. Each edge
remembers whether it runs when the importer is imported (module level, not under
TYPE_CHECKING): only those can form an import cycle.
"""
from __future__ import annotations

import ast
import os
from dataclasses import dataclass, field
from typing import Iterable, Iterator, Optional


@dataclass(frozen=True)
class ImportEdge:
    importer: str
    imported: str
    line: int
    scope: str
    """'module' (runs when the importer is imported), 'function' (runs when the function
    is called) or 'type_checking' (never runs: under `if TYPE_CHECKING:`)."""

    @property
    def eager(self) -> bool:
        return self.scope == "module"

    def __str__(self) -> str:
        return f"{self.importer} -> {self.imported} (line {self.line})"


@dataclass
class ImportGraph:
    modules: dict[str, str]
    """Dotted module name -> file path, for every module of the package."""
    edges: list[ImportEdge]

    @classmethod
    def from_package(cls, package_dir: str) -> "ImportGraph":
        """Parse every .py file under `package_dir` (whose folder name is the package)."""
        package_dir = os.path.abspath(package_dir)
        root = os.path.dirname(package_dir)
        modules: dict[str, str] = {}
        for folder, dirs, files in os.walk(package_dir):
            dirs[:] = sorted(d for d in dirs if not d.startswith((".", "__pycache__")))
            for name in sorted(files):
                if name.endswith(".py"):
                    path = os.path.join(folder, name)
                    modules[_module_name(root, path)] = path
        edges: list[ImportEdge] = []
        for module, path in modules.items():
            with open(path, encoding="utf-8") as f:
                tree = ast.parse(f.read(), filename=path)
            is_package = os.path.basename(path) == "__init__.py"
            edges.extend(_edges_of(module, is_package, tree, set(modules)))
        return cls(modules, edges)

    def edges_from(self, prefix: str) -> Iterator[ImportEdge]:
        return (e for e in self.edges if in_package(e.importer, prefix))

    def cycles(self, lazy: bool = False) -> list[list[str]]:
        """Strongly connected groups (of two or more modules, or a module importing
        itself) of the graph of module-level imports between modules of the package;
        with `lazy`, function-level imports count too (type-checking ones never do)."""
        scopes = ("module", "function") if lazy else ("module",)
        graph: dict[str, set[str]] = {m: set() for m in self.modules}
        for e in self.edges:
            if e.scope in scopes and e.imported in graph:
                graph[e.importer].add(e.imported)
                # Importing a.b.c runs a/b/__init__ first, unless a.b is an ancestor of
                # the importer (then it is being imported already). The root package's
                # __init__ is left out: it imports the public API, so every module would
                # sit in one cycle with it.
                for parent in list(_parents(e.imported))[1:]:
                    if parent in graph and not in_package(e.importer, parent):
                        graph[e.importer].add(parent)
        return [sorted(c) for c in _strongly_connected(graph)
                if len(c) > 1 or next(iter(c)) in graph[next(iter(c))]]


    def reachable(self, start: str, lazy: bool = True) -> dict[str, Optional[ImportEdge]]:
        """Modules of the package that importing (and, with `lazy`, running) the modules
        under `start` can import, each with the edge that first reached it (None for
        the start modules): follow the edges back for the chain."""
        scopes = ("module", "function") if lazy else ("module",)
        by_importer: dict[str, list[ImportEdge]] = {}
        for e in self.edges:
            if e.scope in scopes and e.imported in self.modules:
                by_importer.setdefault(e.importer, []).append(e)
        seen: dict[str, Optional[ImportEdge]] = {
            m: None for m in self.modules if in_package(m, start)}
        todo = sorted(seen)
        while todo:
            for e in by_importer.get(todo.pop(), []):
                if e.imported not in seen:
                    seen[e.imported] = e
                    todo.append(e.imported)
        return seen


def chain_to(reached: dict[str, Optional[ImportEdge]], module: str) -> list[ImportEdge]:
    """The import chain `reachable` followed from a start module to `module`."""
    chain = []
    edge = reached[module]
    while edge is not None:
        chain.append(edge)
        edge = reached[edge.importer]
    return chain[::-1]


def in_package(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


@dataclass(frozen=True)
class Rule:
    """Modules under `importers` import nothing under `forbidden`, except `allowed`:
    keys are an imported package or `importer -> imported`, values the reason the arrow
    is legitimate."""
    name: str
    importers: tuple[str, ...]
    forbidden: tuple[str, ...] = ()
    only: Optional[tuple[str, ...]] = None
    """When set, the importers may import only these vllm packages (and their own)."""
    allowed: dict[str, str] = field(default_factory=dict)
    internal: str = "vllm"
    """The package whose imports the rule governs (third-party imports are free),
    except `external_forbidden`."""
    external_forbidden: tuple[str, ...] = ()

    def violations(self, graph: ImportGraph) -> list[ImportEdge]:
        found = []
        for importer in self.importers:
            for e in graph.edges_from(importer):
                if self._breaks(e, importer):
                    found.append(e)
        return sorted(set(found), key=lambda e: (e.importer, e.line, e.imported))

    def _breaks(self, e: ImportEdge, importer: str) -> bool:
        if any(_matches(e, key) for key in self.allowed):
            return False
        if any(in_package(e.imported, x) for x in self.external_forbidden):
            return True
        if not in_package(e.imported, self.internal) or in_package(e.imported, importer):
            return False
        if any(in_package(e.imported, f) for f in self.forbidden):
            return True
        if self.only is not None:
            return not any(in_package(e.imported, o) for o in self.only)
        return False


def _matches(e: ImportEdge, key: str) -> bool:
    """`key` is an imported package, or `importer -> imported` (packages)."""
    importer, sep, imported = key.partition(" -> ")
    if not sep:
        return in_package(e.imported, key)
    return in_package(e.importer, importer) and in_package(e.imported, imported)


def check(graph: ImportGraph, rules: Iterable[Rule]) -> list[str]:
    """One line per broken rule: the rule, then `importer -> imported (line N)` lines."""
    report = []
    for rule in rules:
        bad = rule.violations(graph)
        if bad:
            report.append(f"{rule.name}:")
            report.extend(f"  {e}" for e in bad)
    return report


# ------------------------------------------------------------------ parsing
def _module_name(root: str, path: str) -> str:
    rel = os.path.relpath(path, root)[:-len(".py")].split(os.sep)
    if rel[-1] == "__init__":
        rel = rel[:-1]
    return ".".join(rel)


def _parents(module: str) -> Iterator[str]:
    parts = module.split(".")
    for i in range(1, len(parts)):
        yield ".".join(parts[:i])


def _edges_of(module: str, is_package: bool, tree: ast.AST,
              known: set[str]) -> Iterator[ImportEdge]:
    package = module if is_package else module.rpartition(".")[0]
    for node, scope in _walk(tree, "module"):
        for target in _targets(node, package, known):
            yield ImportEdge(module, target, node.lineno, scope)


def _walk(node: ast.AST, scope: str) -> Iterator[tuple[ast.AST, str]]:
    """Every node with its scope: module, function or type_checking."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and _is_type_checking(child.test):
            yield child.test, scope
            for part in child.body:
                yield part, "type_checking"
                yield from _walk(part, "type_checking")
            for part in child.orelse:
                yield part, scope
                yield from _walk(part, scope)
            continue
        yield child, scope
        inner = scope
        if scope == "module" and isinstance(
                child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            inner = "function"
        yield from _walk(child, inner)


def _is_type_checking(test: ast.AST) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _targets(node: ast.AST, package: str, known: set[str]) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if isinstance(node, ast.ImportFrom):
        base = _resolve(node.module, node.level, package)
        if base is None:
            return []
        # `from pkg import mod` imports the module pkg.mod when there is one.
        subs = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in known]
        return subs or [base]
    if isinstance(node, ast.Call) and _is_import_call(node.func) and node.args:
        arg = node.args[0]
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
            if arg.value.startswith("."):
                level = len(arg.value) - len(arg.value.lstrip("."))
                name = _resolve(arg.value[level:] or None, level, package)
                return [name] if name else []
            return [arg.value]
    return []


def _is_import_call(func: ast.AST) -> bool:
    if isinstance(func, ast.Name):
        return func.id in ("import_module", "__import__")
    return isinstance(func, ast.Attribute) and func.attr == "import_module"


def _resolve(module: Optional[str], level: int, package: str) -> Optional[str]:
    if level == 0:
        return module
    parts = package.split(".") if package else []
    if level - 1 > len(parts):
        return None
    base = parts[:len(parts) - (level - 1)]
    if module:
        base.append(module)
    return ".".join(base) or None


def _strongly_connected(graph: dict[str, set[str]]) -> list[set[str]]:
    """Tarjan's algorithm, iterative (the graph has hundreds of modules)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[set[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.add(member)
                    if member == node:
                        break
                groups.append(group)
    return groups
