"""The plugin API: what a device implements (see the plugin developer guide in docs/)."""

from aioinfer.plugin.async_request import AsyncInferRequest
from aioinfer.plugin.compiled_model import CompiledModel
from aioinfer.plugin.executors import Executor, LoopExecutor, ThreadExecutor
from aioinfer.plugin.plugin import Plugin, VirtualPlugin
from aioinfer.plugin.sync_request import SyncInferRequest

__all__ = [
    "AsyncInferRequest",
    "CompiledModel",
    "Executor",
    "LoopExecutor",
    "Plugin",
    "SyncInferRequest",
    "ThreadExecutor",
    "VirtualPlugin",
]
