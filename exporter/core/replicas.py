"""How many replicas each model needs now, and the count an autoscaler may act on.

Pure: the targets' latest signals and the time in, counts out (the serve edge keeps the
held state between rounds: exporter/serve/replica_plan.py).

A model's replicas are the series that serve it: each vLLM data-parallel `engine` series
has its own scheduler, so it is a replica as a target is. The model is the target's
configured `model`, else the series' `model_name` (or `model`) label, else the target.
The count is the model's demand (`exporter.core.demand`, summed over its replicas) over
what one replica serves within the budget at its binding limit (the mean over the
replicas at a limit the metrics show; the others only where none is), rounded up:

- where the binding limit is the arrivals (nothing waits on any replica read), or
  one replica queues at its limit while another idles (a routing problem, not a capacity
  one), the count is what demand needs and never more than the replicas there are now;
- idle (nothing ran on any replica): the model's minimum;
- always within the model's `min_replicas` and `max_replicas`.

The count an autoscaler reads is held (`hold_count`): it starts at today's replicas (within
the bounds) when the first count is made, so a first count that differs waits its hold
like any other; it rises once a higher count has held for the saturation hold, falls once a lower one has held for the scale-down window
(5 minutes by default), holds through rounds that read nothing, and is absent, flagged
stale, once no replica has been read for the staleness.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from batchscope.exporter.core.demand import SHOWN_LIMITS, Demand, ReplicaCapacity
from batchscope.exporter.core.diagnosis import Diagnosis
from batchscope.exporter.core.limits import LIMIT_NAMES, LIMITS
from batchscope.exporter.core.units import count_text, rate_text

if TYPE_CHECKING:
    from batchscope.exporter.core.catalog import SeriesSignals
    from batchscope.exporter.core.evaluate import TargetSignals

# A count a hair above a whole number is that number (a ratio of sums: 2.0000000001).
WHOLE = 1e-9
# A replica with requests waiting at one of the limits the metrics show is queueing at it.
FULL_LIMITS = SHOWN_LIMITS
# A replica idles with nothing waiting and at most this share of its cap running.
IDLE_SHARE = 0.5
DEFAULT_SCALE_DOWN_SECONDS = 300.0


@dataclass(frozen=True, slots=True)
class ReplicaBounds:
    """The fewest and the most replicas a model may be given (None: no most)."""

    min_replicas: int = 1
    max_replicas: int | None = None

    def clamp(self, count: int) -> int:
        high = count if self.max_replicas is None else min(count, self.max_replicas)
        return max(self.min_replicas, high)


@dataclass(frozen=True, slots=True)
class ReplicaSettings:
    """How counts are made and held: bounds by model (`default` for the rest), the holds
    up (the saturation hold) and down, and the staleness after which an unread model's
    count is absent."""

    default: ReplicaBounds = ReplicaBounds()
    bounds: Mapping[str, ReplicaBounds] = field(default_factory=dict)
    scale_up_seconds: float = 60.0
    scale_down_seconds: float = DEFAULT_SCALE_DOWN_SECONDS
    stale_seconds: float = 120.0

    def bounds_of(self, model: str) -> ReplicaBounds:
        return self.bounds.get(model, self.default)


@dataclass(frozen=True, slots=True)
class Replica:
    """One replica of a model as this round read it (`read` False: its target did not
    answer, and only that it exists is known). `role`: "queued" (requests wait at its
    limit), "idle" (room, nothing waiting), or ""."""

    target: str
    labels: Mapping[str, str] = field(default_factory=dict)
    read: bool = True
    running: float | None = None
    waiting: float | None = None
    cap: float | None = None
    limit: str | None = None
    demand: Demand | None = None
    capacity: ReplicaCapacity | None = None
    role: str = ""


def model_of(configured: str | None, labels: Mapping[str, str], target: str) -> str:
    """The model a series serves: the target's configured `model`, its `model_name` (or
    `model`) label, else the target's name."""
    return configured or labels.get("model_name") or labels.get("model") or target


def role_of(
    limit: str | None,
    running: float | None,
    waiting: float | None,
    cap: float | None,
) -> str:
    """`queued` where requests wait at a full limit; `idle` where nothing waits and at most
    IDLE_SHARE of the cap runs (none, with no cap known); else ""."""
    if (waiting or 0) > 0 and limit in FULL_LIMITS:
        return "queued"
    if waiting == 0 and limit in (None, "arrivals"):
        room = IDLE_SHARE * cap if cap else 0.0
        if (running or 0) <= room:
            return "idle"
    return ""


def series_replica(target: str, s: SeriesSignals) -> Replica:
    """A read series as a replica."""
    limit = s.limits.binding
    running, waiting, cap = s.running_peak, s.waiting, s.cap
    return Replica(
        target,
        dict(s.labels),
        True,
        running,
        waiting,
        cap,
        limit,
        s.demand,
        s.replica_capacity,
        role_of(limit, running, waiting, cap),
    )


def routing_diagnosis(target: str, series: Sequence[SeriesSignals]) -> Diagnosis | None:
    """A target whose series of one model (data-parallel engines) include one queueing at
    its limit and one idling: its diagnosis is routing (None: it is not)."""
    by_model: dict[str, list[Replica]] = {}
    for s in series:
        by_model.setdefault(model_of(None, s.labels, target), []).append(series_replica(target, s))
    for replicas in by_model.values():
        routed = routing(replicas)
        if routed is not None:
            return Diagnosis("routing", routing_reason(*routed))
    return None


def replicas_by_model(
    targets: Iterable[TargetSignals],
    configured: Mapping[str, str | None],
    last_seen: Mapping[str, Sequence[tuple[str, Mapping[str, str]]]],
) -> dict[str, list[Replica]]:
    """Each model's replicas among the targets' latest signals (`TargetSignals`).
    `configured`: each target's configured model; `last_seen`: each target's (model,
    labels) of its series when it was last read, which stand for an unread target's."""
    models: dict[str, list[Replica]] = {}
    for t in targets:
        name = t.target
        if t.read:
            for s in t.series:
                model = model_of(configured.get(name), s.labels, name)
                models.setdefault(model, []).append(series_replica(name, s))
            continue
        for model, labels in last_seen.get(name, ()):
            models.setdefault(model, []).append(Replica(name, dict(labels), read=False))
    return models


def routing(replicas: Sequence[Replica]) -> tuple[Replica, Replica] | None:
    """A replica queueing at its limit and another idling, or None."""
    queued = next((r for r in replicas if r.read and r.role == "queued"), None)
    idle = next((r for r in replicas if r.read and r.role == "idle"), None)
    return (queued, idle) if queued is not None and idle is not None else None


def replica_name(replica: Replica) -> str:
    """A replica as a sentence names it: its target, and its engine where it has one."""
    engine = replica.labels.get("engine")
    return replica.target + (f" engine {engine}" if engine is not None else "")


def routing_reason(queued: Replica, idle: Replica) -> str:
    """Why a queue beside an idle replica is routing, not capacity."""
    return (
        f"{replica_name(queued)} runs {count_text(queued.running)}"
        + (f" of {count_text(queued.cap)}" if queued.cap else "")
        + f" with {count_text(queued.waiting)} waiting at {LIMIT_NAMES[queued.limit or 'requests']}"
        f" while {replica_name(idle)} runs {count_text(idle.running)}"
        + (f" of {count_text(idle.cap)}" if idle.cap else "")
        + " with nothing waiting: requests are routed unevenly, not short of capacity; "
        "balance them (least-outstanding requests, or the data-parallel load balancer) "
        "before adding replicas"
    )


@dataclass(frozen=True, slots=True)
class ModelCount:
    """A model's replica count now, before it is held: its replicas, its demand and a
    replica's capacity (with inputs and confidence), `needed` (demand over capacity,
    rounded up), `count` (within its bounds, never above today's where arrivals bind or
    routing is the problem; None where it cannot be said), its state and reason."""

    model: str
    replicas: tuple[Replica, ...]
    bounds: ReplicaBounds
    demand: float | None = None
    demand_inputs: Mapping[str, float] = field(default_factory=dict)
    capacity: float | None = None
    limit: str | None = None
    capacity_inputs: Mapping[str, float] = field(default_factory=dict)
    confidence: str = "low"
    caveats: tuple[str, ...] = ()
    needed: int | None = None
    count: int | None = None
    state: str = "unread"
    reason: str = ""

    @property
    def current(self) -> int:
        return len(self.replicas)

    @property
    def read(self) -> int:
        return sum(r.read for r in self.replicas)

    @property
    def unit(self) -> str:
        """What demand and capacity count: a batcher's items/s, an engine's requests/s."""
        measured = (r.capacity or r.demand for r in self.replicas)
        return next((m.unit for m in measured if m is not None), "requests/s")


def _model_demand(read: Sequence[Replica]) -> tuple[float | None, dict[str, float]]:
    known = [r.demand for r in read if r.demand is not None]
    if not known:
        return None, {}
    inputs = {
        name: sum(d.inputs()[name] for d in known)
        for name in ("completions_per_second", "rejections_per_second", "growth_per_second")
    }
    inputs["replicas_measured"] = float(len(known))
    return sum(d.per_second for d in known), inputs


def _replica_capacity(
    read: Sequence[Replica],
) -> tuple[float | None, str | None, dict[str, float], str, tuple[str, ...]]:
    """The capacity a replica of the model serves: the mean over the replicas measured at
    a limit the metrics show (`SHOWN_LIMITS`), else over all measured; its limit the most
    common of theirs (the first in LIMITS order on a tie) and its confidence the lowest."""
    measured = [r.capacity for r in read if r.capacity is not None]
    at_limit = [c for c in measured if c.limit in SHOWN_LIMITS]
    used = at_limit or measured
    if not used:
        return None, None, {}, "low", ()
    counts = Counter(c.limit for c in used)
    order = {limit: i for i, limit in enumerate(LIMITS)}
    limit = min(counts, key=lambda name: (-counts[name], order.get(name, len(order))))
    confidence = min((c.confidence for c in used), key=("low", "medium", "high").index)
    caveats = tuple(dict.fromkeys(caveat for c in used for caveat in c.caveats))
    inputs = {
        "replicas_measured": float(len(used)),
        "at_limit_per_second": sum(c.at_limit_per_second for c in used) / len(used),
        "headroom": sum(c.headroom for c in used) / len(used),
        "concurrency": sum(c.concurrency for c in used) / len(used),
        "slot_seconds": sum(c.slot_seconds for c in used) / len(used),
    }
    return sum(c.per_second for c in used) / len(used), limit, inputs, confidence, caveats


def needed_replicas(demand: float, capacity: float) -> int:
    """Demand over capacity, rounded up (at least 1)."""
    return max(1, math.ceil(demand / capacity - WHOLE))


def count_model(model: str, replicas: Sequence[Replica], bounds: ReplicaBounds) -> ModelCount:
    """The model's count now (module docstring)."""
    base = ModelCount(model, tuple(replicas), bounds)
    read = [r for r in replicas if r.read]
    if not read:
        return replace(base, reason="no replica of the model was read this round")
    demand, demand_inputs = _model_demand(read)
    capacity, limit, inputs, confidence, caveats = _replica_capacity(read)
    base = replace(
        base,
        demand=demand,
        demand_inputs=demand_inputs,
        capacity=capacity,
        limit=limit,
        capacity_inputs=inputs,
        confidence=confidence,
        caveats=caveats,
    )
    if all(r.limit is None for r in read):
        return replace(
            base,
            count=bounds.min_replicas,
            state="idle",
            reason=f"no request ran on any replica: the minimum, {bounds.min_replicas}",
        )
    if demand is None or not math.isfinite(demand):
        reason = "demand is not known yet: the window holds no finished request"
        if demand is not None:
            reason = f"demand is not a finite number ({demand}): no count from it"
        return replace(base, state="measuring", reason=reason)
    if capacity is None or not 0 < capacity < math.inf:
        reason = (
            "what a replica serves is not known yet: no replica read finished requests at "
            "its limit (a batcher's is its advised rate limit)"
        )
        if capacity is not None:
            reason = f"what a replica serves is not a finite number > 0 ({capacity}): no count"
        return replace(base, state="measuring", reason=reason)
    needed = needed_replicas(demand, capacity)
    # Every read replica with a limit, measured or not: one queued at its cap that has
    # finished nothing yet has no capacity, and still binds at its cap.
    arrivals = {r.limit for r in read if r.limit is not None} == {"arrivals"}
    return _counted(replace(base, needed=needed), routing(read), arrivals)


def _counted(
    base: ModelCount, routed: tuple[Replica, Replica] | None, arrivals: bool
) -> ModelCount:
    """The count from `needed`: ceilinged where arrivals bind every replica read or
    routing is the problem, bounded, and the state and reason that say why."""
    needed, current, bounds = base.needed or 1, base.current, base.bounds
    why = (
        f"{rate_text(base.demand)} {base.unit} asked ({_demand_text(base.demand_inputs)}) over "
        f"{rate_text(base.capacity)} a replica serves within the budget at "
        f"{LIMIT_NAMES.get(base.limit or '', base.limit)}: {needed} needed, {current} now"
    )
    if routed is not None:
        count = bounds.clamp(min(needed, current))
        reason = f"{routing_reason(*routed)}; {why}"
        return replace(base, count=count, state="routing", reason=reason)
    if arrivals:
        needed = min(needed, current)
        why += " (nothing waits: never more than now)"
    count = bounds.clamp(needed)
    if count != needed:
        why += f", {count} within the bounds ({_bounds_text(bounds)})"
    state = "scale_up" if count > current else "scale_down" if count < current else "steady"
    return replace(base, count=count, state=state, reason=why)


def _demand_text(inputs: Mapping[str, float]) -> str:
    parts = [f"{rate_text(inputs.get('completions_per_second'))} finished"]
    if inputs.get("rejections_per_second"):
        parts.append(f"{rate_text(inputs['rejections_per_second'])} refused")
    growth = inputs.get("growth_per_second") or 0.0
    parts.append(f"in flight {'+' if growth >= 0 else '-'}{rate_text(abs(growth))}")
    return ", ".join(parts)


def _bounds_text(bounds: ReplicaBounds) -> str:
    high = "no most" if bounds.max_replicas is None else f"at most {bounds.max_replicas}"
    return f"at least {bounds.min_replicas}, {high}"


@dataclass(frozen=True, slots=True)
class HeldCount:
    """The count an autoscaler reads (`desired`; None: absent), and the change pending:
    the count it moves to (`pending`: the least seen going up, the most going down) once
    the change has held since `since`. `read_at`: when a replica was last read; `stale`:
    none has been for longer than the staleness."""

    desired: int | None = None
    pending: int | None = None
    since: float | None = None
    read_at: float | None = None
    stale: bool = False


def hold_count(
    held: HeldCount,
    count: int | None,
    read: bool,
    now: float,
    settings: ReplicaSettings,
    start: int,
) -> HeldCount:
    """The held count after this round's `count` (None: not known), with `read` whether
    any replica of the model was read and `start` the count held before the first (today's
    replicas within the bounds): a restarted exporter moves no replica before the hold."""
    if not read:
        unread_for = math.inf if held.read_at is None else now - held.read_at
        if unread_for > settings.stale_seconds:
            return HeldCount(read_at=held.read_at, stale=True)
        return held
    held = replace(held, read_at=now, stale=False)
    if count is None:
        return held
    if held.desired is None:
        held = HeldCount(start, read_at=now)
    if count == held.desired:
        return replace(held, pending=None, since=None)
    rising = count > held.desired
    pending = held.pending
    if pending is None or (pending > held.desired) != rising:
        held = replace(held, pending=count, since=now)
    else:
        held = replace(held, pending=min(pending, count) if rising else max(pending, count))
    wait = settings.scale_up_seconds if rising else settings.scale_down_seconds
    if held.since is not None and now - held.since >= wait:
        return HeldCount(held.pending, read_at=now)
    return held


@dataclass(frozen=True, slots=True)
class ModelReplicas:
    """A model's count now (`count`) and the count held for an autoscaler (`held`)."""

    count: ModelCount
    held: HeldCount

    @property
    def desired(self) -> int | None:
        return self.held.desired


def plan_round(
    targets: Iterable[TargetSignals],
    configured: Mapping[str, str | None],
    last_seen: Mapping[str, Sequence[tuple[str, Mapping[str, str]]]],
    held: Mapping[str, HeldCount],
    now: float,
    settings: ReplicaSettings,
) -> tuple[ModelReplicas, ...]:
    """Every model's count and held count after a round (`replicas_by_model` says what
    the arguments are; `held`: each model's held count after the round before), by model
    name. A model held before that no target serves any more is left out."""
    models = replicas_by_model(targets, configured, last_seen)
    out = []
    for model in sorted(models):
        count = count_model(model, models[model], settings.bounds_of(model))
        before = held.get(model, HeldCount())
        start = count.bounds.clamp(count.current)
        after = hold_count(before, count.count, count.read > 0, now, settings, start)
        out.append(ModelReplicas(count, after))
    return tuple(out)


def seen_models(
    targets: Iterable[TargetSignals], configured: Mapping[str, str | None]
) -> dict[str, tuple[tuple[str, Mapping[str, str]], ...]]:
    """Each read target's (model, labels) of its series: what an unread target stands for."""
    return {
        t.target: tuple(
            (model_of(configured.get(t.target), s.labels, t.target), dict(s.labels))
            for s in t.series
        )
        for t in targets
        if t.read
    }
