"""What one replica is asked to serve, and what it serves within the budget at its limit.

Pure functions of one series' window (`exporter.core.reading.WindowReading`); the model's
replica count (`exporter.core.replicas`) adds them up. The recording rules compute the
same numbers from vLLM's raw series (grafana/replica_rules.py).

Demand, per second over the window: the requests finished, the requests refused at
admission, and the growth of the requests in flight (running plus waiting, now against
the window's start). vLLM counts no arrivals, and an overloaded replica finishes exactly
what it can: its queue's growth is the rest of the demand. A batcher that fills and fires
batches counts items: those executed, plus the growth of its queue.

Capacity at the binding limit (`exporter.core.limits`), by Little's law: the requests a
replica runs at once at that limit over the time a request holds its slot (the mean
running over the requests finished per second). At the limit:

- `requests`; and where no limit the metrics show binds (`arrivals`: nothing waits;
  `deferred`, `unexplained`: requests wait below the cap with room in the cache, often
  for the next step): the request cap, which it has not reached;
- `kv_cache`: the mean running, what the cache held;
- `token_budget` (`batch_tokens`): the mean running scaled by the budget (token cap) over
  the tokens a step (the batch) carried.

Within the budget: a share of that, the headroom the queue needs to keep the latency
quantile q within the budget. With Poisson arrivals and a service time that varies
little, the wait of a queue with c slots beyond t falls as exp(-2 c (1 - u) t / T) in
heavy traffic (Kingman's approximation, the chance of waiting bounded by 1): a load u of
its capacity keeps the q-quantile of the wait within W = budget - the q-quantile of the
service time when u = 1 - ln(1 / (1 - q)) T / (2 c W), kept between 0.5 and 1. A
latency that no queue delays (inference, per-token) leaves u at 1, as does no budget.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from batchscope.exporter.core.capacity import MAX_DEVICE_LOAD
from batchscope.exporter.core.histogram import histogram_quantile
from batchscope.exporter.core.limits import LIMIT_NAMES
from batchscope.exporter.core.signals import per_second
from batchscope.exporter.core.snapshot import SeriesSnapshot, latency_histogram
from batchscope.exporter.core.units import count_text, percent_text, rate_text, seconds_text

# The latency kinds a queue delays: the headroom is kept for them alone. Each with the
# latency kind whose quantile is its service part (None: none, the whole is queueing or a
# first token's short prefill).
QUEUED_KINDS: Mapping[str, str | None] = {"e2e": "inference", "ttft": None, "queue": None}
# A replica is never counted below this share of its capacity at the limit: where the
# budget would need more headroom, the service time, not the queue, is what misses it.
MIN_HEADROOM = 0.5
# The slack of a budget the service time fills or overfills: the headroom is then the least.
TINY_SLACK_SECONDS = 1e-9
# A window shorter than this states its capacity with a caveat, as the advice does.
SHORT_WINDOW_SECONDS = 60.0
# The limits at which a replica runs its cap, the mean it ran (what the cache held), or
# that mean scaled by a token budget over what it carried.
AT_CAP = ("requests", "arrivals", "deferred", "unexplained")
HELD_LIMITS = ("kv_cache",)
# The limits the metrics show a replica full at: a model's capacity is read from the
# replicas at one of these where any is.
SHOWN_LIMITS = ("requests", "kv_cache", "token_budget", "batch_tokens")


@dataclass(frozen=True, slots=True)
class Demand:
    """What a replica was asked over the window, per second, and its inputs: requests
    finished, refused at admission, and the growth of those in flight (a batcher: items
    executed and its queue's growth). Never below 0."""

    per_second: float
    completions_per_second: float
    rejections_per_second: float
    growth_per_second: float
    window_seconds: float
    unit: str = "requests/s"

    def inputs(self) -> dict[str, float]:
        return {
            "completions_per_second": self.completions_per_second,
            "rejections_per_second": self.rejections_per_second,
            "growth_per_second": self.growth_per_second,
            "window_seconds": self.window_seconds,
        }


@dataclass(frozen=True, slots=True)
class ReplicaCapacity:
    """What one replica serves within the budget at its binding limit (`per_second`), and
    how: its capacity at the limit, the requests it runs at once there (`concurrency`),
    the seconds a request holds its slot, the share kept for the queue's headroom, the
    inputs, and how far to trust it (as the advice states its numbers)."""

    per_second: float
    limit: str
    at_limit_per_second: float
    concurrency: float
    slot_seconds: float
    headroom: float
    inputs: Mapping[str, float] = field(default_factory=dict)
    confidence: str = "high"
    caveats: tuple[str, ...] = ()
    unit: str = "requests/s"

    @property
    def text(self) -> str:
        share = "" if self.headroom >= 1 else f" x {percent_text(self.headroom)} headroom"
        return (
            f"one replica serves {rate_text(self.per_second)} {self.unit} within the budget at "
            f"{LIMIT_NAMES.get(self.limit, self.limit)}: {count_text(self.concurrency)} at once / "
            f"{seconds_text(self.slot_seconds)} a slot = {rate_text(self.at_limit_per_second)}"
            f"{share}"
        )


def fires_batches(last: SeriesSnapshot, rates: Any) -> bool:
    """A batcher without a running gauge fills batches and fires them (its window's
    `rates` have a mean batch): its progress is items and batches executed, where an LLM
    engine's is tokens and finished requests."""
    return last.running is None and rates.mean_batch is not None


def demand(w: Any) -> Demand | None:
    """The window's demand (module docstring); None over an empty window or where the
    engine counts no finished requests (a batcher: no executed items)."""
    span = w.span
    batcher = fires_batches(w.last, w.rates)
    done = per_second(w.rates.items, span) if batcher else w.rates.requests
    if done is None:
        return None
    rejected = w.rates.rejections or 0.0  # already per second
    growth = (_in_flight(w.last) - _in_flight(w.first)) / span
    unit = "items/s" if batcher else "requests/s"
    # A queue that drains faster than requests come (growth below -done) asks nothing.
    return Demand(max(0.0, done + growth) + rejected, done, rejected, growth, span, unit)


def _in_flight(snapshot: Any) -> float:
    return (snapshot.running or 0.0) + (snapshot.waiting or 0.0)


def mean_running(w: Any) -> float | None:
    """The running gauge's mean over the window's scrapes; None without one."""
    seen = [p.running for p in w.snapshots if p.running is not None]
    return sum(seen) / len(seen) if seen else None


def concurrency_at(limit: str | None, w: Any, running: float | None) -> float | None:
    """The requests a replica runs at once at `limit` (module docstring); None where it
    cannot be said (no cap at the request cap, no running gauge)."""
    if limit in AT_CAP:
        return w.cap
    if running is None:
        return None
    if limit in HELD_LIMITS:
        return running
    if limit == "token_budget":
        budget, carried = w.settings.token_budget, w.tokens_per_step
    elif limit == "batch_tokens":
        budget, carried = w.settings.token_cap, w.last.batch_tokens
    else:
        return None
    return running * budget / carried if budget and carried else None


def headroom(
    slot_seconds: float, concurrency: float, service_seconds: float | None, w: Any
) -> tuple[float, dict[str, float], tuple[str, ...]]:
    """The share of the capacity at the limit that keeps the latency quantile within the
    budget (module docstring), the numbers it read, and what it assumed."""
    settings, budget = w.settings, w.budget
    kind = settings.histogram
    if budget is None:
        return 1.0, {}, ("no latency budget: the count keeps each replica at its limit",)
    if kind not in QUEUED_KINDS:
        return 1.0, {"budget_seconds": budget}, (f"the {kind} latency waits in no queue",)
    caveats: tuple[str, ...] = ()
    if QUEUED_KINDS[kind] is None:
        service = 0.0
    elif service_seconds is None:
        service = slot_seconds
        caveats = ("the service time's quantile is not exposed: its mean stands for it",)
    else:
        service = service_seconds
    slack = max(budget - service, TINY_SLACK_SECONDS)
    spread = math.log(1 / (1 - settings.quantile)) * slot_seconds / (2 * concurrency * slack)
    share = min(1.0, max(MIN_HEADROOM, 1 - spread))
    if share == MIN_HEADROOM:
        caveats += ("the service time leaves the budget little room for a queue",)
    numbers = {"budget_seconds": budget, "service_seconds": service, "quantile": settings.quantile}
    return share, numbers, caveats


def service_quantile(w: Any) -> float | None:
    """The q-quantile of the time a request is served (its latency kind's service part)
    over the window; None where the engine does not expose it."""
    part = QUEUED_KINDS.get(w.settings.histogram)
    hist = w.increase(latency_histogram(part)) if part is not None else None
    return histogram_quantile(w.settings.quantile, hist) if hist is not None else None


def replica_capacity(w: Any) -> ReplicaCapacity | None:
    """What this replica serves within the budget at its binding limit (module
    docstring); None while nothing ran, nothing finished, or the limit's concurrency
    cannot be said. A batcher's: its advised rate limit (`rate_limit_per_second`)."""
    limit = w.limits.binding
    if limit is None:
        return None
    if fires_batches(w.last, w.rates):
        return _batcher_capacity(w, limit)
    done, running = w.rates.requests, mean_running(w)
    concurrency = concurrency_at(limit, w, running)
    if not done or done <= 0 or not running or not concurrency:
        return None
    slot = running / done
    at_limit = concurrency / slot
    share, numbers, caveats = headroom(slot, concurrency, service_quantile(w), w)
    if w.span < SHORT_WINDOW_SECONDS:
        caveats = (f"short window ({w.span:.0f} s)", *caveats)
    if limit not in SHOWN_LIMITS:
        caveats = ("no limit the metrics show binds: counted at its cap", *caveats)
    return ReplicaCapacity(
        at_limit * share,
        limit,
        at_limit,
        concurrency,
        slot,
        share,
        {
            "concurrency": concurrency,
            "mean_running": running,
            "completions_per_second": done,
            "slot_seconds": slot,
            "headroom": share,
            **numbers,
        },
        _confidence(caveats),
        caveats,
    )


def _batcher_capacity(w: Any, limit: str) -> ReplicaCapacity | None:
    item = w.advice.item("rate_limit_per_second")
    if item is None:
        return None
    batch = item.inputs.get("max_batch_size", 0.0)
    return ReplicaCapacity(
        item.value,
        limit,
        item.value,
        batch,
        batch / item.value if item.value > 0 else 0.0,
        1.0,
        dict(item.inputs),
        item.confidence,
        (*item.caveats, f"the rate limit keeps its device {percent_text(MAX_DEVICE_LOAD)} busy"),
        unit="items/s",
    )


def _confidence(caveats: tuple[str, ...]) -> str:
    return "low" if len(caveats) > 1 else "medium" if caveats else "high"
