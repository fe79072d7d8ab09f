"""The pytest plugin of the conformance suite: how a run selects its devices.

pytest loads it through the ``pytest11`` entry point of the aioinfer package, so that
``pytest --pyargs aioinfer.testing --aioinfer-device MYDEV`` knows the option; it adds
nothing else to a test session (the suite's fixtures live beside its tests).
"""

from __future__ import annotations

import pytest

OPTION = "--aioinfer-device"
INI = "aioinfer_devices"
"""The option and the ini setting; both land in ``aioinfer_devices``, which
:func:`aioinfer.testing.fixtures.selected_devices` reads."""


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("aioinfer", "aioinfer conformance suite")
    group.addoption(
        OPTION,
        action="append",
        dest="aioinfer_devices",
        default=[],
        metavar="DEVICE",
        help="run the conformance suite on DEVICE only (repeat, or separate names by "
        "commas): a device ('CPU'), a virtual device over a target ('BATCH:CPU') or a "
        "virtual device alone (over each selected, else each installed, device). "
        "Default: every device installed.",
    )
    parser.addini(
        INI,
        type="args",
        default=[],
        help=f"the devices of {OPTION}, when the command line names none",
    )


def pytest_configure(config: pytest.Config) -> None:
    """Check a selection of devices once, before anything is collected: a device that is
    not installed stops the run with one error, not one per module of the suite."""
    if config.getoption("aioinfer_devices") or config.getini(INI):
        from aioinfer.testing.fixtures import devices_of_run

        devices_of_run(config)
