"""The PROCESS virtual device (the model runs on its target device in a worker process)."""

from aioinfer.devices.process.plugin import ProcessCompiledModel, ProcessPlugin

__all__ = ["ProcessCompiledModel", "ProcessPlugin"]
