"""Passes over the IR: ours, one per module; :mod:`.pipelines` orders them with onnx-ir's."""
