"""The plugin API: what a device implements (see the plugin developer guide in docs/)."""

from aioinfer.plugin.async_request import AsyncInferRequest
from aioinfer.plugin.blob import ExportedModel
from aioinfer.plugin.compiled_model import CompiledModel
from aioinfer.plugin.executors import (
    AwaitExecutor,
    Executor,
    LoopExecutor,
    ThreadExecutor,
    streams_for,
)
from aioinfer.plugin.plugin import Plugin, PluginCore, VirtualPlugin
from aioinfer.plugin.queue_engine import QueueEngine
from aioinfer.plugin.sync_request import SyncInferRequest

__all__ = [
    "AsyncInferRequest",
    "AwaitExecutor",
    "CompiledModel",
    "Executor",
    "ExportedModel",
    "LoopExecutor",
    "Plugin",
    "PluginCore",
    "QueueEngine",
    "SyncInferRequest",
    "ThreadExecutor",
    "VirtualPlugin",
    "streams_for",
]
