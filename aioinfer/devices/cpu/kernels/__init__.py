"""The CPU device's kernels, one module per operator family.

Importing this package registers every kernel (see :mod:`.registry`).
"""

from aioinfer.devices.cpu.kernels import (  # noqa: F401  (import registers the kernels)
    activations,
    attention,
    controlflow,
    conv,
    conv_transpose,
    decoding,
    detection,
    elementwise,
    fallback,
    fused,
    indexing,
    loss,
    lstm_stack,
    matmul,
    normalization,
    optional,
    pool,
    quantization,
    random,
    recurrent,
    reduction,
    resize,
    sampling,
    sequence,
    shape,
    signal,
)
