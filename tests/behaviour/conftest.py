"""The conformance suite (:mod:`aioinfer.testing`) over every installed device: the
built-in ones, the engine devices whose packages are installed, the virtual devices over
each of them, and the example third-party device ``TWOSTAGE`` (``examples/custom_device``).

The example package is installed into the running environment when it is missing
(``pip install -e``, without dependencies; without build isolation when hatchling is
present, so only the package registry is ever needed), and found by the Core through its
``aioinfer.plugins`` entry point, as any third-party device would be. It is installed
when this file is loaded, before the suite's modules here are collected and list the
devices; when the installed one is another checkout's, this checkout's is imported.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
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


def use_this_checkouts_example() -> None:
    """Import the example device from this checkout, in this process and in the ones it
    starts (worker processes, fresh interpreters), when the installed one is another
    checkout's (an editable install made from another working tree): the tests are of
    this checkout, as ``PYTHONPATH`` makes them for aioinfer itself."""
    spec = importlib.util.find_spec("aioinfer_twostage")
    if spec is None or spec.origin is None or Path(spec.origin).is_relative_to(EXAMPLE_DEVICE):
        return
    sys.path.insert(0, str(EXAMPLE_DEVICE))
    paths = [str(EXAMPLE_DEVICE), os.environ.get("PYTHONPATH", "")]
    os.environ["PYTHONPATH"] = os.pathsep.join(path for path in paths if path)
    importlib.invalidate_caches()


install_example_device()
use_this_checkouts_example()
