"""The conformance suite's module, over every installed device (see conftest.py)."""

from aioinfer.testing.test_callbacks import *  # noqa: F403
