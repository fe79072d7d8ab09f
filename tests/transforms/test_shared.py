"""The shared passes stay shared: they import no device and build none of a device's own
operators (the CPU's are in ``aioinfer.devices.cpu.passes``)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import aioinfer.transforms

SHARED = Path(aioinfer.transforms.__file__).parent


def _names(path: Path) -> set[str]:
    """The modules ``path`` imports and the names it reads."""
    tree = ast.parse(path.read_text(), str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.Name):
            found.add(node.id)
    return found


def test_the_shared_passes_import_no_device() -> None:
    for path in sorted(SHARED.glob("*.py")):
        devices = {n for n in _names(path) if n.startswith("aioinfer.devices")}
        assert devices == set(), f"{path.name} imports {sorted(devices)}"


def test_only_the_rewrite_base_names_the_aioinfer_domain() -> None:
    naming = {p.name for p in SHARED.glob("*.py") if "AIOINFER_DOMAIN" in _names(p)}
    assert naming == {"rewrite.py"}


def test_the_former_path_of_the_cpu_pipeline_still_gives_it_and_warns() -> None:
    from aioinfer.devices.cpu.passes.pipeline import compile_passes

    with pytest.warns(DeprecationWarning, match=r"aioinfer\.devices\.cpu\.passes\.pipeline"):
        from aioinfer.transforms.pipelines import compile_passes as former
    assert former is compile_passes


def test_the_former_pipeline_module_names_what_it_lacks() -> None:
    import aioinfer.transforms.pipelines as former

    with pytest.raises(AttributeError, match="folding_passes"):
        former.folding_passes  # noqa: B018
