"""The OPENVINO device: OpenVINO's runtime behind aioinfer's requests (needs the
``openvino`` package)."""

from aioinfer.devices.openvino.plugin import OpenVINOPlugin

__all__ = ["OpenVINOPlugin"]
