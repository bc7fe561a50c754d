"""What advice is: items, each a number with the inputs it used and how far to trust it.

Pure functions over plain data (no I/O, no clock). `batchscope.exporter.core.reading`
gathers an `AdviceInputs` from a series' window; `batchscope.exporter.core.advise` turns
it into `Advice` from the items of `advice_llm` and `advice_batcher`. The formulas are in
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

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from batchscope.exporter.core.capacity import (
    KvScrape,
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


def figure_text(x: float) -> str:
    # A ratio of sums can land a hair off a whole number (2.9999999999999996): say 3.
    if abs(x) >= 100 or float(round(x, 6)).is_integer():
        return f"{x:,.0f}"
    return f"{x:.1f}" if abs(x) >= 10 else f"{x:.2f}"


def caveats_of(inputs: AdviceInputs) -> tuple[str, ...]:
    if inputs.window_seconds < SHORT_WINDOW_SECONDS:
        return (f"short window ({inputs.window_seconds:.0f} s of {inputs.scrapes} scrapes)",)
    return ()


def confidence_of(caveats: Sequence[str]) -> str:
    return "low" if len(caveats) > 1 else "medium" if caveats else "high"


def item(
    kind: str,
    value: float,
    unit: str,
    words: Callable[[], str],
    inputs: Mapping[str, float | None],
    caveats: Sequence[str] = (),
) -> AdviceItem:
    return AdviceItem(
        kind, float(value), unit, words, dict(inputs), confidence_of(caveats), tuple(caveats)
    )


def budget_binds(inputs: AdviceInputs) -> bool:
    """The token budget binds the batch (the breakdown's binding limit): its advice leads,
    and requests that wait below the cap wait for it, not for memory."""
    return inputs.binding_limit == "token_budget"
