"""batchscope installs under one import name, `batchscope`, and claims no other."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import sysconfig
import tomllib
from pathlib import Path

import pytest

from tests.support.paths import REPO

FOLDERS = ("exporter", "dashboard", "demo_server", "grafana")
SCRIPTS = (
    "batchscope-exporter",
    "batchscope-static-util",
    "batchscope-rules",
    "batchscope-demo-server",
    "batchscope-loadgen",
    "batchscope-dashboard",
)


def _package_folders() -> list[str]:
    return sorted(
        "batchscope." + str(path.parent.relative_to(REPO)).replace(os.sep, ".")
        for folder in FOLDERS
        for path in (REPO / folder).rglob("__init__.py")
    )


def test_every_package_folder_is_listed_under_batchscope():
    setuptools = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert sorted(setuptools["packages"]) == _package_folders()
    assert setuptools["package-dir"] == {f"batchscope.{f}": f for f in FOLDERS}


def _python_files() -> list[Path]:
    roots = [REPO / name for name in (*FOLDERS, "tests", "scripts")]
    return [p for root in roots for p in root.rglob("*.py")]


def test_the_code_imports_itself_only_as_batchscope():
    bare = []
    for path in _python_files():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            bare += [
                f"{path.relative_to(REPO)}:{node.lineno} {name}"
                for name in names
                if name.split(".")[0] in FOLDERS
            ]
    assert bare == []


@pytest.mark.integration
def test_an_installed_batchscope_claims_only_its_own_name(tmp_path: Path):
    """`pip install .` into a fresh venv, run from outside the checkout: the package is
    `batchscope.*`, `import exporter` fails, and each console script answers --help."""
    wheels = tmp_path / "wheels"
    leftovers = [REPO / "build", *REPO.glob("*.egg-info")]
    before = {path for path in leftovers if path.exists()}
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q"]
        + ["-w", str(wheels), str(REPO)],
        check=True,
        capture_output=True,
    )
    for path in set(leftovers) - before:  # setuptools builds in the checkout
        shutil.rmtree(path, ignore_errors=True)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    wheel = next(wheels.glob("batchscope-*.whl"))
    subprocess.run(
        [python, "-m", "pip", "install", "--no-deps", "-q", str(wheel)],
        check=True,
        capture_output=True,
    )
    # The dependencies come from this environment's site-packages, on PYTHONPATH: its .pth
    # files (this checkout's editable install among them) are not read from there.
    env = {**os.environ, "PYTHONPATH": sysconfig.get_paths()["purelib"]}
    outside = tmp_path / "elsewhere"
    outside.mkdir()

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(args, cwd=outside, env=env, capture_output=True, text=True)

    found = run(str(python), "-c", "import batchscope.exporter.cli as m; print(m.__file__)")
    assert found.returncode == 0, found.stderr
    assert found.stdout.startswith(str(venv)), found.stdout
    for name in FOLDERS:
        bare = run(str(python), "-c", f"import {name}")
        assert f"No module named '{name}'" in bare.stderr
    installed = sorted(p.name for p in (venv / "lib").rglob("site-packages/*"))
    assert [n for n in installed if n in FOLDERS] == []
    for script in SCRIPTS:
        answer = run(str(venv / "bin" / script), "--help")
        assert answer.returncode == 0, f"{script}: {answer.stderr[-500:]}"
        assert "usage" in answer.stdout.lower(), script
