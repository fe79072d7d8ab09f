"""The conformance suite (:mod:`aioinfer.testing`) over every installed device: the
built-in ones, the engine devices whose packages are installed, the virtual devices over
each of them, and the example third-party device ``TWOSTAGE`` (``examples/custom_device``).

The example package is installed into the running environment when it is missing
(``pip install -e``, without dependencies; without build isolation when hatchling is
present, so only the package registry is ever needed), and found by the Core through its
``aioinfer.plugins`` entry point, as any third-party device would be. It is installed
when this file is loaded, before the suite's modules here are collected and list the
devices.
"""

from __future__ import annotations

import importlib
import importlib.util
import site
import subprocess
import sys
import sysconfig
from importlib.metadata import entry_points
from pathlib import Path

from aioinfer.testing.fixtures import *  # noqa: F403

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE_DEVICE = ROOT / "examples" / "custom_device"


def install_example_device() -> None:
    """Install ``examples/custom_device`` (editable) unless its entry point is present."""
    if not any(e.name == "TWOSTAGE" for e in entry_points(group="aioinfer.plugins")):
        command = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps"]
        if importlib.util.find_spec("hatchling") is not None:
            command.append("--no-build-isolation")
        subprocess.run([*command, "-e", str(EXAMPLE_DEVICE)], check=True)
    if importlib.util.find_spec("aioinfer_twostage") is None:
        # Installed during this run: read the editable install's new .pth file.
        site.addsitedir(sysconfig.get_paths()["purelib"])
        importlib.invalidate_caches()


install_example_device()
