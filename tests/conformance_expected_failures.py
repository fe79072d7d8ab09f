"""ONNX node conformance cases that aioinfer does not pass yet.

``test_conformance.py`` fails when a case listed here passes (remove it: the list only
shrinks) and when a case not listed fails. Keys are the cases' names as
``onnx.backend.test.case.node.collect_testcases()`` gives them; values say why, in one
line.
"""

from __future__ import annotations

EXPECTED_FAILURES: dict[str, str] = {}
