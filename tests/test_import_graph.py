"""The import graph of the package (``scripts/import_graph.py``): no import circle other
than a device's own compiled model and request, no import from a lower layer to a higher
one, no import between two devices.

The rule for circles: the only circle allowed is a pair of modules of one device's
package, its ``request`` module (which defines the device's ``SyncInferRequest``) and the
module that defines its ``CompiledModel`` (``compiled_model``, or ``plugin`` where the
device keeps its compiled model there): the template plugin's split, where the compiled
model makes its requests and a request names the compiled model it reads. Anything else
that needs another module back names a Protocol of what it needs, or is handed a function.

The lists of upward imports and imports between devices hold what exists today, with the
reason; they may only shrink (the test fails when something new appears, and also when a
listed entry is gone without being removed from its list).
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "import_graph.py"

UPWARD: dict[tuple[str, str, str], str] = {}
"""Every import from a lower layer to a higher one today: (importer, imported, kind) ->
why it exists."""

ACROSS_DEVICES: dict[tuple[str, str, str], str] = {}
"""Every import from one device's package into another's today."""


def _defines_subclass_of(module: str, base: str, root: Path = ROOT) -> bool:
    """Whether ``module``'s source defines a class whose bases name ``base``."""
    parts = module.split(".")
    path = root.joinpath(*parts).with_suffix(".py")
    if not path.exists():
        path = root.joinpath(*parts, "__init__.py")
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ClassDef):
            for named in node.bases:
                name = named.attr if isinstance(named, ast.Attribute) else getattr(named, "id", "")
                if name == base:
                    return True
    return False


def is_compiled_model_and_request(members: list[str], root: Path = ROOT) -> bool:
    """Whether the circle ``members`` is the one the rule allows (see the module): two
    modules of one device's package, its ``request`` module with a ``SyncInferRequest``
    and the module with its ``CompiledModel``."""
    if len(members) != 2:
        return False
    packages = {member.rpartition(".")[0] for member in members}
    if len(packages) != 1:
        return False
    (package,) = packages
    if not package.startswith("aioinfer.devices.") or package.count(".") != 2:
        return False
    request = f"{package}.request"
    if request not in members:
        return False
    (other,) = set(members) - {request}
    return _defines_subclass_of(request, "SyncInferRequest", root) and _defines_subclass_of(
        other, "CompiledModel", root
    )


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


def test_no_import_circle_but_a_devices_compiled_model_and_request(figures) -> None:
    circles = figures["circles"]
    others = [members for members in circles if not is_compiled_model_and_request(members)]
    assert not others, (
        "import circles other than a device's compiled model and request (break them with "
        f"a Protocol of what the importing module needs, or a function handed to it): {others}"
    )


def test_the_circle_rule_refuses_what_is_not_a_devices_pair() -> None:
    """The rule itself, on circles that existed or could: only the pairs pass."""
    assert is_compiled_model_and_request(
        ["aioinfer.devices.cpu.plugin", "aioinfer.devices.cpu.request"]
    )
    assert is_compiled_model_and_request(
        ["aioinfer.devices.openvino.compiled_model", "aioinfer.devices.openvino.request"]
    )
    refused = [
        ["aioinfer.bench", "aioinfer.cli"],
        ["aioinfer.serving.generation", "aioinfer.serving.service"],
        ["aioinfer.plugin.compiled_model", "aioinfer.plugin.sync_request"],
        # the queue engine defines a SyncInferRequest too, but is not the request module
        ["aioinfer.devices.openvino.compiled_model", "aioinfer.devices.openvino.queue_engine"],
        # the plugin module of OPENVINO holds no compiled model
        ["aioinfer.devices.openvino.plugin", "aioinfer.devices.openvino.request"],
        ["aioinfer.devices.cpu.plugin", "aioinfer.devices.ort.request"],
        [
            "aioinfer.devices.openvino.compiled_model",
            "aioinfer.devices.openvino.plugin",
            "aioinfer.devices.openvino.request",
        ],
    ]
    assert [c for c in refused if is_compiled_model_and_request(c)] == []


def test_no_new_import_from_a_lower_layer_to_a_higher_one(figures) -> None:
    compare({tuple(u) for u in figures["upward"]}, set(UPWARD), "upward import")


def test_no_new_import_between_devices(figures) -> None:
    compare(
        {tuple(u) for u in figures["across_devices"]}, set(ACROSS_DEVICES), "import between devices"
    )


def test_the_report_prints_the_layers_and_the_circles(figures) -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT)], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "Layers (bottom first" in done.stdout
    assert f"\nCircles: {len(figures['circles'])}\n" in done.stdout
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
