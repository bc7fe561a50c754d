"""Advice for an in-house batcher ("Batching Requests to a Model Server"; Terrane's
"Dynamic batching: more throughput without wrecking the tail"): the fixed `max_wait` /
`max_batch_size` pair that keeps today's rate in the budget, whether any can, the rate
at which the batcher runs out, and padding worth bucketing away."""

from __future__ import annotations

from batchscope.exporter.core.advice import (
    PADDING_WORTH_FIXING,
    AdviceInputs,
    AdviceItem,
    caveats_of,
    figure_text,
    item,
)
from batchscope.exporter.core.capacity import (
    MAX_DEVICE_LOAD,
    batch_cost,
    budget_headroom,
    fixed_pair,
    rate_limit,
)


def batcher_advice(inputs: AdviceInputs) -> list[AdviceItem]:
    """The fixed pair for today's rate, the budget headroom, and the rate the batcher's
    current max batch size runs out at."""
    rate = inputs.arrival_per_second
    costs = inputs.cost_by_size
    budget = inputs.budget_seconds
    if rate is None or rate <= 0 or not costs or budget is None:
        return []
    caveats = caveats_of(inputs)
    measured = {f"cost_b{size}_seconds": cost for size, cost in costs.items()}
    items = [
        item(
            "arrival_per_second",
            rate,
            "items/s",
            lambda: f"{figure_text(rate)} items/s arrive",
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
            item(
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
            item(
                "rate_limit_per_second",
                limit,
                "items/s",
                lambda: (
                    f"at its max batch of {cap} ({cost * 1000:.2f} ms) this batcher keeps the "
                    "device "
                    f"{MAX_DEVICE_LOAD:.0%} busy at {figure_text(limit)} items/s: today's rate is "
                    f"{rate / limit:.0%} of it"
                ),
                {"max_batch_size": cap, "arrival_per_second": rate, **measured},
                caveats,
            )
        )
    return items + _pair_items(inputs, rate, costs, budget, caveats, measured)


def _pair_items(
    inputs: AdviceInputs,
    rate: float,
    costs: dict[int, float],
    budget: float,
    caveats: tuple[str, ...],
    measured: dict[str, float],
) -> list[AdviceItem]:
    """The fixed (max_wait, max_batch_size) pair that keeps `rate` in the budget, or the
    best there is when none does, in three items that share one sentence."""
    pair = fixed_pair(rate, costs, budget)
    if pair is None:
        return []
    cap = int(inputs.cap) if inputs.cap else None
    pair_inputs = {"arrival_per_second": rate, "budget_seconds": budget, **measured}
    sizes = f"cost measured for batches of {min(costs)}-{max(costs)}"
    pair_caveats = (*caveats, sizes)
    max_wait = inputs.max_wait_seconds

    def text() -> str:
        if not pair.feasible:
            return (
                f"no fixed pair keeps {figure_text(rate)} items/s in the {budget * 1000:.0f} ms "
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
            f"max_batch_size {pair.max_batch_size} at {figure_text(rate)} items/s{today}: batches "
            "of "
            f"{pair.batch_size}, device {pair.load:.0%} busy, worst latency "
            f"{pair.worst_latency_seconds * 1000:.1f} ms of {budget * 1000:.0f} ms; it runs "
            f"out at {figure_text(pair.rate_limit_per_second)} items/s{low}"
        )

    return [
        item("fixed_pair_feasible", int(pair.feasible), "bool", text, pair_inputs, pair_caveats),
        item(
            "advised_max_wait_seconds", pair.max_wait_seconds, "s", text, pair_inputs, pair_caveats
        ),
        item(
            "advised_max_batch_size", pair.max_batch_size, "items", text, pair_inputs, pair_caveats
        ),
    ]


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
        item("padding_waste", waste, "ratio", text, {"padding_waste": waste}, caveats_of(inputs))
    ]
