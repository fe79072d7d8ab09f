"""Shared fixtures: every async test (``@pytest.mark.anyio``) runs under asyncio and trio."""

from __future__ import annotations

import pytest

import aioinfer


@pytest.fixture(params=["asyncio", "trio"], scope="module")
def anyio_backend(request: pytest.FixtureRequest) -> str:
    """The anyio backend an async test runs on; parametrized so each test runs on both."""
    return str(request.param)


@pytest.fixture(scope="module")
def core() -> aioinfer.Core:
    """A Core shared by one test module (a module that needs a fresh one per test
    defines its own)."""
    return aioinfer.Core()
