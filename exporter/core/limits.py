"""What limits the batch: each limit an engine applies, its reading against its bound, and
which one binds now. Pure: plain numbers in, a `Limits` out.

The limits (docs/metrics.md, "What limits the batch", says what each reads in which engine):
- `requests`: running requests against the request cap (vLLM's --max-num-seqs, a
  batcher's max batch size);
- `kv_cache`: KV cache usage against full, where preemptions say it is short;
- `token_budget`: tokens an engine step carries against the per-step token budget (vLLM's
  --max-num-batched-tokens, which no engine exposes: from configuration, never guessed);
- `batch_tokens`: tokens the running batch holds against a token cap (TGI's
  --max-batch-total-tokens);
- `deferred`: waiting requests held back by a transient constraint rather than by a lack
  of room (vLLM's waiting_by_reason "deferred"), as a share of those waiting;
- `max_wait` and `latency_budget`: an in-house batcher's batches fired by its timeout or
  its latency budget, as a share of the batches it fired;
- `arrivals`: nothing waits, so the batch is as large as the traffic makes it.

The binding limit, first match: none while nothing runs, waits or is preempted (a
preemption means a request ran, whatever the gauges read); for an in-house batcher,
its max batch size when batches fill near it, `arrivals` while nothing waits, else the
trigger (timeout: `max_wait`, budget: `latency_budget`) that fired most batches early;
while nothing waits, the KV cache if it preempts, the request (or batch-token) cap the
batch has reached, else `arrivals`; the KV cache when it is full or preempting below the
request cap, or preempting at it; the token budget below the request
cap with KV room; then the request cap, the batch-token cap, the deferred share; and
`unexplained` when requests wait and no limit the metrics show is at its bound. The
diagnosis (`diagnosis.diagnose`) applies the same predicates (`at_bound`, `kv_short`), so a
state that names a limit and the binding limit agree (tests/exporter/test_limits.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

LIMITS = (
    "requests",
    "kv_cache",
    "token_budget",
    "batch_tokens",
    "deferred",
    "max_wait",
    "latency_budget",
    "arrivals",
)
UNEXPLAINED = "unexplained"
# Each limit as a sentence names it (the diagnosis' reasons).
LIMIT_NAMES = {
    "requests": "the request cap",
    "kv_cache": "the KV cache",
    "token_budget": "the token budget",
    "batch_tokens": "the batch-token cap",
    "deferred": "deferred requests",
    "max_wait": "the batcher's max wait",
    "latency_budget": "the batcher's latency budget",
    "arrivals": "arrivals",
}
# What `Limits.binding` may name (besides None).
BINDING_CHOICES = (*LIMITS, UNEXPLAINED)
# A batcher's trigger -> the limit that fired the batch.
TRIGGER_LIMITS = {"full": "requests", "timeout": "max_wait", "budget": "latency_budget"}
# Deferred requests bind when they are at least this share of those waiting.
DEFERRED_SHARE = 0.5


# Not frozen: eight built a series at every evaluation, and a frozen dataclass's __init__ costs
# several times a plain one's (an object.__setattr__ a field). Nothing changes one once
# built: the renders read it from other threads.
@dataclass(slots=True)
class LimitReading:
    """One limit at one evaluation: `ratio` (its reading over its bound; None when it cannot
    be judged), `exposed` (the engine publishes what it needs; a token budget also needs
    configuring), and `reading`, the words: what was read, or why nothing could be."""

    limit: str
    ratio: float | None
    exposed: bool
    reading: str


@dataclass(frozen=True, slots=True)
class Limits:
    """Every limit's reading, the one that binds (a LIMITS name, `unexplained`, or None
    while the gauges read no request: `nothing_ran`), and every limit at its bound now,
    the binding one first."""

    readings: tuple[LimitReading, ...] = ()
    binding: str | None = None
    at_bound: tuple[str, ...] = ()

    def ratio(self, limit: str) -> float | None:
        return next((r.ratio for r in self.readings if r.limit == limit), None)

    def reading(self, limit: str) -> str | None:
        return next((r.reading for r in self.readings if r.limit == limit), None)


# Not frozen: built at every evaluation and read once, and a frozen dataclass's __init__
# costs several times a plain one's (an object.__setattr__ a field).
@dataclass(slots=True)
class LimitInputs:
    """What the breakdown reads. `running`: the recent peak (as the diagnosis reads it), or
    a batcher's mean fired batch. `trigger_shares`: a batcher's batches fired by trigger
    over the window, as shares. `fired_batches`: a batcher that fills and fires batches."""

    running: float | None = None
    waiting: float | None = None
    cap: float | None = None
    kv_usage: float | None = None
    preemptions_per_second: float | None = None
    tokens_per_step: float | None = None
    token_budget: float | None = None
    batch_tokens: float | None = None
    token_cap: float | None = None
    waiting_deferred: float | None = None
    fired_batches: bool = False
    trigger_shares: Mapping[str, float] = field(default_factory=dict)
    near_cap: float = 0.9
    kv_high: float = 0.9


def ratio_of(reading: float | None, bound: float | None) -> float | None:
    """A reading over its bound; None when either is unknown or the bound is not positive."""
    if reading is None or bound is None or bound <= 0:
        return None
    return reading / bound


def at_bound(ratio: float | None, near: float) -> bool:
    """A limit is at its bound from `near` (the near-cap share) of it on."""
    return ratio is not None and ratio >= near


def kv_short(kv_usage: float | None, preemptions_per_second: float | None, kv_high: float) -> bool:
    """The KV cache is at its bound: full past `kv_high`, or preempting requests."""
    return (kv_usage is not None and kv_usage >= kv_high) or (preemptions_per_second or 0) > 0


def deferred_bind(waiting: float | None, deferred: float | None) -> bool:
    """Deferred requests are what holds the queue: some, and at least DEFERRED_SHARE of it."""
    return bool(deferred) and bool(waiting) and deferred >= DEFERRED_SHARE * waiting


def _count(x: float) -> str:
    return f"{x:.0f}" if float(x).is_integer() else f"{x:.1f}"


def _requests(x: LimitInputs) -> LimitReading:
    ratio = ratio_of(x.running, x.cap)
    return LimitReading(
        "requests",
        ratio,
        x.running is not None,
        (
            f"{_count(x.running)} of {_count(x.cap)} "
            + ("in a fired batch on average" if x.fired_batches else "running")
        )
        if ratio is not None
        else "the request cap is unknown: configure `cap`"
        if x.running is not None
        else "the engine does not expose its running requests",
    )


def _kv_cache(x: LimitInputs) -> LimitReading:
    exposed = x.kv_usage is not None
    return LimitReading(
        "kv_cache",
        x.kv_usage,
        exposed,
        f"{x.kv_usage:.0%} used"
        + (f", {x.preemptions_per_second:.2f} preemptions/s" if x.preemptions_per_second else "")
        if exposed
        else "the engine does not expose its KV cache usage",
    )


def _token_budget(x: LimitInputs) -> LimitReading:
    ratio = ratio_of(x.tokens_per_step, x.token_budget)
    return LimitReading(
        "token_budget",
        ratio,
        x.tokens_per_step is not None and x.token_budget is not None,
        f"{x.tokens_per_step:.1f} tokens per step of a {_count(x.token_budget)}-token budget"
        if ratio is not None
        else f"{x.tokens_per_step:.1f} tokens per step; the token budget "
        "(--max-num-batched-tokens) is not configured for this target, so it cannot "
        "be judged: set `max_num_batched_tokens`"
        if x.tokens_per_step is not None
        else "the engine does not expose its tokens per step (or no step ran in the window)",
    )


def _batch_tokens(x: LimitInputs) -> LimitReading:
    ratio = ratio_of(x.batch_tokens, x.token_cap)
    return LimitReading(
        "batch_tokens",
        ratio,
        ratio is not None,
        f"the batch holds {_count(x.batch_tokens)} of {_count(x.token_cap)} tokens"
        if ratio is not None
        else "no batch-token reading against a token cap (`token_cap`)",
    )


def _deferred(x: LimitInputs) -> LimitReading:
    exposed = x.waiting_deferred is not None
    return LimitReading(
        "deferred",
        ratio_of(x.waiting_deferred, x.waiting) if exposed else None,
        exposed,
        f"{_count(x.waiting_deferred)} of {_count(x.waiting or 0)} waiting are deferred"
        if exposed
        else "the engine does not say why requests wait",
    )


def _fired_by(trigger: str) -> Callable[[LimitInputs], LimitReading]:
    """The reading of the limit a batcher's `trigger` fires batches at (TRIGGER_LIMITS)."""
    limit = TRIGGER_LIMITS[trigger]

    def reading(x: LimitInputs) -> LimitReading:
        share = x.trigger_shares.get(trigger)
        return LimitReading(
            limit,
            share,
            share is not None,
            f"{share:.0%} of batches fired by its {limit.replace('_', ' ')}"
            if share is not None
            else "only a batcher that counts its triggers says this",
        )

    return reading


def _arrivals(x: LimitInputs) -> LimitReading:
    return LimitReading(
        "arrivals",
        None,
        x.waiting is not None,
        "nothing waits"
        if x.waiting == 0
        else f"{_count(x.waiting)} wait"
        if x.waiting is not None
        else "the engine does not expose its queue",
    )


# Each limit's reading, in LIMITS order.
READINGS = (
    _requests,
    _kv_cache,
    _token_budget,
    _batch_tokens,
    _deferred,
    _fired_by("timeout"),
    _fired_by("budget"),
    _arrivals,
)


def _readings(x: LimitInputs) -> list[LimitReading]:
    """Each limit's reading, in LIMITS order."""
    return [read(x) for read in READINGS]


def nothing_ran(
    running: float | None, waiting: float | None, preemptions_per_second: float | None
) -> bool:
    """No request ran or waited: the gauges read none, and nothing was preempted. A
    preemption means a request ran: vLLM's gauges can read 0 while it preempts (a KV-bound
    sweep beside a CPU hog read 0 running, 0 waiting and 0% KV at every scrape of a step
    that preempted 177 requests a second and finished 4 a second). The binding limit is
    then none, and the diagnosis idle unless a saturated episode says requests ran
    between the scrapes (diagnosis._idle)."""
    return (running or 0) + (waiting or 0) == 0 and not (preemptions_per_second or 0) > 0


def _binding(x: LimitInputs, bound: set[str]) -> str | None:
    """The binding limit, first match (the module docstring)."""
    if nothing_ran(x.running, x.waiting, x.preemptions_per_second):
        return None
    preempting = (x.preemptions_per_second or 0) > 0
    if x.fired_batches:
        # A batcher's batch fills to its max batch size, or waits for arrivals; while items
        # wait below it, the trigger that fired most of the rest of the batches binds.
        if "requests" in bound:
            return "requests"
        if not x.waiting:
            return "arrivals"
        early = {t: s for t, s in x.trigger_shares.items() if t != "full" and s > 0}
        return TRIGGER_LIMITS[max(early, key=early.__getitem__)] if early else UNEXPLAINED
    if not x.waiting:
        met = [limit for limit in ("requests", "batch_tokens") if limit in bound]
        return "kv_cache" if preempting else met[0] if met else "arrivals"
    below_cap = "requests" not in bound and "batch_tokens" not in bound
    if "kv_cache" in bound and (below_cap or preempting):
        return "kv_cache"
    if "token_budget" in bound and below_cap:
        return "token_budget"
    for limit in ("requests", "batch_tokens", "deferred"):
        if limit in bound:
            return limit
    return UNEXPLAINED


def limits(x: LimitInputs) -> Limits:
    """The breakdown: every limit's reading, the binding one, and those at their bound."""
    readings = _readings(x)
    by_limit = {r.limit: r for r in readings}
    bound = {
        limit
        for limit in ("requests", "token_budget", "batch_tokens")
        if at_bound(by_limit[limit].ratio, x.near_cap)
    }
    if kv_short(x.kv_usage, x.preemptions_per_second, x.kv_high):
        bound.add("kv_cache")
    if deferred_bind(x.waiting, x.waiting_deferred):
        bound.add("deferred")
    # A batcher's early triggers; batches fired full show in the request cap's own ratio.
    for trigger, share in x.trigger_shares.items():
        if trigger != "full" and share >= DEFERRED_SHARE:
            bound.add(TRIGGER_LIMITS[trigger])
    binding = _binding(x, bound)
    ordered = [binding] if binding in bound else []
    ordered += [limit for limit in LIMITS if limit in bound and limit != binding]
    return Limits(tuple(readings), binding, tuple(ordered))
