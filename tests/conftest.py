"""Shared fixtures: every async test (``@pytest.mark.anyio``) runs under asyncio and trio."""

from __future__ import annotations

import pytest

import aioinfer
from aioinfer.testing.fixtures import anyio_backend  # noqa: F401  (asyncio and trio)

# The conformance suite's options (tests/behaviour runs it), also when the installed
# metadata predates its pytest11 entry point.
pytest_plugins = ["aioinfer.testing.plugin"]


@pytest.fixture(scope="module")
def core() -> aioinfer.Core:
    """A Core shared by one test module (a module that needs a fresh one per test
    defines its own)."""
    return aioinfer.Core()
