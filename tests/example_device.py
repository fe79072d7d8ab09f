"""The example third-party device ``TWOSTAGE`` (``examples/custom_device``), made visible
to every Core of the test run without installing anything.

Its directory goes on ``sys.path``, and a distribution's metadata that declares its
``aioinfer.plugins`` entry point (read from the example's ``pyproject.toml``) is written
to a temporary directory that goes on ``sys.path`` too: the Core finds the device by
entry point, as it finds an installed one. Both directories also go on ``PYTHONPATH``,
so the processes a test starts (worker processes, fresh interpreters, the CLI) find it
the same way. Being first on the path, this checkout's example is the one imported even
when another checkout's is installed. ``tests/behaviour/test_discovery.py`` installs the
example for real (``pip install --target``) and checks that a fresh interpreter finds it.
"""

from __future__ import annotations

import atexit
import importlib
import os
import shutil
import sys
import tempfile
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # the test extra installs tomli on 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE_DEVICE = ROOT / "examples" / "custom_device"
ADDED_PATHS: list[str] = []
"""The directories :func:`put_on_path` added to ``sys.path`` and ``PYTHONPATH``."""


def distribution_metadata(target: Path) -> Path:
    """Write the example's ``.dist-info`` (its name, version and entry points, as its
    ``pyproject.toml`` declares them) into ``target``; the directory written."""
    project = tomllib.loads((EXAMPLE_DEVICE / "pyproject.toml").read_text())["project"]
    name, version = project["name"], project["version"]
    dist_info = target / f"{name.replace('-', '_')}-{version}.dist-info"
    dist_info.mkdir(parents=True)
    (dist_info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    )
    groups = [
        f"[{group}]\n" + "".join(f"{key} = {value}\n" for key, value in entries.items())
        for group, entries in project["entry-points"].items()
    ]
    (dist_info / "entry_points.txt").write_text("\n".join(groups))
    return dist_info


def put_on_path() -> None:
    """Make ``TWOSTAGE`` importable and discoverable in this process and its children."""
    metadata = Path(tempfile.mkdtemp(prefix="aioinfer-example-device-"))
    atexit.register(shutil.rmtree, metadata, ignore_errors=True)
    distribution_metadata(metadata)
    paths = [str(EXAMPLE_DEVICE), str(metadata)]
    ADDED_PATHS[:] = paths
    sys.path[:0] = paths
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [*paths, *filter(None, [os.environ.get("PYTHONPATH")])]
    )
    importlib.invalidate_caches()
