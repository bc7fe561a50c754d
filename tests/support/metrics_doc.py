"""Shared by the tests: moved out of tests/exporter/test_metrics_doc.py so no test imports
another."""

from __future__ import annotations

import re
from collections.abc import Mapping
from types import ModuleType

from prometheus_client.parser import text_string_to_metric_families

from tests.support.paths import REPO

DOC = (REPO / "docs" / "metrics.md").read_text()


DOCUMENTED = set(re.findall(r"`([a-zA-Z_:][a-zA-Z0-9_:]*)`", DOC))


def undocumented_engines(doc: str, adapters: Mapping[str, ModuleType]) -> dict[str, list[str]]:
    """Per adapter missing from the doc: what is missing (its row, metrics it reads).

    A row belongs to an engine when its first cell names the engine as `--engine`
    takes it; a metric is documented when its name (or its counter's `_total`) is.
    """
    reads = doc.split("## What the exporter reads", 1)[1].split("\n## ", 1)[0]
    first_cells = [line.split("|")[1] for line in reads.splitlines() if line.startswith("|")]
    with_rows = {name for cell in first_cells for name in re.findall(r"`(\w+)`", cell)}
    documented = set(re.findall(r"`([a-zA-Z_:][a-zA-Z0-9_:]*)`", doc))
    missing = {}
    for name, adapter in adapters.items():
        gaps = [] if name in with_rows else ["a row in 'What the exporter reads'"]
        gaps += [
            family
            for family in adapter.FAMILIES
            if family not in documented and family + "_total" not in documented
        ]
        if gaps:
            missing[name] = gaps
    return missing


def family_names(text: str) -> set[str]:
    """Names as a reader of the payload sees them (counters with their _total)."""
    names = set()
    for family in text_string_to_metric_families(text):
        if family.name.endswith("_created"):  # prometheus-client's creation timestamps
            continue
        if family.name.startswith(("process_", "python_")):  # its default collectors
            continue
        names.add(family.name + "_total" if family.type == "counter" else family.name)
    return names
