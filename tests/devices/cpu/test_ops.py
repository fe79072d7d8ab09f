"""The CPU device's own operators: declared once, registered by the kernels, built by the
passes through the declaration."""

from __future__ import annotations

import ast
from pathlib import Path

import onnx_ir as ir
import pytest

import aioinfer
from aioinfer.devices.cpu import ops
from aioinfer.devices.cpu.kernels.registry import registered_operators

PACKAGE = Path(aioinfer.__file__).parent


def _imported_modules(path: Path) -> set[str]:
    """The modules ``path`` imports (absolute imports, at any depth of the file)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


def test_every_declared_op_has_a_kernel_and_every_kernel_of_the_domain_is_declared() -> None:
    registered = {op for domain, op in registered_operators() if domain == ops.DOMAIN}
    assert registered == set(ops.OPS)


def test_every_kernel_of_the_domain_is_fused() -> None:
    for (domain, _), entries in registered_operators().items():
        if domain == ops.DOMAIN:
            assert [e.execution_type for e in entries] == ["fused"] * len(entries)


def test_a_node_carries_the_declared_name_domain_and_attributes() -> None:
    x = ir.Value(name="x")
    node = ops.GRU_GATES.node([x, x, x], [ops.HIDDEN_SIZE(4)], name="gates")
    assert (node.domain, node.op_type, node.name) == ("ai.aioinfer", "GRUGates", "gates")
    assert node.attributes["hidden_size"].as_int() == 4
    assert ops.GRU_GATES.matches(node)
    assert not ops.CAST_ADD.matches(node)


def test_an_undeclared_attribute_is_refused_naming_it() -> None:
    x = ir.Value(name="x")
    with pytest.raises(ValueError, match=r"\['hidden_size'\].*got \['hidden'\]"):
        ops.GRU_GATES.node([x, x, x], [ir.AttrInt64("hidden", 4)])


def test_an_op_extending_an_onnx_op_takes_its_attributes() -> None:
    x = ir.Value(name="x")
    node = ops.FUSED_CONV.node([x, x], [ir.AttrInt64s("strides", [2, 2]), ops.ACTIVATION("Relu")])
    assert list(node.attributes) == ["strides", "activation"]


def test_kernels_take_op_names_from_the_declarations_not_from_passes() -> None:
    kernels = PACKAGE / "devices" / "cpu" / "kernels"
    for path in sorted(kernels.glob("*.py")):
        passes = {
            m
            for m in _imported_modules(path)
            if m.startswith(("aioinfer.transforms", "aioinfer.devices.cpu.passes"))
        }
        assert passes == set(), f"{path.name} imports {sorted(passes)}"
