"""Which opset version applies to a node, and which versions a device supports."""

from __future__ import annotations

from collections.abc import Mapping

import onnx_ir as ir

from aioinfer.errors import UnsupportedOpsetError

MAX_ONNX_OPSET = 28
"""The newest ``ai.onnx`` opset the CPU device implements: its kernels follow the
operator changes up to this version (that of the oldest onnx package aioinfer accepts).
A newer opset may change an operator's meaning without changing its name, so a model
importing one is refused rather than run with older semantics."""


def node_opset(node: ir.Node, opsets: Mapping[str, int]) -> int:
    """The version of ``node``'s domain imported by the model ("ai.onnx" is "")."""
    domain = "" if node.domain == "ai.onnx" else node.domain
    if domain in opsets:
        return opsets[domain]
    return opsets.get("ai.onnx", opsets.get("", 1)) if domain == "" else 1


def check_onnx_opset(opsets: Mapping[str, int], device: str, maximum: int) -> None:
    """Refuse a model whose ``ai.onnx`` opset import is newer than ``maximum``.

    Raises:
        UnsupportedOpsetError: names the model's version, the device and ``maximum``.
    """
    for domain in ("", "ai.onnx"):
        version = opsets.get(domain)
        if version is not None and version > maximum:
            raise UnsupportedOpsetError(
                f"the model imports ai.onnx opset {version}; device {device!r} supports "
                f"ai.onnx opsets up to {maximum}: export the model with opset {maximum} "
                "or older"
            )
