"""An earlier commit's `exporter` modules, imported beside this checkout's, for benchmarks
that time the old code against the new in one process.

The commit's `exporter/` is extracted with `git archive` (so it must be in the history: a
shallow clone cannot) into a folder kept until the process ends, and imported with this
checkout's `exporter` modules set aside: the modules of one stay bound to each other,
not to the other's. Afterwards `exporter` is this checkout's again.
"""

from __future__ import annotations

import atexit
import importlib
import io
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent

# Modules the benchmarks compare that had other names before `exporter` was split into
# packages by job: a commit from before the split has them under these.
BEFORE_PACKAGES = {
    "exporter.scrape.loop": "exporter.runtime",
    "exporter.config.settings": "exporter.config",
    "exporter.ingest.promtext": "exporter.promtext",
}


def import_at(commit: str, *modules: str) -> list[ModuleType]:
    """The named modules (e.g. "exporter.scrape.loop") as of `commit`, each under its
    earlier name (BEFORE_PACKAGES) where the commit predates the packages."""
    archive = subprocess.run(
        ["git", "archive", "--format=tar", commit, "exporter"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout
    folder = tempfile.mkdtemp(prefix="batchscope-baseline-")
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(folder, filter="data")
    current = _exporter_modules()
    for name in current:
        del sys.modules[name]
    sys.path.insert(0, folder)
    try:
        return [_import_either(name) for name in modules]
    finally:
        sys.path.remove(folder)
        for name in _exporter_modules():
            del sys.modules[name]
        sys.modules.update(current)


def _import_either(name: str) -> ModuleType:
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError:
        if name not in BEFORE_PACKAGES:
            raise
        return importlib.import_module(BEFORE_PACKAGES[name])


def _exporter_modules() -> dict[str, ModuleType]:
    return {n: m for n, m in sys.modules.items() if n.split(".")[0] == "exporter"}
