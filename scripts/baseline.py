"""An earlier commit's `exporter` modules, imported beside this checkout's, for benchmarks
that time the old code against the new in one process.

The commit's `exporter/` is extracted with `git archive` (so it must be in the history: a
shallow clone cannot) into a folder kept until the process ends, and imported with this
checkout's `exporter` modules set aside: the modules of one stay bound to each other,
not to the other's. Afterwards `exporter` is this checkout's again.
"""

from __future__ import annotations

import atexit
import dataclasses
import importlib
import importlib.util
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
    "batchscope.exporter.scrape.loop": "exporter.runtime",
    "batchscope.exporter.config.settings": "batchscope.exporter.config",
    "batchscope.exporter.ingest.promtext": "exporter.promtext",
    "batchscope.exporter.scrape.fetch": "batchscope.exporter.scrape",
    "batchscope.exporter.serve.exposition": "exporter.collector",
}


def import_at(commit: str, *modules: str) -> list[ModuleType]:
    """The named modules (e.g. "batchscope.exporter.scrape.loop") as of `commit`, each under its
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
    _give_built_extensions(Path(folder))
    current = _exporter_modules()
    for name in current:
        del sys.modules[name]
    sys.path.insert(0, folder)
    try:
        packaged = Path(folder, "exporter", "scrape").is_dir()
        return [_import_either(name, packaged) for name in modules]
    finally:
        sys.path.remove(folder)
        for name in _exporter_modules():
            del sys.modules[name]
        sys.modules.update(current)


def _give_built_extensions(folder: Path) -> None:
    """Copy this checkout's built C extensions into the commit's `exporter` where the
    commit holds the same C source: `git archive` brings the source, not what the install
    built from it, and without it the commit would read its payloads in Python, as it
    never runs. A commit whose source differs is said on stderr and runs without it."""
    for source in sorted(folder.glob("exporter/**/*.c")):
        relative = source.relative_to(folder)
        here = ROOT / relative
        module = ".".join(relative.with_suffix("").parts)
        try:
            built = importlib.util.find_spec(module)
        except ImportError:
            built = None
        if built is None or built.origin is None or not built.origin.endswith(".so"):
            print(
                f"baseline: {module} is not built here; the commit runs without it", file=sys.stderr
            )
        elif not here.is_file() or here.read_bytes() != source.read_bytes():
            print(
                f"baseline: {relative} differs from this checkout's; the commit runs without it",
                file=sys.stderr,
            )
        else:
            shutil.copy2(built.origin, source.parent / Path(built.origin).name)


def _import_either(name: str, packaged: bool) -> ModuleType:
    """The module under its name, or under its earlier name for a commit before the
    packages (not tried as the new name first: an editable install's finder would find
    this checkout's module under it)."""
    return importlib.import_module(name if packaged else BEFORE_PACKAGES.get(name, name))


def _exporter_modules() -> dict[str, ModuleType]:
    return {n: m for n, m in sys.modules.items() if n.split(".")[0] == "exporter"}


# Reasons this checkout words differently from a baseline on purpose: (what the baseline
# says, what this checkout says in its place), each cut where the two part. Issue 21:
# `batch_limited` lists what it looked at instead of guessing the token budget, and an
# unrecognised payload's error lists the families the vLLM adapter reads, which grew.
# Issue 22: `underloaded` says "now", `budget_saturated` states the hold and the window.
REWORDED = (
    ("something else limits the batch (e.g. the per-step token budget)", "something else"),
    ("something else limits the batch. Looked at: ", "something else"),
    ("(looked for ", "(looked for"),
    ("nothing waits: batches are small", "nothing waits"),
    ("nothing waits now: batches are small", "nothing waits"),
    ("latency has stayed ", "latency has stayed"),
)


# Advice items this checkout gives and a baseline did not (issue 21: the token budget, and
# vLLM's own concurrency statement): additions, not differences.
ADDED_ADVICE = {"kv_max_concurrency_stated", "tokens_per_step_for_cap", "token_budget_for_cap"}
# Keys a mapping may hold since the baseline without being a difference: the latency kinds
# read since (vLLM's TPOT and ITL histograms).
ADDED_KEYS = {"tpot", "itl"}


def _reworded(text: str) -> str:
    for before, cut in REWORDED:
        if before in text:
            return text[: text.index(before)] + cut
    return text


def same_as_baseline(new: object, old: object) -> bool:
    """Whether this checkout's value says what a baseline's did: dataclasses (whose
    classes differ between the two) field by field over the fields the baseline has (a
    field added since is new, not different), containers item by item (an advice item of
    a kind in `ADDED_ADVICE`, a key in `ADDED_KEYS` the baseline lacks, left out), text
    after `REWORDED`, everything else by ==."""
    if dataclasses.is_dataclass(old) and not isinstance(old, type):
        return dataclasses.is_dataclass(new) and all(
            same_as_baseline(getattr(new, f.name, _MISSING), getattr(old, f.name))
            for f in dataclasses.fields(old)
        )
    if isinstance(old, dict):
        return (
            isinstance(new, dict)
            and new.keys() - (ADDED_KEYS - old.keys()) == old.keys()
            and all(same_as_baseline(new[k], old[k]) for k in old)
        )
    if isinstance(old, list | tuple):
        if not isinstance(new, list | tuple):
            return False
        new = [n for n in new if getattr(n, "kind", None) not in ADDED_ADVICE]
        return len(new) == len(old) and all(
            same_as_baseline(n, o) for n, o in zip(new, old, strict=True)
        )
    if isinstance(old, str) and isinstance(new, str):
        return _reworded(new) == _reworded(old)
    if isinstance(old, float) and isinstance(new, float) and old != old:
        return new != new  # NaN
    return new == old


_MISSING = object()
