"""Shared fixtures: every async test (``@pytest.mark.anyio``) runs under asyncio and trio.

The example third-party device ``TWOSTAGE`` is put on the path here, before any test
module is collected (nothing is installed: see :mod:`tests.example_device`).
"""

from __future__ import annotations

import pytest

import aioinfer
from aioinfer.testing.fixtures import anyio_backend  # noqa: F401  (asyncio and trio)
from tests.example_device import put_on_path

put_on_path()

# The conformance suite's options (tests/behaviour runs it), also when the installed
# metadata predates its pytest11 entry point.
pytest_plugins = ["aioinfer.testing.plugin"]


@pytest.fixture(scope="module")
def core() -> aioinfer.Core:
    """A Core shared by one test module (a module that needs a fresh one per test
    defines its own)."""
    return aioinfer.Core()
