"""Packages import one way: the load generator reads the dashboard's result format and
report, the dashboard never imports the demo server, and the exporter imports neither."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.support.paths import REPO

# Each top-level folder, and the batchscope packages its modules must not import.
NEVER_IMPORTS = {
    "dashboard": ("batchscope.demo_server",),
    "exporter": ("batchscope.demo_server", "batchscope.dashboard"),
}


def imported_modules(path: Path) -> set[str]:
    """Every module an `import` or `from ... import` in the file names, lazy ones too."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def test_the_scan_sees_an_import_inside_a_function(tmp_path: Path) -> None:
    module = tmp_path / "lazy.py"
    module.write_text("def f():\n    from batchscope.demo_server import names\n")
    assert "batchscope.demo_server.names" in imported_modules(module)


@pytest.mark.parametrize("folder", sorted(NEVER_IMPORTS))
def test_a_package_never_imports_one_that_imports_it(folder: str) -> None:
    forbidden = NEVER_IMPORTS[folder]
    found = [
        f"{path.relative_to(REPO)}: {name}"
        for path in sorted((REPO / folder).rglob("*.py"))
        for name in sorted(imported_modules(path))
        if name.startswith(forbidden)
    ]
    assert found == []


def test_the_load_generator_reads_the_format_the_dashboard_reads() -> None:
    # The one place of the result format is imported by both sides.
    loadgen = REPO / "demo_server" / "loadgen"
    report = imported_modules(loadgen / "report.py") | imported_modules(loadgen / "run.py")
    results = imported_modules(REPO / "dashboard" / "load_results.py")
    assert "batchscope.dashboard.load_format" in report & results
