"""Which alerts the exporter raises on its own, and their Alertmanager v2 payloads.

Pure: the signals and the time come in, the alert book and the payloads go out; the
posting lives in `delivery.py`. The alerts are those of exporter/alerts/specs.py
with the labels the Prometheus rules give them (`alertname`, `severity`, `target`), so
Alertmanager merges an alert the exporter posts with the same alert from Prometheus.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime

from batchscope.exporter.alerts.specs import (
    BUDGET_SATURATED,
    MEMORY_BOUND,
    RUNBOOK_PATH,
    SLO_BURN_FAST,
    SLO_BURN_SLOW,
    STALLED,
    TARGET_DOWN,
    TOKEN_BUDGET_BOUND,
    AlertSpec,
    AlertWords,
)
from batchscope.exporter.core.evaluate import TargetSignals
from batchscope.exporter.core.signals import SignalSettings, outlasted

AlertKey = tuple[str, str]  # (alertname, target)

# A firing alert is posted again this often, valid for RESEND_VALIDITY resends: if the
# exporter stops, Alertmanager resolves it on its own (as Prometheus' rules do).
RESEND_SECONDS = 60.0
RESEND_VALIDITY = 4


def conditions(signals: TargetSignals) -> list[tuple[AlertSpec, float]]:
    """The alerts whose condition holds for this target now, each with its worst reading.

    Over every series and the total: one saturated model (or a batcher beside an LLM,
    whose total keeps no latency) fires for its target. Sustained saturation already held
    for the exporter's hold time; memory-bound and stalled are the diagnosis (first match
    wins); down is the scrape; an SLO burn is both windows of a pair of its speed over the
    pair's factor, read at the highest long-window burn rate of that speed (only for a
    target held to an objective).
    """
    if not signals.up:
        return [(TARGET_DOWN, 0.0)]
    views = (signals.total, *signals.series)
    readings = {
        BUDGET_SATURATED: [
            s.budget_utilization
            for s in views
            if s.budget_saturated and s.budget_utilization is not None
        ],
        MEMORY_BOUND: [s.waiting or 0.0 for s in views if s.diagnosis.state == "memory_bound"],
        TOKEN_BUDGET_BOUND: [
            s.waiting or 0.0 for s in views if s.diagnosis.state == "token_budget_bound"
        ],
        STALLED: [
            s.generation_tokens_per_second or 0.0 for s in views if s.diagnosis.state == "stalled"
        ],
        **{
            spec: [
                s.slo.speed_burn_rate(speed) or 0.0
                for s in views
                if s.slo is not None and speed in s.slo.burning
            ]
            for spec, speed in ((SLO_BURN_FAST, "fast"), (SLO_BURN_SLOW, "slow"))
        },
    }
    return [(spec, max(values)) for spec, values in readings.items() if values]


def hold_seconds(spec: AlertSpec) -> float:
    """How long a condition holds before the exporter posts it: saturation has held already."""
    return 0.0 if spec is BUDGET_SATURATED else spec.hold_seconds


@dataclass(frozen=True, slots=True)
class Alert:
    """One condition seen: `active_since` it began, `read_at` the time of the last scrape
    that read the target and found it holding, `unread_since` the first evaluation since
    then that could not read the target (None while every one reads it)."""

    spec: AlertSpec
    target: str
    value: float
    active_since: float
    last_sent: float | None = None
    resolved_at: float | None = None
    read_at: float | None = None
    unread_since: float | None = None

    @property
    def key(self) -> AlertKey:
        return (self.spec.name, self.target)


@dataclass(frozen=True, slots=True)
class AlertBook:
    """Conditions seen (pending or firing) and the alerts that must reach Alertmanager."""

    active: Mapping[AlertKey, Alert] = field(default_factory=dict)
    unsent: Mapping[AlertKey, Alert] = field(default_factory=dict)


# How long a target's conditions outlast evaluations that could not read it, by default
# (the staleness), and how much longer a fired saturation alert does, as its saturated
# episode (the hold: `outlasted`).
STALE_SECONDS = SignalSettings().stale_seconds
KEEP_SECONDS = SignalSettings().hold_seconds


def step(
    book: AlertBook,
    targets: Iterable[TargetSignals],
    now: float,
    holds: Mapping[str, float] | None = None,
    stale_seconds: float = STALE_SECONDS,
    keep_seconds: float = KEEP_SECONDS,
) -> AlertBook:
    """Advance the book by one evaluation at `now`.

    A condition becomes an alert once it has held its hold time; it is queued for posting
    when it starts firing, every RESEND_SECONDS while it fires, and once when it resolves
    (its condition gone, or its target gone from the configuration). `holds` overrides the
    hold by alert name.

    An evaluation that could not read its target (down, unreadable) is no evidence: the
    target's other conditions stay as they were, neither ended nor restarted nor brought
    to fire, until it has gone unread for more than `stale_seconds`, counted from the first
    such evaluation (an exporter that evaluated late is not a target that went unread); a
    fired saturation alert, `keep_seconds` longer, as its saturation episode (`outlasted`).
    """
    holds = holds or {}
    seen: dict[AlertKey, Alert] = {}
    read: set[AlertKey] = set()  # conditions this step read, not carried through a gap
    by_target: dict[str, list[tuple[AlertKey, Alert]]] = defaultdict(list)
    for key, alert in book.active.items():
        by_target[key[1]].append((key, alert))
    ended: dict[AlertKey, Alert] = {}  # fired before an outage that outlasted the staleness
    for signals in targets:
        for spec, value in conditions(signals):
            key = (spec.name, signals.target)
            before = book.active.get(key)
            previous = _continued(before, now, stale_seconds, keep_seconds)
            if before is not None and previous is None and before.last_sent is not None:
                ended[key] = replace(before, resolved_at=now)
            since = previous.active_since if previous else now
            seen[key] = Alert(
                spec,
                signals.target,
                value,
                since,
                previous.last_sent if previous else None,
                read_at=signals.t,
                unread_since=_still_unread(previous, spec, signals),
            )
            read.add(key)
        if not signals.read:
            for key, alert in by_target.get(signals.target, ()):
                if alert.spec is TARGET_DOWN or alert.read_at is None:
                    continue
                since = now if alert.unread_since is None else alert.unread_since
                if now - since <= stale_seconds + _kept(alert, keep_seconds):
                    seen[key] = replace(alert, unread_since=since)
    unsent = dict(book.unsent)
    for key, alert in seen.items():
        # A hold completes only on an evaluation that read the condition; a gap carries on
        # what already fires.
        if not _firing(alert, now, holds) or (alert.last_sent is None and key not in read):
            continue
        if alert.last_sent is None or now - alert.last_sent >= RESEND_SECONDS:
            seen[key] = unsent[key] = replace(alert, last_sent=now)
    for key, alert in book.active.items():
        if key not in seen and alert.last_sent is not None:
            unsent[key] = replace(alert, resolved_at=now)
    for key, alert in ended.items():  # unless it fires again at once, as a new alert
        unsent.setdefault(key, alert)
    return AlertBook(seen, unsent)


def _continued(
    previous: Alert | None, now: float, stale_seconds: float, keep_seconds: float
) -> Alert | None:
    """The condition a read that finds it holding continues: None (it starts again) when
    the target had gone unread for longer than `stale_seconds` since the first evaluation
    that could not read it (a fired saturation alert: `keep_seconds` longer), or when a
    hold not yet complete last read it longer ago than that (time nobody observed
    completes no hold); a firing alert goes on through a late evaluation."""
    if previous is None:
        return None
    fired = previous.last_sent is not None
    keep = _kept(previous, keep_seconds)
    if outlasted(previous.unread_since, previous.read_at, fired, now, stale_seconds, keep):
        return None
    return previous


def _still_unread(previous: Alert | None, spec: AlertSpec, signals: TargetSignals) -> float | None:
    """When a read that finds the condition holding counts the target unread from: never
    (None), but for saturation read from a window of one scrape, which measured nothing and
    carried the episode as through a gap (`TargetSignals.measured`): the episode's unread
    clock runs on, and so does its alert's."""
    if previous is None or spec is not BUDGET_SATURATED or signals.measured:
        return None
    return previous.unread_since


def _kept(alert: Alert, keep_seconds: float) -> float:
    """How much longer than the staleness `alert` outlasts a gap: a fired saturation alert,
    `keep_seconds`, as its saturation episode does; any other, no longer."""
    return keep_seconds if alert.spec is BUDGET_SATURATED and alert.last_sent is not None else 0.0


def _firing(alert: Alert, now: float, holds: Mapping[str, float]) -> bool:
    hold = holds.get(alert.spec.name, hold_seconds(alert.spec))
    return now - alert.active_since >= hold


def delivered(book: AlertBook) -> AlertBook:
    """The book once every queued alert has reached Alertmanager."""
    return AlertBook(book.active, {})


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat().replace("+00:00", "Z")


def _reading(value: float, value_format: str) -> str:
    if value_format == "percent":
        return f"{value:.0%}"
    if value_format == "seconds":
        return f"{value:.2f}s"
    return f"{value:g}"


def payload(alert: Alert, generator_url: str, words: AlertWords | None = None) -> dict:
    """One alert as Alertmanager's v2 API takes it (`POST /api/v2/alerts` body item), its
    texts stating the configured numbers `words` holds (default: the default settings)."""
    spec = alert.spec
    reading = _reading(alert.value, spec.value_format)
    summary, description = (words or AlertWords()).texts(spec, alert.target, reading)
    ends = (
        alert.resolved_at
        if alert.resolved_at is not None
        else (alert.last_sent or alert.active_since) + RESEND_VALIDITY * RESEND_SECONDS
    )
    return {
        "labels": {"alertname": spec.name, "severity": spec.severity, "target": alert.target},
        "annotations": {
            "summary": summary,
            "description": description,
            "runbook_url": f"{RUNBOOK_PATH}#{spec.runbook_anchor}",
        },
        "startsAt": _iso(alert.active_since),
        "endsAt": _iso(ends),
        "generatorURL": generator_url,
    }
