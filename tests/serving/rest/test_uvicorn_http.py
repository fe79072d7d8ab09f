"""The uvicorn internals that ``serving/rest/uvicorn_http.py`` depends on are still
there in the installed uvicorn: this test fails when a uvicorn release changes them."""

from __future__ import annotations

import ast
import importlib
import inspect
import textwrap
from pathlib import Path
from typing import cast

import pytest

from aioinfer.serving.rest import uvicorn_http
from aioinfer.serving.rest.uvicorn_http import UVICORN_INTERNALS


def _instance_attributes(cls: type) -> set[str]:
    """The names ``self.<name> = ...`` assigns in the methods of ``cls`` and its bases."""
    names: set[str] = set()
    for klass in inspect.getmro(cls):
        if klass.__module__ == "builtins":
            continue
        tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        for node in ast.walk(tree):
            targets = node.targets if isinstance(node, ast.Assign) else []
            if isinstance(node, ast.AnnAssign | ast.AugAssign):
                targets = [node.target]
            for target in targets:
                value = getattr(target, "value", None)
                if isinstance(value, ast.Name) and value.id == "self":
                    names.add(cast(ast.Attribute, target).attr)
    return names


@pytest.mark.parametrize("qualified", sorted(UVICORN_INTERNALS))
def test_every_uvicorn_internal_used_is_there(qualified: str) -> None:
    module_name, name = qualified.split(":")
    found = getattr(importlib.import_module(module_name), name, None)
    assert found is not None, f"uvicorn has no {qualified} any more"
    if not inspect.isclass(found):
        assert not UVICORN_INTERNALS[qualified]
        return
    assigned = _instance_attributes(found)
    used = UVICORN_INTERNALS[qualified]
    missing = [name for name in used if not hasattr(found, name) and name not in assigned]
    assert missing == [], f"{qualified} has none of {missing} any more"


def test_every_uvicorn_import_is_listed() -> None:
    """The list is complete: every name the module imports from uvicorn is in it, and no
    other module of the package imports uvicorn's internals."""
    tree = ast.parse(Path(uvicorn_http.__file__).read_text())
    imported = {
        f"{node.module}:{alias.name}"
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("uvicorn")
        for alias in node.names
    }
    assert imported <= set(UVICORN_INTERNALS), imported - set(UVICORN_INTERNALS)
    package = Path(uvicorn_http.__file__).parents[2]
    others = sorted(
        str(path.relative_to(package))
        for path in package.rglob("*.py")
        if path != Path(uvicorn_http.__file__) and "uvicorn.protocols" in path.read_text()
    )
    assert others == []
