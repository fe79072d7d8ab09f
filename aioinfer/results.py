"""InferResults: the outputs of one inference, by name and by position."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

import numpy as np

from aioinfer.model import Port, find_port


class InferResults(Mapping[str, np.ndarray]):
    """Output arrays of one inference.

    ``results["y"]`` and ``results[0]`` (or a :class:`Port`) address the same array.
    Iterating yields output names, like a dict. The arrays belong to the caller: a later
    inference never overwrites them.
    """

    __slots__ = ("_arrays", "_ports")

    def __init__(self, ports: Sequence[Port], arrays: Sequence[np.ndarray]) -> None:
        self._ports = ports
        self._arrays = arrays

    def __getitem__(self, key: str | int | Port) -> np.ndarray:
        return self._arrays[find_port(self._ports, key, "output").index]

    def __iter__(self) -> Iterator[str]:
        return (p.name for p in self._ports)

    def __len__(self) -> int:
        return len(self._ports)

    def to_tuple(self) -> tuple[np.ndarray, ...]:
        """The arrays in output order."""
        return tuple(self._arrays)

    def to_dict(self) -> dict[str, np.ndarray]:
        """A plain dict from output name to array."""
        return {p.name: a for p, a in zip(self._ports, self._arrays)}

    def __repr__(self) -> str:
        items = ", ".join(
            f"{p.name}: {a.dtype}{list(a.shape)}" for p, a in zip(self._ports, self._arrays)
        )
        return f"<InferResults {items}>"
