"""The label names on the exporter's own series, which a target's `labels:` may not reuse.

The collector sets `target` and, per family, the labels its `Family` declares (`state`,
`reason`, ...); each engine adapter keys its series by its KEY_LABELS; `le` belongs to
histogram buckets in Prometheus. A target label with one of these names would overwrite
the exporter's, so the configuration refuses it.
"""

from __future__ import annotations

from batchscope.exporter.core.catalog import FAMILIES
from batchscope.exporter.engines import ADAPTERS

EXPORTER_LABELS = (
    "target",
    *sorted({*(name for family in FAMILIES for name in family.labels), "le"} - {"target"}),
)

# The labels that tell one series of a target from another; a series with none is the total.
SERIES_LABELS = tuple(sorted({name for a in ADAPTERS.values() for name in a.KEY_LABELS}))

RESERVED_LABELS = (
    *EXPORTER_LABELS,
    *(name for name in SERIES_LABELS if name not in EXPORTER_LABELS),
)
