"""Which opset version applies to a node."""

from __future__ import annotations

from collections.abc import Mapping

import onnx_ir as ir


def node_opset(node: ir.Node, opsets: Mapping[str, int]) -> int:
    """The version of ``node``'s domain imported by the model ("ai.onnx" is "")."""
    domain = "" if node.domain == "ai.onnx" else node.domain
    if domain in opsets:
        return opsets[domain]
    return opsets.get("ai.onnx", opsets.get("", 1)) if domain == "" else 1
