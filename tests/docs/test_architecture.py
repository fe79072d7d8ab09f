"""docs/architecture.md names what exists: every ``aioinfer.*`` name on the page is a
module of the package or a name one of its modules defines, and every layer of
``scripts/import_graph.py`` is on the page's map."""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "architecture.md"
ENTRY_POINT_GROUPS = {"aioinfer.plugins"}
"""Names on the page that are not modules: the entry-point group of devices."""


def _module_path(name: str) -> Path | None:
    base = ROOT.joinpath(*name.split("."))
    for path in (base / "__init__.py", base.with_suffix(".py")):
        if path.exists():
            return path
    return None


def _top_level_names(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.ImportFrom | ast.Import):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return names


def _exists(name: str) -> bool:
    """``name`` is a module, or a module's top-level name (read from its source: nothing
    is imported, so the optional extras need not be installed)."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        path = _module_path(".".join(parts[:cut]))
        if path is not None:
            rest = parts[cut:]
            return not rest or (len(rest) == 1 and rest[0] in _top_level_names(path))
    return False


def test_every_name_on_the_page_exists() -> None:
    names = set(re.findall(r"\baioinfer(?:\.[a-z_]+)+", PAGE.read_text())) - ENTRY_POINT_GROUPS
    assert len(names) > 20
    missing = sorted(name for name in names if not _exists(name))
    assert not missing, f"docs/architecture.md names what does not exist: {missing}"


def test_the_map_names_every_layer_of_the_import_graph() -> None:
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import import_graph
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    on_the_map = re.findall(r"^    (\S+(?: \S+)*)  +aioinfer", PAGE.read_text(), re.MULTILINE)
    layers = [layer for layer, _ in import_graph.LAYERS]
    assert on_the_map == layers[::-1], "the map's layers, top first, are not the graph's"
