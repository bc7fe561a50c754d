"""Advice for an LLM engine ("Continuous Batching: Why Your GPU Waits for the Slowest
Request"): how many requests of today's length mix the KV cache holds against the cap
(`--max-num-seqs`), the KV tokens that would make the cap reachable, the token budget a
step needs, and what continuous batching gains over a static loop on this traffic."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from batchscope.exporter.core.advice import (
    MIN_BUSY_SCRAPES,
    AdviceInputs,
    AdviceItem,
    budget_binds,
    caveats_of,
    figure_text,
    item,
)
from batchscope.exporter.core.capacity import (
    cache_fill,
    kv_bytes_for,
    kv_tokens_for,
    memory_limited,
    sustainable_concurrency,
    tokens_per_request_from_lengths,
    tokens_per_request_over_window,
    tokens_per_running_request,
)


def kv_advice(inputs: AdviceInputs) -> list[AdviceItem]:
    """The KV cache items for an LLM engine that states its KV capacity: what a running
    request holds (measured in the cache, or from the length mix), and so how many
    requests of today's mix the cache holds, against the cap."""
    capacity = inputs.kv_capacity_tokens
    if capacity is None:
        return []
    items, measured, fill, from_lengths = _kv_readings(inputs, capacity)
    return items + _held_requests(inputs, capacity, measured, fill, from_lengths)


def _kv_readings(
    inputs: AdviceInputs, capacity: float
) -> tuple[list[AdviceItem], float | None, float | None, float | None]:
    """The cache's capacity, the tokens a request holds now, over the window and by the
    length mix, and how full the scheduler keeps the cache while memory holds the batch:
    the items, and the last three numbers (None where unknown)."""
    window = caveats_of(inputs)
    items = [
        item(
            "kv_capacity_tokens",
            capacity,
            "tokens",
            lambda: f"the KV cache holds {figure_text(capacity)} tokens",
            {
                "kv_capacity_tokens": capacity,
                **({"block_size": inputs.block_size} if inputs.block_size else {}),
            },
        ),
    ]
    now = tokens_per_running_request(inputs.kv_usage, capacity, inputs.running)
    if now is not None:
        items.append(
            item(
                "kv_tokens_per_request",
                now,
                "tokens",
                lambda: f"each running request holds {figure_text(now)} KV tokens now",
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
            item(
                "kv_tokens_per_request_window",
                measured,
                "tokens",
                lambda: (
                    f"over the window a running request held {figure_text(measured)} KV tokens on "
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
    fill = _fill_item(inputs, len(busy), window, items)
    from_lengths = _lengths_item(inputs, window, items)
    return items, measured, fill, from_lengths


def _fill_item(
    inputs: AdviceInputs, busy: int, window: tuple[str, ...], items: list[AdviceItem]
) -> float | None:
    """How full the scheduler kept the cache while memory held the batch (an item added to
    `items`); None where memory did not hold it for most of the window's `busy` scrapes."""
    # Requests that wait below the cap while steps run at the token budget wait for the
    # budget, not for memory: such a window measures no fill.
    limited = (
        []
        if budget_binds(inputs)
        else memory_limited(inputs.kv_scrapes, inputs.cap, inputs.near_cap)
    )
    # Memory must hold the batch for most of the window: a few scrapes of a batch still
    # ramping up after a start also wait below the cap, with the cache nearly empty.
    held = len(limited) >= MIN_BUSY_SCRAPES and 2 * len(limited) >= busy
    fill = cache_fill(limited) if held else None
    if fill is not None:
        items.append(
            item(
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
    return fill


def _lengths_item(
    inputs: AdviceInputs, window: tuple[str, ...], items: list[AdviceItem]
) -> float | None:
    """The KV tokens a running request holds at today's length mix (an item added to
    `items`); None without the length histograms."""
    from_lengths = None
    prompt, output = inputs.mean_prompt_tokens, inputs.mean_output_tokens
    if prompt is not None and output is not None:
        from_lengths = tokens_per_request_from_lengths(prompt, output, inputs.block_size)
        items.append(
            item(
                "kv_tokens_per_request_lengths",
                from_lengths,
                "tokens",
                lambda: (
                    f"today's length mix (prompt {figure_text(prompt)}, output "
                    f"{figure_text(output)} tokens on average) holds "
                    f"{figure_text(from_lengths)} "
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
    return from_lengths


def _held_requests(
    inputs: AdviceInputs,
    capacity: float,
    measured: float | None,
    fill: float | None,
    from_lengths: float | None,
) -> list[AdviceItem]:
    """How many requests of today's mix the cache holds, and the cap's verdict."""
    window = caveats_of(inputs)
    if measured is not None:
        per_request, source = measured, "measured in the cache over the window"
        source_caveats: tuple[str, ...] = window
    elif from_lengths is not None:
        per_request, source = from_lengths, "from the length mix"
        source_caveats = (*window, "tokens per request from the length mix, not measured")
    else:
        return []
    if per_request <= 0:
        return []
    sustainable = sustainable_concurrency(capacity, per_request, fill or 1.0)
    basis = {
        "kv_capacity_tokens": capacity,
        "kv_tokens_per_request": per_request,
        "kv_cache_fill": fill or 1.0,
    }
    held = item(
        "sustainable_concurrency",
        sustainable,
        "requests",
        lambda: (
            f"the KV cache holds {figure_text(sustainable)} requests of today's mix "
            f"({figure_text(capacity)} tokens / {figure_text(per_request)} per request, "
            f"{source}{_filled_text(fill)})"
        ),
        basis,
        source_caveats,
    )
    return [held, *cap_advice(inputs, sustainable, per_request, fill or 1.0, basis, source_caveats)]


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
            item(
                "raise_cap_helps",
                0,
                "bool",
                lambda: (
                    f"memory-bound: raising max-num-seqs will not help: the KV cache holds "
                    f"{figure_text(sustainable)} requests of today's mix, below the cap of "
                    f"{figure_text(cap)}"
                ),
                inputs_used,
                caveats,
            )
        )
    elif inputs.waited_at_cap:
        up_to = math.floor(sustainable)
        items.append(
            item(
                "raise_cap_helps",
                1,
                "bool",
                lambda: (
                    f"requests waited at the cap of {figure_text(cap)} and the KV cache holds "
                    f"{figure_text(sustainable)} of today's mix: raising max-num-seqs can help, "
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
            item(
                "kv_tokens_for_cap",
                needed,
                "tokens",
                lambda: (
                    f"the cap of {figure_text(cap)} needs {figure_text(needed)} KV tokens at "
                    f"today's lengths, {times:.1f}x the {figure_text(capacity)} there"
                    f"{_memory_text(extra_bytes, memory_bytes, utilization)}; or requests holding "
                    "at most "
                    f"{figure_text(fit)} tokens each (max_model_len, shorter prompts)"
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
    caveats = (*caveats_of(inputs), "means of the length histograms")
    basis = {
        "cap": cap,
        "mean_prompt_tokens": prompt,
        "mean_output_tokens": output,
        "tokens_per_step": now,
        "token_budget": budget,
    }
    items = [
        item(
            "tokens_per_step_for_cap",
            needed,
            "tokens",
            lambda: (
                f"running the cap of {figure_text(cap)} at today's mix (prompt "
                f"{figure_text(prompt)}, output {figure_text(output)} tokens on average) needs "
                f"{figure_text(needed)} tokens a step: {figure_text(cap)} decode tokens and "
                f"{figure_text(needed - cap)} prefill tokens; steps carry {figure_text(now)} "
                f"of a {figure_text(budget)}-token budget"
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
        "token-budget-bound: raising max-num-seqs will not help; " if budget_binds(inputs) else ""
    )
    items.append(
        item(
            "token_budget_for_cap",
            advised,
            "tokens",
            lambda: (
                f"{verdict}--max-num-batched-tokens "
                f"{advised} ({figure_text(needed)} rounded up to a multiple of "
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
            f"; at today's mix it holds {figure_text(sustainable)}: vLLM's figure assumes "
            "every request at max_model_len, and today's requests are shorter or longer than "
            "that"
            if sustainable is not None
            else ""
        )
        return (
            f"vLLM states its KV cache holds {figure_text(stated)} requests of max_model_len"
            + beside
        )

    return [
        item(
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
        item(
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
            (*caveats_of(inputs), "estimated from the output-length histogram"),
        )
    ]
