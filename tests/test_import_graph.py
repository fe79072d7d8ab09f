"""The import graph of the package (``scripts/import_graph.py``): no new circle, no new
import from a lower layer to a higher one, no new import between two devices.

Each list below holds what exists today, with the reason; it may only shrink. The test
fails when something new appears, and also when a listed entry is gone without being
removed from its list, so that the lists say what is true. A circle that splits into
smaller ones is a new circle or several: list the smaller ones instead of the larger.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "import_graph.py"

CIRCLES: dict[tuple[str, ...], str] = {
    (
        "aioinfer.devices.batch.plugin",
        "aioinfer.devices.batch.request",
    ): "the device's own compiled model and request name each other",
    (
        "aioinfer.devices.cpu.plugin",
        "aioinfer.devices.cpu.request",
    ): "the device's own compiled model and request name each other",
    (
        "aioinfer.devices.openvino.compiled_model",
        "aioinfer.devices.openvino.plugin",
        "aioinfer.devices.openvino.queue_engine",
        "aioinfer.devices.openvino.request",
    ): "the device's compiled model and request, with its plugin and queue engine naming "
    "the compiled model (type-only and lazy)",
    (
        "aioinfer.devices.ort.plugin",
        "aioinfer.devices.ort.request",
    ): "the device's own compiled model and request name each other",
    (
        "aioinfer.devices.process.plugin",
        "aioinfer.devices.process.request",
    ): "the device's own compiled model and request name each other",
}
"""Every import circle between files today: members (sorted) -> why it exists."""

UPWARD: dict[tuple[str, str, str], str] = {}
"""Every import from a lower layer to a higher one today: (importer, imported, kind) ->
why it exists."""

ACROSS_DEVICES: dict[tuple[str, str, str], str] = {}
"""Every import from one device's package into another's today."""


@pytest.fixture(scope="module")
def figures() -> dict[str, list[list[str]]]:
    """What the script prints with ``--json``, run as a user runs it."""
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--json"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def compare(found: set[tuple[str, ...]], listed: set[tuple[str, ...]], what: str) -> None:
    new, gone = sorted(found - listed), sorted(listed - found)
    assert not new, f"new {what} (remove it, or list it with a reason): {new}"
    assert not gone, f"{what} no longer found: remove it from the list: {gone}"


def test_no_new_import_circle(figures) -> None:
    compare({tuple(c) for c in figures["circles"]}, set(CIRCLES), "import circle")


def test_no_new_import_from_a_lower_layer_to_a_higher_one(figures) -> None:
    compare({tuple(u) for u in figures["upward"]}, set(UPWARD), "upward import")


def test_no_new_import_between_devices(figures) -> None:
    compare(
        {tuple(u) for u in figures["across_devices"]}, set(ACROSS_DEVICES), "import between devices"
    )


def test_the_report_prints_the_layers_and_the_circles() -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT)], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "Layers (bottom first" in done.stdout
    assert f"Circles: {len(CIRCLES)}\n" in done.stdout
    assert f"Upward imports: {len(UPWARD)}\n" in done.stdout
    assert "  0 foundation" in done.stdout and "aioinfer.errors" in done.stdout


def test_the_graph_sees_each_kind_of_import(tmp_path) -> None:
    """A package made for the test: a module-level, a type-only and a lazy import, a
    relative one, and a circle through them; the script finds each, of its kind."""
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import import_graph
    finally:
        sys.path.remove(str(SCRIPT.parent))
    package = tmp_path / "aioinfer"
    (package / "plugin").mkdir(parents=True)
    (package / "__init__.py").write_text("from aioinfer.core import Core\n")
    (package / "errors.py").write_text("")
    (package / "core.py").write_text(
        "from aioinfer.plugin import plugin\nfrom .errors import *\nclass Core: ...\n"
    )
    (package / "plugin" / "__init__.py").write_text("")
    (package / "plugin" / "plugin.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from aioinfer.core import Core\n"
        "def version():\n    from .. import errors\n    import aioinfer\n"
    )
    graph = {(e.importer, e.imported, e.kind) for e in import_graph.edges(tmp_path)}
    assert graph == {
        ("aioinfer", "aioinfer.core", "module"),
        ("aioinfer.core", "aioinfer.plugin.plugin", "module"),
        ("aioinfer.core", "aioinfer.errors", "module"),
        ("aioinfer.plugin.plugin", "aioinfer.core", "type"),
        ("aioinfer.plugin.plugin", "aioinfer.errors", "lazy"),
        ("aioinfer.plugin.plugin", "aioinfer", "lazy"),
    }
    edges = import_graph.edges(tmp_path)
    assert import_graph.circles(edges) == [["aioinfer", "aioinfer.core", "aioinfer.plugin.plugin"]]
    climbs = {(e.importer, e.imported) for e in import_graph.upward(edges)}
    assert climbs == {
        ("aioinfer.plugin.plugin", "aioinfer.core"),
        ("aioinfer.plugin.plugin", "aioinfer"),
    }
