"""The suite's fixtures (:mod:`aioinfer.testing.fixtures`) for its tests, and its pytest
plugin, for a run that does not load it through the entry point (``pytest path/to/it``)."""

from aioinfer.testing.fixtures import *  # noqa: F403

pytest_plugins = ["aioinfer.testing.plugin"]
