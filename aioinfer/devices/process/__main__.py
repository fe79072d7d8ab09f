"""``python -m aioinfer.devices.process``: the worker process of the PROCESS device.

A program of its own: it compiles the parent's model with a Core of its own, handed to
the worker as a function (the device's modules sit below the Core and do not import it).
"""

from typing import Any

from aioinfer.core import Core
from aioinfer.devices.process.worker import main
from aioinfer.model import Model
from aioinfer.plugin.compiled_model import CompiledModel


def compile_model(model: Model, device: str, config: dict[str, Any]) -> CompiledModel:
    """``model`` compiled on ``device`` by a new Core, never auto-batched (as a virtual
    device compiles its target)."""
    return Core().compile_model(model, device, config, auto_batching=False)


main(compile_model)
