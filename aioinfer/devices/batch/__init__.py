"""The BATCH virtual device (dynamic batching on top of another device)."""

from aioinfer.devices.batch.plugin import BatchCompiledModel, BatchPlugin, batch_problem

__all__ = ["BatchCompiledModel", "BatchPlugin", "batch_problem"]
