"""The size a reader can hold: no module of the product (or its scripts) over 600 lines,
no function over 80. A module or function that grows past them is split by its jobs."""

from __future__ import annotations

import ast

from tests.support.paths import REPO

FOLDERS = ("exporter", "dashboard", "demo_server", "grafana", "scripts")
MODULE_LINES = 600
FUNCTION_LINES = 80


def _sources():
    for folder in FOLDERS:
        for path in sorted((REPO / folder).rglob("*.py")):
            yield path.relative_to(REPO), path.read_text()


def test_no_module_is_over_600_lines() -> None:
    long = {
        str(path): n for path, text in _sources() if (n := len(text.splitlines())) > MODULE_LINES
    }
    assert long == {}


def test_no_function_is_over_80_lines() -> None:
    long = {
        f"{path}:{node.name}": n
        for path, text in _sources()
        for node in ast.walk(ast.parse(text))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and (n := node.end_lineno - node.lineno + 1) > FUNCTION_LINES
    }
    assert long == {}
