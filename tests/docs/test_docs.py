"""The documentation site builds with warnings as errors, lists every page, and its code
is true: runnable examples run, and excerpts of the example device match its source.

Markers in the Markdown (HTML comments, invisible on the site) select the code blocks:
``<!-- test: run -->`` before a complete program, ``<!-- test: excerpt PATH -->`` before
a verbatim excerpt of the file PATH.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from aioinfer.models import default_model_path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
MARKED_BLOCK = re.compile(
    r"<!-- test: (?P<what>run|excerpt (?P<path>\S+)) -->\n```[\w-]*\n(?P<code>.*?)^```",
    re.DOTALL | re.MULTILINE,
)


def marked_blocks(kind: str) -> list[tuple[str, str, str]]:
    """(page, path or "", code) of every block marked ``kind`` in docs/ and README.md."""
    blocks = []
    for page in [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]:
        for match in MARKED_BLOCK.finditer(page.read_text()):
            if match["what"].split()[0] == kind:
                blocks.append((str(page.relative_to(ROOT)), match["path"] or "", match["code"]))
    return blocks


def _nav_pages(nav: object) -> list[str]:
    if isinstance(nav, str):
        return [nav]
    if isinstance(nav, list):
        return [page for item in nav for page in _nav_pages(item)]
    if isinstance(nav, dict):
        return [page for value in nav.values() for page in _nav_pages(value)]
    return []


def test_mkdocs_build_strict(tmp_path: Path) -> None:
    pytest.importorskip("mkdocstrings_handlers.python")
    site = tmp_path / "site"
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", "mkdocs.yml", "-d", site],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    # The API reference is generated from the docstrings.
    core_page = (site / "api" / "core" / "index.html").read_text()
    assert "compile_model_async" in core_page and "UnknownDeviceError" in core_page
    plugin_page = (site / "api" / "plugin" / "index.html").read_text()
    assert "start_pipeline" in plugin_page and "create_sync_infer_request" in plugin_page
    # Sphinx roles in docstrings (:class:`X`) render as plain code (scripts/mkdocs_hooks.py).
    request_page = (site / "api" / "infer-request" / "index.html").read_text()
    assert "RequestBusyError" in request_page and ":class:" not in request_page
    assert (site / "plugins" / "index.html").exists()
    assert (site / "search" / "search_index.json").exists()


def test_every_page_is_in_the_nav() -> None:
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    in_nav = _nav_pages(config["nav"])
    pages = sorted(str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md"))
    assert sorted(in_nav) == pages, "mkdocs.yml's nav and the pages in docs/ differ"


@pytest.mark.parametrize(
    ("page", "code"),
    [(page, code) for page, _, code in marked_blocks("run")],
    ids=[f"{page}-{i}" for i, (page, _, _) in enumerate(marked_blocks("run"))],
)
def test_runnable_examples_run(page: str, code: str, tmp_path: Path) -> None:
    if "asyncio.TaskGroup" in code and sys.version_info < (3, 11):
        pytest.skip("asyncio.TaskGroup needs Python 3.11")
    shutil.copy(default_model_path(), tmp_path / "model.onnx")  # the examples' model.onnx
    (tmp_path / "example.py").write_text(code)
    done = subprocess.run(
        [sys.executable, "example.py"], capture_output=True, text=True, cwd=tmp_path, timeout=120
    )
    assert done.returncode == 0, f"{page}:\n{code}\n{done.stderr}"
    assert done.stdout.strip(), "the example printed nothing"


def test_there_are_runnable_examples_and_excerpts() -> None:
    pages = {page for page, _, _ in marked_blocks("run")}
    assert {"README.md", "docs/getting-started.md", "docs/async.md"} <= pages
    assert len(marked_blocks("excerpt")) >= 5


@pytest.mark.parametrize(
    ("page", "path", "code"),
    marked_blocks("excerpt"),
    ids=[f"{page}-{i}" for i, (page, _, _) in enumerate(marked_blocks("excerpt"))],
)
def test_excerpts_match_their_source(page: str, path: str, code: str) -> None:
    source = (ROOT / path).read_text()
    assert code in source, f"{page} quotes {path}, which no longer contains:\n{code}"
