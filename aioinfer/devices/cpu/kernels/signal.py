"""Signal processing kernels: DFT, STFT and the Hann, Hamming and Blackman windows.

A complex tensor is a real tensor with a last axis of 2 (real, imaginary); a real signal
has a last axis of 1. Transforms run in numpy's FFT, in single precision for float32 and
float16 inputs, and return the input's dtype.
"""

from __future__ import annotations

import numpy as np
import onnx

from aioinfer.devices.cpu.kernels.registry import Kernel, NodeSpec, kernel


def _complex(x: np.ndarray) -> np.ndarray:
    """(..., 1) real or (..., 2) complex pairs -> a complex array without the last axis."""
    dtype = np.result_type(x.dtype, np.complex64)  # float32 stays single precision
    if x.shape[-1] == 1:
        return x[..., 0].astype(dtype)
    if x.shape[-1] == 2:
        return (x[..., 0] + 1j * x[..., 1]).astype(dtype)
    raise ValueError(f"the last axis must be 1 (real) or 2 (complex), got shape {x.shape}")


def _pairs(z: np.ndarray) -> np.ndarray:
    """A complex array as (..., 2) real/imaginary pairs."""
    return np.stack((z.real, z.imag), axis=-1)


def _scalar(value: np.ndarray | None, default: int) -> int:
    return default if value is None else int(np.asarray(value).reshape(-1)[0])


@kernel("DFT", since=17)
def _dft(spec: NodeSpec) -> Kernel:
    """DFT-17 (``axis`` attribute, default 1) and DFT-20 (``axis`` input, default -2)."""
    inverse = bool(spec.attr("inverse", 0))
    onesided = bool(spec.attr("onesided", 0))
    axis_attr = int(spec.attr("axis", 1))

    def run(
        x: np.ndarray, dft_length: np.ndarray | None = None, axis_input: np.ndarray | None = None
    ) -> tuple[np.ndarray]:
        axis = axis_attr if spec.opset < 20 else _scalar(axis_input, -2)
        # The last axis holds the complex parts; it cannot be the axis.
        if not (-x.ndim <= axis <= -2 or 0 <= axis <= x.ndim - 2):
            raise ValueError(f"DFT: axis {axis} is out of range for an input of shape {x.shape}")
        axis %= x.ndim
        default = 2 * (x.shape[axis] - 1) if inverse and onesided else x.shape[axis]
        length = _scalar(dft_length, default)
        signal = _complex(x)
        if inverse and onesided:  # one-sided spectrum -> real signal
            out = np.fft.irfft(signal, n=length, axis=axis)[..., None]
        elif inverse:
            out = _pairs(np.fft.ifft(signal, n=length, axis=axis))
        else:
            spectrum = np.fft.fft(signal, n=length, axis=axis)
            if onesided:
                spectrum = np.take(spectrum, range(length // 2 + 1), axis=axis)
            out = _pairs(spectrum)
        return (out.astype(x.dtype),)

    return run


@kernel("STFT", since=17)
def _stft(spec: NodeSpec) -> Kernel:
    onesided = bool(spec.attr("onesided", 1))

    def run(
        signal: np.ndarray,
        frame_step: np.ndarray,
        window: np.ndarray | None = None,
        frame_length: np.ndarray | None = None,
    ) -> tuple[np.ndarray]:
        samples = _complex(signal)  # (batch, length)
        default = samples.shape[1] if window is None else window.shape[0]
        length = _scalar(frame_length, default)
        if window is not None and window.shape[0] != length:
            raise ValueError(
                f"STFT: the window has {window.shape[0]} values, frame_length is {length}"
            )
        step = _scalar(frame_step, 1)
        count = (samples.shape[1] - length) // step + 1
        if count < 1:
            raise ValueError(
                f"STFT: a signal of {samples.shape[1]} samples has no frame of {length}"
            )
        starts = np.arange(count) * step
        frames = samples[:, starts[:, None] + np.arange(length)]  # (batch, frames, length)
        if window is not None:
            frames = frames * window
        spectrum = np.fft.fft(frames, n=length, axis=-1)
        if onesided:
            spectrum = spectrum[..., : length // 2 + 1]
        return (_pairs(spectrum).astype(signal.dtype),)

    return run


def _register_window(op_type: str, coefficients: tuple[float, ...]) -> None:
    """A generalized cosine window ``sum_k (-1)^k a_k cos(2 pi k n / N)``, with ``N`` the
    size (periodic) or the size minus one (symmetric)."""

    def factory(spec: NodeSpec) -> Kernel:
        periodic = bool(spec.attr("periodic", 1))
        dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(int(spec.attr("output_datatype", 1))))

        def run(size: np.ndarray) -> tuple[np.ndarray]:
            count = _scalar(size, 0)
            span = count if periodic else count - 1
            phase = 2 * np.pi * np.arange(count) / max(span, 1)
            window = np.zeros(count)
            for k, a in enumerate(coefficients):
                window += (-1) ** k * a * np.cos(k * phase)
            return (window.astype(dtype),)

        return run

    kernel(op_type, since=17)(factory)


_register_window("HannWindow", (0.5, 0.5))
_register_window("HammingWindow", (25 / 46, 21 / 46))
_register_window("BlackmanWindow", (0.42, 0.5, 0.08))
