"""The device conformance suite: the behaviour every aioinfer device shows, as pytest
tests that run on the devices installed (found through the ``aioinfer.plugins`` entry
points), or on those a run selects.

A device package runs it on its own device::

    pip install 'aioinfer[testing]' -e .
    pytest --pyargs aioinfer.testing --aioinfer-device MYDEV

or names the device once, in its ``pyproject.toml``, and runs
``pytest --pyargs aioinfer.testing``::

    [tool.pytest.ini_options]
    aioinfer_devices = ["MYDEV"]

The suite's modules are ``test_*.py`` here; :mod:`aioinfer.testing.fixtures` gives their
fixtures, :mod:`aioinfer.testing.devices` finds the devices and their capabilities,
:mod:`aioinfer.testing.models` builds the models, and :mod:`aioinfer.testing.plugin` is
the pytest plugin (the ``pytest11`` entry point) that adds the options. See
docs/plugins.md.
"""
