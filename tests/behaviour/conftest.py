"""The conformance suite (:mod:`aioinfer.testing`) over every device the Core finds: the
built-in ones, the engine devices whose packages are installed, the virtual devices over
each of them, and the example third-party device ``TWOSTAGE`` (``examples/custom_device``),
which ``tests/conftest.py`` puts on the path with its entry point (nothing is installed
while collecting; :mod:`tests.behaviour.test_discovery` installs it for real).
"""

from __future__ import annotations

from aioinfer.testing.fixtures import *  # noqa: F403
