"""The KV cache of a batch of sequences, left-padded: the layout the scheduler batches.

A decoder's cache variable is ``[batch, ..., sequence, ...]`` (``[batch, heads, past,
head_dim]`` for Hugging Face exports). Rows of different lengths share one array by
right-aligning them: row ``i`` of length ``n_i`` fills the last ``n_i`` columns of the
sequence axis, the columns before are zeros that its ``attention_mask`` hides. A step
appends one column to every row (the decoder concatenates), so the layout holds from step
to step without any copy; it changes only when rows join or leave, and then
:func:`repack` builds the new arrays with one copy, trimming the columns that no remaining
row uses.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Block:
    """Rows of a left-padded batch: ``values`` one array per variable, ``rows`` the rows
    taken from them, in order."""

    values: Sequence[np.ndarray]
    rows: Sequence[int]


def sequence_axes(initial: Sequence[np.ndarray]) -> list[int] | None:
    """The sequence axis of each variable, from the variables' initial values before any
    input is set (zeros whose symbolic dimensions are all 0: the batch and the past
    sequence). None when a variable's layout cannot be batched this way: its batch is
    not the dynamic axis 0, or it has no single other dynamic axis."""
    axes = []
    for value in initial:
        empty = [axis for axis, size in enumerate(value.shape) if size == 0]
        if len(empty) != 2 or empty[0] != 0:
            return None
        axes.append(empty[1])
    return axes


def repack(axes: Sequence[int], blocks: Sequence[Block], width: int) -> list[np.ndarray]:
    """The arrays of the batch made of ``blocks``' rows in order, ``width`` columns along
    each variable's sequence axis (``axes``); each row keeps its last ``width`` columns
    (``width`` at least the longest row's length), right-aligned.

    A single block that takes every row of its arrays, in order, at their width is
    returned as it is (no copy)."""
    if len(blocks) == 1:
        only = blocks[0]
        first = only.values[0]
        if list(only.rows) == list(range(first.shape[0])) and first.shape[axes[0]] == width:
            return list(only.values)
    total = sum(len(block.rows) for block in blocks)
    packed = []
    for variable, axis in enumerate(axes):
        sample = blocks[0].values[variable]
        shape = list(sample.shape)
        shape[0], shape[axis] = total, width
        out = np.zeros(shape, sample.dtype)
        start = 0
        for block in blocks:
            source = block.values[variable]
            have = source.shape[axis]
            keep = min(width, have)
            rows = slice(start, start + len(block.rows))
            taken = source[np.asarray(block.rows, np.intp)]
            out[_columns(axis, width - keep, width, rows)] = taken[
                _columns(axis, have - keep, have)
            ]
            start += len(block.rows)
        packed.append(out)
    return packed


def attention_mask(lengths: Sequence[int], width: int, dtype: np.dtype) -> np.ndarray:
    """``[rows, width]``: ones over each row's last ``lengths[i]`` columns, zeros before."""
    columns = np.arange(width)
    starts = width - np.asarray(lengths, np.int64)
    return (columns[None, :] >= starts[:, None]).astype(dtype)


def _columns(axis: int, start: int, stop: int, rows: slice = slice(None)) -> tuple[Any, ...]:
    index: list[slice] = [slice(None)] * (axis + 1)
    index[0], index[axis] = rows, slice(start, stop)
    return (*index, Ellipsis)
