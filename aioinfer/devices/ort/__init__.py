"""The ``ORT`` device: onnxruntime behind aioinfer's request pipeline (needs the
``onnxruntime`` extra)."""

try:
    import onnxruntime  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "the ORT device needs onnxruntime: pip install 'aioinfer[onnxruntime]'"
    ) from exc

from aioinfer.devices.ort.plugin import ORTCompiledModel, ORTPlugin

__all__ = ["ORTCompiledModel", "ORTPlugin"]
