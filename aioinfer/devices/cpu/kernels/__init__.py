"""The CPU device's kernels, one module per operator family.

Importing this package registers every kernel (see :mod:`.registry`).
"""

from aioinfer.devices.cpu.kernels import (  # noqa: F401  (import registers the kernels)
    activations,
    conv,
    elementwise,
    indexing,
    matmul,
    normalization,
    pool,
    reduction,
    resize,
    shape,
)
