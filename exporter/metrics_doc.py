"""The tables of docs/metrics.md that the signal catalog writes: every family /metrics
emits, and every field of a series' signals with where it shows.

`python -m batchscope.exporter.metrics_doc` rewrites them in place (`make grafana` runs
it with the other generated files); a test holds the committed page to them.
"""

from __future__ import annotations

import sys
from pathlib import Path

from batchscope.exporter.core.catalog import SERIES
from batchscope.exporter.core.declare import Signal
from batchscope.exporter.core.families import (
    CURRENT_REPLICAS,
    DESIRED_REPLICAS,
    MODEL_DEMAND,
    NEEDED_REPLICAS,
    REPLICA_CAPACITY,
    REPLICAS_STALE,
    SCRAPE_DURATION,
    TARGET_ERRORS,
    TARGET_UP,
    WINDOW_RESETS,
    Family,
)

DOC = Path(__file__).resolve().parent.parent / "docs" / "metrics.md"
BEGIN = "<!-- generated from exporter/core/catalog.py: {name} -->"
END = "<!-- end of generated table -->"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _family_row(family: Family, field: str) -> str:
    name = family.name + "_total" if family.type == "counter" else family.name
    labels = ", ".join(f"`{label}`" for label in family.labels) or "—"
    return f"| `{name}` | {family.type} | {labels} | {field} | {_cell(family.documentation)} |"


def families_table() -> str:
    """Every family of /metrics, in the order it is written."""
    rows = [
        "| metric | type | labels besides `target` and the series' own | JSON field | meaning |",
        "|---|---|---|---|---|",
        _family_row(TARGET_UP, "`up`"),
        _family_row(SCRAPE_DURATION, "`scrape_seconds`"),
    ]
    for signal in SERIES:
        gauges = (signal.gauge(),) if signal.metric else ()
        rows += [_family_row(f, f"`{signal.name}`") for f in (*gauges, *signal.families)]
    rows += [_family_row(TARGET_ERRORS, "—"), _family_row(WINDOW_RESETS, "—")]
    rows += [_family_row(family, field) for family, field in MODEL_FIELDS]
    return "\n".join(rows)


# The model families (no `target` label: a model's replicas span targets), each with its
# field of /api/v1/replicas' `model_replicas` object.
MODEL_FIELDS = (
    (DESIRED_REPLICAS, "replicas: `desired_replicas`"),
    (NEEDED_REPLICAS, "replicas: `needed_replicas`"),
    (CURRENT_REPLICAS, "replicas: `replicas`"),
    (MODEL_DEMAND, "replicas: `demand`"),
    (REPLICA_CAPACITY, "replicas: `capacity`"),
    (REPLICAS_STALE, "replicas: `stale`"),
)


def _shown(signal: Signal) -> str:
    places = [f"`{f.name}`" for f in ((signal.gauge(),) if signal.metric else signal.families)]
    places += ["summary"] if signal.summary else []
    places += [f"history `{column}`" for column, _ in signal.history]
    places += [f"Live ({signal.live})"] if signal.live else []
    places += [f"recorded as `{signal.rule}`"] if signal.rule else []
    return ", ".join(places) or "the JSON API only"


def fields_table() -> str:
    """Every field of a series' signals (the JSON API's `series` and `total`)."""
    rows = ["| field | unit | meaning | also shown in |", "|---|---|---|---|"]
    rows += [f"| `{s.name}` | {s.unit} | {_cell(s.help)} | {_shown(s)} |" for s in SERIES]
    return "\n".join(rows)


TABLES = {"families": families_table, "fields": fields_table}


def with_tables(text: str) -> str:
    """The page with each generated table between its markers written anew."""
    for name, table in TABLES.items():
        begin = BEGIN.format(name=name)
        head, found, rest = text.partition(begin + "\n")
        if not found:
            raise ValueError(f"docs/metrics.md has no marker {begin!r}")
        _, found, tail = rest.partition(END)
        if not found:
            raise ValueError(f"docs/metrics.md: {begin!r} has no {END!r} after it")
        text = f"{head}{begin}\n{table()}\n{END}{tail}"
    return text


def main() -> int:
    DOC.write_text(with_tables(DOC.read_text(encoding="utf-8")), encoding="utf-8")
    print(f"wrote the generated tables of {DOC}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
