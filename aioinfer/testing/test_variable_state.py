"""Variable state written and read on each device, as OpenVINO's ``state.state = tensor``
is used: the value written from a new buffer is the one read back and the one the next
step starts from; it is a copy (the buffer may be reused at once); a value of another
batch size replaces it; reading gives a read-only array."""

from __future__ import annotations

import numpy as np
import pytest

import aioinfer as ai
from aioinfer.testing.fixtures import compile_accumulator

pytestmark = pytest.mark.anyio


async def test_state_written_from_a_new_buffer_reads_back(every_device):
    core = ai.Core()
    try:
        compiled = compile_accumulator(core, every_device, stateful=True)
    except ai.NotBatchableError:
        pytest.skip("a batching device may refuse STATEFUL (with NotBatchableError only)")
    try:
        request = compiled.create_infer_request()
        (state,) = request.query_state()
        assert state.name == "past"
        buffer = np.full((2, 4), 5, np.int64)
        state.state = buffer
        buffer[:] = 100  # copied when written: the caller's buffer is its own again
        np.testing.assert_array_equal(state.state, np.full((2, 4), 5))
        np.testing.assert_array_equal(request.query_state()[0].state, np.full((2, 4), 5))
        assert not state.state.flags.writeable
        results = await request.infer({"x": np.ones((2, 4), np.int64)})
        np.testing.assert_array_equal(results["y"], np.full((2, 4), 6))
        np.testing.assert_array_equal(state.state, np.full((2, 4), 6))
        # A value of another batch size, from a strided view of a larger buffer.
        larger = np.arange(24, dtype=np.int64).reshape(6, 4)
        state.state = larger[::2]
        np.testing.assert_array_equal(state.state, larger[::2])
        results = await request.infer({"x": np.ones((3, 4), np.int64)})
        np.testing.assert_array_equal(results["y"], larger[::2] + 1)
        np.testing.assert_array_equal(state.state, larger[::2] + 1)
        # A value the variable cannot hold is refused, and the state stays.
        with pytest.raises(ai.InputTypeError, match="'past'"):
            state.state = np.ones((3, 4), np.float32)
        with pytest.raises(ai.InputShapeError, match="'past'"):
            state.state = np.ones((3, 5), np.int64)
        np.testing.assert_array_equal(state.state, larger[::2] + 1)
        state.reset()
        results = await request.infer({"x": np.ones((2, 4), np.int64)})
        np.testing.assert_array_equal(results["y"], np.ones((2, 4)))
    finally:
        await compiled.close()
