"""Every piece of advice a window supports, the one that leads, or why there is none."""

from __future__ import annotations

from batchscope.exporter.core.advice import MIN_SCRAPES, Advice, AdviceInputs, budget_binds
from batchscope.exporter.core.advice_batcher import batcher_advice, padding_advice
from batchscope.exporter.core.advice_llm import (
    kv_advice,
    stated_concurrency_advice,
    static_advice,
    token_budget_advice,
)


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
                *(("token_budget_for_cap",) if budget_binds(inputs) else ()),
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
