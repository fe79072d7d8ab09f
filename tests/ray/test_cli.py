"""``aioinfer serve REPO --ray``: what it refuses. (The session's application is deployed
by it, and stopped by SIGTERM at the end: see ``conftest.py``.)"""

from __future__ import annotations

import pytest

from aioinfer.cli import main
from tests.helpers import mlp_model
from tests.serving.conftest import write_model


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--replicas", "2"], "--replicas needs --ray"),
        (["--ray", "--header-timeout", "3"], "--header-timeout: not available with --ray"),
    ],
)
def test_serve_ray_refuses_options_it_cannot_honour(tmp_path, capsys, argv, words):
    write_model(tmp_path, "mlp", 1, mlp_model())
    assert main(["serve", str(tmp_path), *argv]) == 2
    assert words in capsys.readouterr().err
