"""The built-in CPU device (numpy kernels)."""

from aioinfer.devices.cpu.plugin import CPUCompiledModel, CPUPlugin

__all__ = ["CPUCompiledModel", "CPUPlugin"]
