"""MkDocs hooks (mkdocs.yml ``hooks:``) for the documentation site.

The docstrings use Sphinx cross-reference roles (``:class:`Model```, ``:meth:`infer```),
which Markdown renders as the literal role name followed by the code span; drop the
role and keep the code span.
"""

from __future__ import annotations

import re
from typing import Any

_ROLE = re.compile(r":(?:class|meth|func|attr|data|mod|exc|obj):(?=<code>)")


def on_page_content(html: str, **kwargs: Any) -> str:
    """Remove Sphinx roles in front of inline code in the rendered page."""
    return _ROLE.sub("", html)
