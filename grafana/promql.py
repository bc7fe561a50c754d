"""Small PromQL writers the rule files share: durations, the newest sample through a failed
scrape, and a rule as Prometheus' rule file holds it."""

from __future__ import annotations

from collections.abc import Mapping


def instance_by(config: Mapping) -> str:
    """The labels that tell one engine from another, as a `by (...)` list."""
    return ", ".join(config["instance_labels"])


def seconds(duration: float) -> str:
    """A duration as PromQL writes one: whole seconds, else whole milliseconds."""
    if float(duration).is_integer():
        return f"{int(duration)}s"
    return f"{round(duration * 1000)}ms"


def latest(selector: str, config: Mapping, within: float | None = None) -> str:
    """The newest sample of each series of `selector` within the staleness (the hold
    time, as the exporter's), or within `within` seconds where given. A failed
    scrape leaves Prometheus a stale marker, and an instant selector then finds nothing,
    so an alert's `for:` would start again; the newest sample before the gap is the
    evidence that stands until a later sample, or the staleness, ends it."""
    window = config["saturation_hold_seconds"] if within is None else within
    return f"last_over_time({selector}[{seconds(window)}])"


def newest(
    aggregation: str,
    by: str,
    names: tuple[str, ...],
    matchers: str,
    config: Mapping,
    combine: str = "",
) -> str:
    """`aggregation by (by)` of each name's newest samples (`latest`), the names combined
    with `combine` (" + " adds each name present to the first, " or " takes the first
    name present); the first name alone where the others are absent."""
    # Only series of scrape targets Prometheus still has (`up` is written at every scrape,
    # failed or not): a replaced instance's last sample is not summed beside its successor's.
    parts = [
        f"{aggregation} by ({by}) ({latest(f'{name}{{{matchers}}}', config)}"
        f" and on (job, instance) up)"
        for name in names
    ]
    if len(parts) == 1:
        return parts[0]
    if combine == " or ":
        return "\nor ".join(parts)
    return "(" + combine.join(parts) + ")\nor " + parts[0]


def record(name: str, expr: str, labels: Mapping[str, str] | None = None) -> dict:
    """A recording rule."""
    rule = {"record": name, "expr": expr}
    if labels:
        rule["labels"] = dict(labels)
    return rule


def string(text: str) -> str:
    """`text` as a PromQL double-quoted string: a label value from a user's configuration
    (a model id) may hold a quote or a backslash."""
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{escaped}"'
