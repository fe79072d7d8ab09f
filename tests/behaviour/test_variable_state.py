"""The conformance suite's module, over every installed device (see conftest.py)."""

from aioinfer.testing.test_variable_state import *  # noqa: F403
