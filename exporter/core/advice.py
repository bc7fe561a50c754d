"""From diagnosis to advice: what to change, and by how much, with the arithmetic shown.

Pure functions over plain data (no I/O, no clock). `batchscope.exporter.core.evaluate` gathers an
`AdviceInputs` from a series' window; `advise` turns it into `Advice` items, each a
number with the inputs it used and how far to trust it. The formulas are in
`batchscope.exporter.core.capacity`.

Two families, after the public articles they come from:
- LLM engines ("Continuous Batching: Why Your GPU Waits for the Slowest Request"): how
  many requests of today's length mix the KV cache holds, set against the cap
  (`--max-num-seqs`); the KV tokens that would make the cap reachable; what continuous
  batching gains over a static loop on this traffic.
- In-house batchers ("Batching Requests to a Model Server"; Terrane's "Dynamic batching:
  more throughput without wrecking the tail"): the fixed `max_wait` / `max_batch_size`
  pair that would keep today's rate in the budget, whether any can, and the rate at
  which the batcher runs out.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from batchscope.exporter.core.capacity import (
    MAX_DEVICE_LOAD,
    KvScrape,
    batch_cost,
    budget_headroom,
    cache_fill,
    fixed_pair,
    kv_bytes_for,
    kv_tokens_for,
    memory_limited,
    rate_limit,
    sustainable_concurrency,
    tokens_per_request_from_lengths,
    tokens_per_request_over_window,
    tokens_per_running_request,
)
from batchscope.exporter.core.static_util import UtilizationEstimate

# Fewer scrapes than this in the window say too little to advise anything.
MIN_SCRAPES = 3
# A window shorter than this gives advice flagged "low" confidence.
SHORT_WINDOW_SECONDS = 60.0
# Busy scrapes (something running, KV usage known) needed to measure tokens per request.
MIN_BUSY_SCRAPES = 3
# Padding above this share of the batched positions is worth bucketing by length for.
PADDING_WORTH_FIXING = 0.2


# Not frozen: about ten built a series at every evaluation, and a frozen dataclass's
# __init__ costs several times a plain one's (an object.__setattr__ a field). Nothing
# changes one once built but `words`, once written (`text`): the renders read it from
# other threads, and any of them writes the same sentence.
@dataclass(slots=True, eq=False)
class AdviceItem:
    """One number of advice: what it is (`kind`), its value and unit, a sentence saying
    what to do with it (`text`), the inputs it came from, and how far to trust it.

    The sentence is written when it is first read, by `words`, which then holds it: every
    evaluation advises, and most evaluations' advice is only ever read as numbers
    (/metrics), while writing its sentences with their figures cost more than working the
    figures out. So `words` reads only values that stay as they were when the item was
    made, holds no more than those (not the whole AdviceInputs), and never raises: what
    could (a division, a floor) is worked out when the item is made, so that a bad value
    fails its target's evaluation, not every target's JSON body. Two items are equal when
    they say the same: their `text`, not their `words`, is compared.
    """

    kind: str
    value: float
    unit: str
    words: Callable[[], str] | str
    inputs: Mapping[str, float] = field(default_factory=dict)
    confidence: str = "high"
    caveats: tuple[str, ...] = ()

    @property
    def text(self) -> str:
        if not isinstance(self.words, str):
            self.words = self.words()
        return self.words

    def _said(self) -> tuple:
        return (
            self.kind,
            self.value,
            self.unit,
            self.text,
            self.inputs,
            self.confidence,
            self.caveats,
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, AdviceItem):
            return NotImplemented
        return self._said() == other._said()


@dataclass(frozen=True, slots=True)
class Advice:
    """The advice for one series: the items and a one-line summary; with too little data
    no items, and `summary` says what is missing."""

    items: tuple[AdviceItem, ...] = ()
    summary: str = ""
    enough_data: bool = False

    def item(self, kind: str) -> AdviceItem | None:
        """The item of that kind, if advised."""
        return next((i for i in self.items if i.kind == kind), None)


# Not frozen: built at every evaluation and read once, and a frozen dataclass's __init__
# costs several times a plain one's (an object.__setattr__ a field).
@dataclass(slots=True)
class AdviceInputs:
    """What the advice reads from one series' window. Unknown stays None (or empty)."""

    engine: str = ""
    window_seconds: float = 0.0
    scrapes: int = 0
    running: float | None = None
    waiting: float | None = None
    cap: float | None = None
    kv_usage: float | None = None
    # vllm:cache_config_info
    kv_capacity_tokens: float | None = None
    block_size: float | None = None
    gpu_memory_utilization: float | None = None
    kv_cache_memory_bytes: float | None = None
    # Over the window: each scrape's running, KV usage and waiting, and whether requests
    # waited while the batch was at the cap (at least near_cap x cap).
    kv_scrapes: Sequence[KvScrape] = ()
    waited_at_cap: bool = False
    near_cap: float = 0.9
    # Length mix over the window, from the histograms' increases.
    mean_prompt_tokens: float | None = None
    mean_output_tokens: float | None = None
    length_requests: float = 0.0
    static: UtilizationEstimate | None = None
    # In-house batchers.
    arrival_per_second: float | None = None
    cost_by_size: Mapping[int, float] = field(default_factory=dict)
    budget_seconds: float | None = None
    latency_seconds: float | None = None
    latency_quantile: float = 0.99
    # The engine gave no latency histogram: latency_seconds is a mean per request.
    latency_is_mean: bool = False
    max_wait_seconds: float | None = None
    # Share of batched token positions that were padding (batchers that expose lengths).
    padding_waste: float | None = None
    # The per-step token budget: mean tokens a step carried over the window, the configured
    # budget, mean seconds per engine step (window over steps counted), and vLLM's own
    # statement of how many requests of max_model_len its KV cache holds.
    tokens_per_step: float | None = None
    token_budget: float | None = None
    step_seconds: float | None = None
    kv_max_concurrency: float | None = None
    # The limit that binds the batch now (`batchscope.exporter.core.limits`): the advice for it leads.
    binding_limit: str | None = None


def _figure_text(x: float) -> str:
    # A ratio of sums can land a hair off a whole number (2.9999999999999996): say 3.
    if abs(x) >= 100 or float(round(x, 6)).is_integer():
        return f"{x:,.0f}"
    return f"{x:.1f}" if abs(x) >= 10 else f"{x:.2f}"


def _caveats(inputs: AdviceInputs) -> tuple[str, ...]:
    if inputs.window_seconds < SHORT_WINDOW_SECONDS:
        return (f"short window ({inputs.window_seconds:.0f} s of {inputs.scrapes} scrapes)",)
    return ()


def _confidence(caveats: Sequence[str]) -> str:
    return "low" if len(caveats) > 1 else "medium" if caveats else "high"


def _item(
    kind: str,
    value: float,
    unit: str,
    words: Callable[[], str],
    inputs: Mapping[str, float | None],
    caveats: Sequence[str] = (),
) -> AdviceItem:
    return AdviceItem(
        kind, float(value), unit, words, dict(inputs), _confidence(caveats), tuple(caveats)
    )


def kv_advice(inputs: AdviceInputs) -> list[AdviceItem]:
    """The KV cache items for an LLM engine that states its KV capacity."""
    capacity = inputs.kv_capacity_tokens
    if capacity is None:
        return []
    window = _caveats(inputs)
    items = [
        _item(
            "kv_capacity_tokens",
            capacity,
            "tokens",
            lambda: f"the KV cache holds {_figure_text(capacity)} tokens",
            {
                "kv_capacity_tokens": capacity,
                **({"block_size": inputs.block_size} if inputs.block_size else {}),
            },
        ),
    ]
    now = tokens_per_running_request(inputs.kv_usage, capacity, inputs.running)
    if now is not None:
        items.append(
            _item(
                "kv_tokens_per_request",
                now,
                "tokens",
                lambda: f"each running request holds {_figure_text(now)} KV tokens now",
                {
                    "kv_usage": inputs.kv_usage,
                    "kv_capacity_tokens": capacity,
                    "running": inputs.running,
                },
            )
        )
    busy = [(r, u, w) for r, u, w in inputs.kv_scrapes if r > 0]
    measured = (
        tokens_per_request_over_window(busy, capacity) if len(busy) >= MIN_BUSY_SCRAPES else None
    )
    if measured is not None:
        items.append(
            _item(
                "kv_tokens_per_request_window",
                measured,
                "tokens",
                lambda: (
                    f"over the window a running request held {_figure_text(measured)} KV tokens on "
                    "average"
                ),
                {
                    "kv_capacity_tokens": capacity,
                    "busy_scrapes": len(busy),
                    "mean_running": sum(r for r, _, _ in busy) / len(busy),
                },
                window,
            )
        )
    # Requests that wait below the cap while steps run at the token budget wait for the
    # budget, not for memory: such a window measures no fill.
    limited = (
        []
        if _budget_binds(inputs)
        else memory_limited(inputs.kv_scrapes, inputs.cap, inputs.near_cap)
    )
    # Memory must hold the batch for most of the window: a few scrapes of a batch still
    # ramping up after a start also wait below the cap, with the cache nearly empty.
    held = len(limited) >= MIN_BUSY_SCRAPES and 2 * len(limited) >= len(busy)
    fill = cache_fill(limited) if held else None
    if fill is not None:
        items.append(
            _item(
                "kv_cache_fill",
                fill,
                "ratio",
                lambda: (
                    "while requests waited for memory the scheduler kept the KV cache "
                    f"{fill:.0%} full"
                ),
                {"memory_limited_scrapes": len(limited)},
                window,
            )
        )
    from_lengths = None
    prompt, output = inputs.mean_prompt_tokens, inputs.mean_output_tokens
    if prompt is not None and output is not None:
        from_lengths = tokens_per_request_from_lengths(prompt, output, inputs.block_size)
        items.append(
            _item(
                "kv_tokens_per_request_lengths",
                from_lengths,
                "tokens",
                lambda: (
                    f"today's length mix (prompt {_figure_text(prompt)}, output "
                    f"{_figure_text(output)} tokens on average) holds "
                    f"{_figure_text(from_lengths)} "
                    "KV tokens per running request"
                ),
                {
                    "mean_prompt_tokens": inputs.mean_prompt_tokens,
                    "mean_output_tokens": inputs.mean_output_tokens,
                    "requests": inputs.length_requests,
                },
                (
                    *window,
                    "means of the length histograms: long outputs hold the cache longer "
                    "than the mean says",
                ),
            )
        )
    if measured is not None:
        per_request, source = measured, "measured in the cache over the window"
        source_caveats: tuple[str, ...] = window
    elif from_lengths is not None:
        per_request, source = from_lengths, "from the length mix"
        source_caveats = (*window, "tokens per request from the length mix, not measured")
    else:
        return items
    if per_request <= 0:
        return items
    sustainable = sustainable_concurrency(capacity, per_request, fill or 1.0)
    basis = {
        "kv_capacity_tokens": capacity,
        "kv_tokens_per_request": per_request,
        "kv_cache_fill": fill or 1.0,
    }
    items.append(
        _item(
            "sustainable_concurrency",
            sustainable,
            "requests",
            lambda: (
                f"the KV cache holds {_figure_text(sustainable)} requests of today's mix "
                f"({_figure_text(capacity)} tokens / {_figure_text(per_request)} per request, "
                f"{source}{_filled_text(fill)})"
            ),
            basis,
            source_caveats,
        )
    )
    items += cap_advice(inputs, sustainable, per_request, fill or 1.0, basis, source_caveats)
    return items


def _filled_text(fill: float | None) -> str:
    """How full the sustainable concurrency takes the KV cache to be, in words."""
    if fill is None:
        return ", if the scheduler fills it (no memory-limited scrapes to measure the fill)"
    return f", filled to {fill:.0%} as measured while requests waited"


def _memory_text(
    extra_bytes: float | None, memory_bytes: float | None, gpu_memory_utilization: float | None
) -> str:
    """The KV memory a cap needs, in words ("" when the engine does not state its own,
    `memory_bytes`)."""
    if extra_bytes is None or memory_bytes is None:
        return ""
    gib = 1024**3
    return (
        f" ({extra_bytes / gib:.2f} GiB of KV memory, "
        f"+{(extra_bytes - memory_bytes) / gib:.2f} GiB"
        + (
            f": raise gpu_memory_utilization from {gpu_memory_utilization:g}"
            if gpu_memory_utilization is not None
            else ""
        )
        + ")"
    )


def cap_advice(
    inputs: AdviceInputs,
    sustainable: float,
    per_request: float,
    fill: float,
    basis: Mapping[str, float],
    caveats: Sequence[str],
) -> list[AdviceItem]:
    """The verdict on raising the cap, and the KV cache the cap would need."""
    cap = inputs.cap
    capacity = inputs.kv_capacity_tokens
    if cap is None or capacity is None:
        return []
    inputs_used = {**basis, "cap": cap, "sustainable_concurrency": sustainable}
    items = []
    if sustainable < cap:
        items.append(
            _item(
                "raise_cap_helps",
                0,
                "bool",
                lambda: (
                    f"memory-bound: raising max-num-seqs will not help: the KV cache holds "
                    f"{_figure_text(sustainable)} requests of today's mix, below the cap of "
                    f"{_figure_text(cap)}"
                ),
                inputs_used,
                caveats,
            )
        )
    elif inputs.waited_at_cap:
        up_to = math.floor(sustainable)
        items.append(
            _item(
                "raise_cap_helps",
                1,
                "bool",
                lambda: (
                    f"requests waited at the cap of {_figure_text(cap)} and the KV cache holds "
                    f"{_figure_text(sustainable)} of today's mix: raising max-num-seqs can help, "
                    f"up to {up_to}"
                ),
                inputs_used,
                caveats,
            )
        )
    needed = kv_tokens_for(cap, per_request, fill)
    if needed > capacity:
        memory_bytes, utilization = inputs.kv_cache_memory_bytes, inputs.gpu_memory_utilization
        extra_bytes = kv_bytes_for(needed, capacity, memory_bytes)
        fit = fill * capacity / cap
        times = needed / capacity
        items.append(
            _item(
                "kv_tokens_for_cap",
                needed,
                "tokens",
                lambda: (
                    f"the cap of {_figure_text(cap)} needs {_figure_text(needed)} KV tokens at "
                    f"today's lengths, {times:.1f}x the {_figure_text(capacity)} there"
                    f"{_memory_text(extra_bytes, memory_bytes, utilization)}; or requests holding "
                    "at most "
                    f"{_figure_text(fit)} tokens each (max_model_len, shorter prompts)"
                ),
                {
                    **inputs_used,
                    "kv_tokens_needed": needed,
                    **(
                        {"kv_cache_memory_bytes": inputs.kv_cache_memory_bytes}
                        if inputs.kv_cache_memory_bytes
                        else {}
                    ),
                },
                caveats,
            )
        )
    return items


# The advised token budget is the tokens a step needs, rounded up to a multiple of this.
TOKEN_BUDGET_STEP = 64


def token_budget_advice(inputs: AdviceInputs) -> list[AdviceItem]:
    """The tokens a step needs to run the cap at today's length mix, the
    --max-num-batched-tokens that carries it, and what that costs in step time.

    At the cap, every running request decodes one token a step and finishes after
    `mean_output_tokens` steps, so cap / output requests finish each step and as many must
    be prefilled: a step needs cap x (1 + prompt / output) tokens. Step time is taken to
    grow in proportion to the tokens a step carries (a compute-bound step: an upper
    bound, since a step that is memory-bound costs barely more with more tokens); the
    inter-token latency of running decodes is one step.
    """
    cap, prompt, output = inputs.cap, inputs.mean_prompt_tokens, inputs.mean_output_tokens
    now, budget = inputs.tokens_per_step, inputs.token_budget
    if None in (cap, prompt, output, now, budget) or not output or not now or not cap:
        return []
    needed = cap * (1 + prompt / output)
    advised = math.ceil(needed / TOKEN_BUDGET_STEP) * TOKEN_BUDGET_STEP
    caveats = (*_caveats(inputs), "means of the length histograms")
    basis = {
        "cap": cap,
        "mean_prompt_tokens": prompt,
        "mean_output_tokens": output,
        "tokens_per_step": now,
        "token_budget": budget,
    }
    items = [
        _item(
            "tokens_per_step_for_cap",
            needed,
            "tokens",
            lambda: (
                f"running the cap of {_figure_text(cap)} at today's mix (prompt "
                f"{_figure_text(prompt)}, output {_figure_text(output)} tokens on average) needs "
                f"{_figure_text(needed)} tokens a step: {_figure_text(cap)} decode tokens and "
                f"{_figure_text(needed - cap)} prefill tokens; steps carry {_figure_text(now)} "
                f"of a {_figure_text(budget)}-token budget"
            ),
            basis,
            caveats,
        )
    ]
    if needed <= budget:
        return items
    growth = advised / now
    step = inputs.step_seconds
    today = f" (steps come every {step * 1000:.1f} ms today)" if step else ""
    verdict = (
        "token-budget-bound: raising max-num-seqs will not help; " if _budget_binds(inputs) else ""
    )
    items.append(
        _item(
            "token_budget_for_cap",
            advised,
            "tokens",
            lambda: (
                f"{verdict}--max-num-batched-tokens "
                f"{advised} ({_figure_text(needed)} rounded up to a multiple of "
                f"{TOKEN_BUDGET_STEP}) would carry the cap, at up to {growth:.1f}x the step time"
                f"{today}, and so the inter-token latency of running decodes"
                + (f", about {step * growth * 1000:.0f} ms" if step else "")
                + "; or serve the long-prompt traffic separately"
            ),
            {**basis, "tokens_needed": needed, **({"step_seconds": step} if step else {})},
            (*caveats, "step time taken to grow with the tokens a step carries (an upper bound)"),
        )
    )
    return items


def stated_concurrency_advice(inputs: AdviceInputs, sustainable: float | None) -> list[AdviceItem]:
    """vLLM's own capacity statement (kv_cache_max_concurrency), beside the advisor's."""
    stated = inputs.kv_max_concurrency
    if stated is None:
        return []

    def text() -> str:
        beside = (
            f"; at today's mix it holds {_figure_text(sustainable)}: vLLM's figure assumes "
            "every request at max_model_len, and today's requests are shorter or longer than "
            "that"
            if sustainable is not None
            else ""
        )
        return (
            f"vLLM states its KV cache holds {_figure_text(stated)} requests of max_model_len"
            + beside
        )

    return [
        _item(
            "kv_max_concurrency_stated",
            stated,
            "requests",
            text,
            {"kv_max_concurrency": stated},
        )
    ]


def static_advice(inputs: AdviceInputs) -> list[AdviceItem]:
    """What continuous batching gains over a static loop on this traffic
    ("Continuous Batching: Why Your GPU Waits for the Slowest Request")."""
    static = inputs.static
    if static is None:
        return []
    gain = static.continuous_batching_gain
    lower, upper = static.gain_lower, static.gain_upper
    continuous = inputs.engine in {"vllm", "tgi", "sglang"}

    def text() -> str:
        if continuous:
            return (
                f"continuous batching does {gain:.2f}x the useful work a static loop of "
                f"{static.batch_size} would on this traffic (bounds {lower:.2f}-{upper:.2f}x)"
            )
        return (
            f"switching from static to continuous batching would gain {gain:.2f}x "
            f"(bounds {lower:.2f}-{upper:.2f}x): a static batch of "
            f"{static.batch_size} wastes {1 - static.estimate:.0%} of its slot-steps"
        )

    return [
        _item(
            "continuous_batching_gain",
            gain,
            "ratio",
            text,
            {
                "static_utilization": static.estimate,
                "lower": static.lower,
                "upper": static.upper,
                "batch_size": static.batch_size,
                "requests": static.requests,
            },
            (*_caveats(inputs), "estimated from the output-length histogram"),
        )
    ]


def batcher_advice(inputs: AdviceInputs) -> list[AdviceItem]:
    """The fixed pair for today's rate, the budget headroom, and the rate the batcher's
    current max batch size runs out at."""
    rate = inputs.arrival_per_second
    costs = inputs.cost_by_size
    budget = inputs.budget_seconds
    if rate is None or rate <= 0 or not costs or budget is None:
        return []
    caveats = _caveats(inputs)
    measured = {f"cost_b{size}_seconds": cost for size, cost in costs.items()}
    items = [
        _item(
            "arrival_per_second",
            rate,
            "items/s",
            lambda: f"{_figure_text(rate)} items/s arrive",
            {"arrival_per_second": rate},
            caveats,
        )
    ]
    latency = inputs.latency_seconds
    if latency is not None:
        headroom = budget_headroom(latency, budget)
        statistic = "mean" if inputs.latency_is_mean else f"p{inputs.latency_quantile * 100:g}"
        mean = (
            ("a mean latency (no histogram): the tail is longer",) if inputs.latency_is_mean else ()
        )
        items.append(
            _item(
                "budget_headroom",
                headroom,
                "ratio",
                lambda: (
                    f"{statistic} {latency * 1000:.1f} ms of a "
                    f"{budget * 1000:.0f} ms budget: {headroom:.0%} headroom"
                ),
                {"latency_seconds": latency, "budget_seconds": budget},
                (*caveats, *mean),
            )
        )
    cap = int(inputs.cap) if inputs.cap else None
    if cap is not None and (cost := batch_cost(costs, cap)) is not None:
        limit = rate_limit(cap, cost)
        items.append(
            _item(
                "rate_limit_per_second",
                limit,
                "items/s",
                lambda: (
                    f"at its max batch of {cap} ({cost * 1000:.2f} ms) this batcher keeps the "
                    "device "
                    f"{MAX_DEVICE_LOAD:.0%} busy at {_figure_text(limit)} items/s: today's rate is "
                    f"{rate / limit:.0%} of it"
                ),
                {"max_batch_size": cap, "arrival_per_second": rate, **measured},
                caveats,
            )
        )
    pair = fixed_pair(rate, costs, budget)
    if pair is None:
        return items
    pair_inputs = {"arrival_per_second": rate, "budget_seconds": budget, **measured}
    sizes = f"cost measured for batches of {min(costs)}-{max(costs)}"
    pair_caveats = (*caveats, sizes)
    max_wait = inputs.max_wait_seconds

    def text() -> str:
        if not pair.feasible:
            return (
                f"no fixed pair keeps {_figure_text(rate)} items/s in the {budget * 1000:.0f} ms "
                "budget "
                f"({sizes}): the best, batches of {pair.batch_size}, leaves the device "
                f"{pair.load:.0%} busy with a worst latency of "
                f"{pair.worst_latency_seconds * 1000:.1f} ms; add capacity or raise the budget"
            )
        today = (
            f" (today: max_wait {max_wait * 1000:.1f} ms, max_batch_size {cap})"
            if max_wait is not None and cap is not None
            else ""
        )
        low = (
            f"; at a tenth of this rate the same pair makes each request wait up to "
            f"{pair.max_wait_seconds * 1000:.1f} ms for a batch that does not fill"
            if pair.max_wait_seconds > 0
            else ""
        )
        return (
            f"a fixed batcher needs max_wait {pair.max_wait_seconds * 1000:.1f} ms and "
            f"max_batch_size {pair.max_batch_size} at {_figure_text(rate)} items/s{today}: batches "
            "of "
            f"{pair.batch_size}, device {pair.load:.0%} busy, worst latency "
            f"{pair.worst_latency_seconds * 1000:.1f} ms of {budget * 1000:.0f} ms; it runs "
            f"out at {_figure_text(pair.rate_limit_per_second)} items/s{low}"
        )

    items += [
        _item("fixed_pair_feasible", int(pair.feasible), "bool", text, pair_inputs, pair_caveats),
        _item(
            "advised_max_wait_seconds", pair.max_wait_seconds, "s", text, pair_inputs, pair_caveats
        ),
        _item(
            "advised_max_batch_size", pair.max_batch_size, "items", text, pair_inputs, pair_caveats
        ),
    ]
    return items


def padding_advice(inputs: AdviceInputs) -> list[AdviceItem]:
    """Padding waste where the batcher exposes its token positions (the bucketing of
    "Batching Requests to a Model Server", the split by shape of "Dynamic batching")."""
    waste = inputs.padding_waste
    if waste is None:
        return []

    def text() -> str:
        if waste >= PADDING_WORTH_FIXING:
            return (
                f"{waste:.0%} of the token positions batched were padding: bucket requests by "
                "length before batching, or split very different shapes into their own batches"
            )
        return (
            f"{waste:.0%} of the token positions batched were padding: little to gain "
            "from bucketing by length"
        )

    return [
        _item("padding_waste", waste, "ratio", text, {"padding_waste": waste}, _caveats(inputs))
    ]


def _budget_binds(inputs: AdviceInputs) -> bool:
    """The token budget binds the batch (the breakdown's binding limit): its advice leads,
    and requests that wait below the cap wait for it, not for memory."""
    return inputs.binding_limit == "token_budget"


def advise(inputs: AdviceInputs) -> Advice:
    """Every piece of advice the window supports, or none and why when it supports none."""
    if inputs.scrapes < MIN_SCRAPES or inputs.window_seconds <= 0:
        return Advice(
            summary=f"too little data to advise: {inputs.scrapes} scrapes over "
            f"{inputs.window_seconds:.0f} s (needs at least {MIN_SCRAPES})"
        )
    kv = kv_advice(inputs)
    sustainable = next((i.value for i in kv if i.kind == "sustainable_concurrency"), None)
    token_budget = token_budget_advice(inputs)
    items = [
        *kv,
        *stated_concurrency_advice(inputs, sustainable),
        *token_budget,
        *static_advice(inputs),
        *batcher_advice(inputs),
        *padding_advice(inputs),
    ]
    if not items:
        return Advice(
            summary="nothing to advise from: no KV capacity (vllm:cache_config_info), no "
            "length histograms and no batch cost by size in this window",
            enough_data=True,
        )
    lead = next(
        (
            i
            for kind in (
                *(("token_budget_for_cap",) if _budget_binds(inputs) else ()),
                "raise_cap_helps",
                "fixed_pair_feasible",
                "sustainable_concurrency",
                "continuous_batching_gain",
            )
            for i in items
            if i.kind == kind
        ),
        items[0],
    )
    return Advice(items=tuple(items), summary=lead.text, enough_data=True)
