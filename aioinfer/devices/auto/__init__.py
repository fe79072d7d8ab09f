"""The AUTO virtual device: compiles on the first device of a priority list that can run
the model (``ORT``, then ``OPENVINO``, then the numpy ``CPU`` by default)."""

from aioinfer.devices.auto.plugin import AutoCompiledModel, AutoPlugin

__all__ = ["AutoCompiledModel", "AutoPlugin"]
