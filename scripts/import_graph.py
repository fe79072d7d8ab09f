"""The import graph of the ``aioinfer`` package: its layers, its circles, and every import
that climbs from a lower layer to a higher one.

python scripts/import_graph.py          # the report, for a reader
python scripts/import_graph.py --json   # the same figures, for tests/test_import_graph.py

The imports are read from the source with :mod:`ast`, nothing is imported. Each import
between two modules of the package is an edge of one kind:

- ``module``: runs when the importing module is imported (module level, in a class
  body, under ``try`` or ``if`` at module level);
- ``type``: under ``if TYPE_CHECKING:``, for annotations only;
- ``lazy``: inside a function, run on its first call.

Every kind counts for circles and for climbs (a type-only import still says the lower
layer knows the higher one); the report marks which kind each is. ``from a.b import c``
is an edge to ``a.b.c`` when that is a module, else to ``a.b``; the packages a module's
name passes through (their ``__init__``) are not edges of their own.

A circle is a strongly connected component of two or more modules (or a module that
imports itself). The layers, bottom first, are data below: a module belongs to the
layer of the longest prefix of its name listed there.
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "aioinfer"

LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "foundation",
        (
            "aioinfer._version",
            "aioinfer.errors",
            "aioinfer.properties",
            "aioinfer.model",
            "aioinfer.frontend",
            "aioinfer.opsets",
            "aioinfer.results",
            "aioinfer.histogram",
            "aioinfer.models",
        ),
    ),
    ("shared passes", ("aioinfer.transforms",)),
    ("plugin API", ("aioinfer.plugin",)),
    ("devices", ("aioinfer.devices",)),
    ("core", ("aioinfer.core", "aioinfer.cache", "aioinfer.queue", "aioinfer.offline")),
    ("generation and pipelines", ("aioinfer.generation", "aioinfer.pipelines", "aioinfer.text")),
    ("public API", ("aioinfer",)),
    ("serving", ("aioinfer.serving",)),
    (
        "applications",
        (
            "aioinfer.backend",
            "aioinfer.bench",
            "aioinfer._cli_shared",
            "aioinfer.cli",
            "aioinfer.ray",
            "aioinfer.ray_generation",
            "aioinfer.testing",
            "aioinfer.devices.process.__main__",
        ),
    ),
)
"""Bottom first: a layer may import the layers below it and its own, never one above.

foundation: the version, errors, property declarations (the shared ones among them), the
model handle and its frontend, opsets, results; shared passes: the graph rewrites any
device may use (making a model stateful, the rewrite helpers), over the model alone;
plugin API: what a device implements (``Plugin``, compiled model, requests, executors,
queue engine, state, blob framing) and ``PluginCore``, what a plugin needs of the Core;
devices: the CPU device (its compiler and kernels) and the others; core: the ``Core``,
the model cache, ``AsyncInferQueue``, compiled files; generation and pipelines: decoding
and the text pipelines (tokenizer, pooling) over a compiled model; public API: the
package's ``__init__``, which re-exports the layers below; serving: the service and its
transports; applications: what runs the rest (the ONNX backend API, the command line and
what its commands share, Ray Serve, the conformance suite, and the PROCESS device's worker
program, which compiles with a Core of its own and hands it to the worker as a function).
"""

KINDS = ("module", "type", "lazy")


@dataclass(frozen=True)
class Edge:
    """``importer`` imports ``imported`` (both module names), at ``line``, of ``kind``."""

    importer: str
    imported: str
    kind: str
    line: int


def modules(root: Path = ROOT) -> dict[str, Path]:
    """Every module of the package by its name (a package by its ``__init__``)."""
    found = {}
    for path in sorted((root / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def layer_of(module: str) -> int:
    """The index in :data:`LAYERS` of the longest prefix of ``module`` listed there."""
    best, best_length = -1, -1
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best_length:
                best, best_length = index, len(prefix)
    if best < 0:
        raise ValueError(f"module {module!r} is in no layer of LAYERS")
    return best


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.Module) -> Iterator[tuple[ast.Import | ast.ImportFrom, str]]:
    """Every import statement of ``tree`` with its kind."""

    def walk(node: ast.AST, kind: str) -> Iterator[tuple[ast.Import | ast.ImportFrom, str]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import | ast.ImportFrom):
                yield child, kind
            elif isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                yield from walk(child, "lazy")
            elif isinstance(child, ast.If) and _is_type_checking(child.test):
                for statement in child.body:
                    yield from walk_one(statement, "type" if kind == "module" else kind)
                for statement in child.orelse:
                    yield from walk_one(statement, kind)
            else:
                yield from walk(child, kind)

    def walk_one(node: ast.AST, kind: str) -> Iterator[tuple[ast.Import | ast.ImportFrom, str]]:
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node, kind
        else:
            yield from walk(node, kind)

    yield from walk(tree, "module")


def _targets(
    statement: ast.Import | ast.ImportFrom, importer: str, is_package: bool, known: set[str]
) -> Iterator[str]:
    """The modules of the package ``statement`` (in ``importer``) imports."""
    if isinstance(statement, ast.Import):
        for alias in statement.names:
            if alias.name == PACKAGE or alias.name.startswith(PACKAGE + "."):
                yield alias.name
        return
    if statement.level:
        base = importer.split(".")
        if not is_package:
            base.pop()
        base = base[: len(base) - (statement.level - 1)]
        source = ".".join([*base, *([statement.module] if statement.module else [])])
    else:
        source = statement.module or ""
    if source != PACKAGE and not source.startswith(PACKAGE + "."):
        return
    for alias in statement.names:
        submodule = f"{source}.{alias.name}"
        yield submodule if submodule in known else source


def edges(root: Path = ROOT) -> list[Edge]:
    """Every import between two modules of the package, once per statement and target."""
    found = modules(root)
    known = set(found)
    result: set[Edge] = set()
    for importer, path in found.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        for statement, kind in _imports(tree):
            for imported in _targets(statement, importer, path.name == "__init__.py", known):
                if imported in known:
                    result.add(Edge(importer, imported, kind, statement.lineno))
    return sorted(result, key=lambda e: (e.importer, e.line, e.imported))


def circles(graph: list[Edge]) -> list[list[str]]:
    """The strongly connected components of two or more modules (or of one module that
    imports itself), each sorted, in name order (Tarjan's algorithm, iterative)."""
    successors: dict[str, set[str]] = {}
    for edge in graph:
        successors.setdefault(edge.importer, set()).add(edge.imported)
        successors.setdefault(edge.imported, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    for start in sorted(successors):
        if start in index:
            continue
        work = [(start, iter(sorted(successors[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1 or node in successors[node]:
                        components.append(sorted(component))
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(successors[child]))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return sorted(components)


def upward(graph: list[Edge]) -> list[Edge]:
    """The imports from a module of a lower layer to one of a higher layer."""
    return [e for e in graph if layer_of(e.importer) < layer_of(e.imported)]


def _device(module: str) -> str | None:
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[1] == "devices" else None


def across_devices(graph: list[Edge]) -> list[Edge]:
    """The imports from one device's package into another's (``devices.cpu`` ->
    ``devices.batch``): a device knows the plugin API, not its neighbours."""
    return [
        e
        for e in graph
        if None not in (_device(e.importer), _device(e.imported))
        and _device(e.importer) != _device(e.imported)
    ]


def report(graph: list[Edge]) -> str:
    """The layers, the circles and the climbs, for a reader."""
    names = sorted({e.importer for e in graph} | {e.imported for e in graph} | set(modules()))
    lines = ["Layers (bottom first; a layer imports only itself and those below):"]
    for number, (layer, prefixes) in enumerate(LAYERS):
        members = sum(layer_of(name) == number for name in names)
        lines.append(f"  {number} {layer} ({members} modules): " + ", ".join(prefixes))
    found = circles(graph)
    lines.append(f"\nCircles: {len(found)}")
    for component in found:
        members = set(component)
        lines.append(f"  {len(component)} modules: " + ", ".join(component))
        for e in graph:
            if e.importer in members and e.imported in members:
                lines.append(f"    {e.importer}:{e.line} -> {e.imported} ({e.kind})")
    climbs = upward(graph)
    lines.append(f"\nUpward imports: {len(climbs)}")
    for e in climbs:
        below, above = LAYERS[layer_of(e.importer)][0], LAYERS[layer_of(e.imported)][0]
        lines.append(f"  {e.importer}:{e.line} -> {e.imported} ({e.kind}; {below} -> {above})")
    sideways = across_devices(graph)
    lines.append(f"\nImports between devices: {len(sideways)}")
    lines += [f"  {e.importer}:{e.line} -> {e.imported} ({e.kind})" for e in sideways]
    counts = {kind: sum(e.kind == kind for e in graph) for kind in KINDS}
    lines.append(
        f"\n{len(graph)} imports between {len(names)} modules "
        + ", ".join(f"{counts[kind]} {kind}" for kind in KINDS)
    )
    return "\n".join(lines)


def figures(graph: list[Edge]) -> dict[str, object]:
    """The circles, the climbs and the imports between devices as data:
    ``{"circles": [[module, ...], ...], "upward": [[importer, imported, kind], ...],
    "across_devices": [[importer, imported, kind], ...]}`` (an import once per pair and
    kind)."""

    def pairs(found: list[Edge]) -> list[list[str]]:
        return [list(pair) for pair in sorted({(e.importer, e.imported, e.kind) for e in found})]

    return {
        "circles": circles(graph),
        "upward": pairs(upward(graph)),
        "across_devices": pairs(across_devices(graph)),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    options = parser.parse_args(argv)
    graph = edges()
    print(json.dumps(figures(graph), indent=1) if options.json else report(graph))
    return 0


if __name__ == "__main__":
    sys.exit(main())
