"""The OPENVINO device's own properties (the shared ones are in
:mod:`aioinfer.properties`)."""

from __future__ import annotations

from typing import Any

from aioinfer.properties import Property, non_negative_int


def _device_name(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError("expected a device name such as 'CPU'")
    return value


def _precision(value: Any) -> str:
    text = str(getattr(value, "value", value))
    if text.upper() == "AUTO":
        return "AUTO"
    if text.lower() not in ("f32", "bf16", "f16"):
        raise ValueError("expected one of f32, bf16, f16, AUTO")
    return text.lower()


OPENVINO_DEVICE = Property(
    "OPENVINO_DEVICE",
    "OPENVINO device: the OpenVINO device that computes ('CPU', 'GPU', 'NPU', ...).",
    default="CPU",
    parse=_device_name,
)
INFERENCE_PRECISION_HINT = Property(
    "INFERENCE_PRECISION_HINT",
    "OPENVINO device: the precision floating-point layers compute in: 'f32' (results "
    "agree with the other devices), 'bf16' or 'f16' (faster where the hardware has "
    "them, less precise), 'AUTO' (OpenVINO's choice). Read back: the one used.",
    default="f32",
    parse=_precision,
    auto="AUTO",
)
OPENVINO_INLINE_RUN_US = Property(
    "OPENVINO_INLINE_RUN_US",
    "OPENVINO device with one stream: an inference whose last one on inputs of the same "
    "shapes took less than this many microseconds runs on the event loop's thread when "
    "no other one is in flight, saving the hop through a waiting thread (0: never).",
    default=500,
    parse=non_negative_int,
    mutable=True,
)
