"""The alerts batchscope raises, named and worded once.

Prometheus' rules (grafana/prometheus/, generated from these) and the exporter's own
delivery to Alertmanager (`--alertmanager-url`) raise the same alerts with the same
names, labels and words, so an operator sees one alert whichever path raised it.
"""

from __future__ import annotations

from dataclasses import dataclass

from exporter.config import Settings

RUNBOOK_PATH = "docs/runbook.md"
# A scrape slower than half the default interval is slow: the target's /metrics lags,
# as a model server's does when it is overloaded, before scrapes start to time out.
SLOW_SCRAPE_SECONDS = Settings(targets=()).interval_seconds / 2


@dataclass(frozen=True, slots=True)
class AlertSpec:
    """One alert: `summary` and `description` take `{target}` and `{value}`.

    `value_format` says how `{value}` reads: percent, number or seconds. `hold_seconds`
    is the `for:` of the Prometheus rule and the exporter's own hold before it posts.
    """

    name: str
    severity: str
    hold_seconds: float
    summary: str
    description: str
    value_format: str = "number"

    @property
    def runbook_anchor(self) -> str:
        """The heading anchor of this alert in docs/runbook.md (GitHub's slug of the name)."""
        return self.name.lower()


BUDGET_SATURATED = AlertSpec(
    "BatchingBudgetSaturated",
    "warning",
    # The exporter's own hold: Prometheus' `for:` and the exporter's saturation agree.
    Settings(targets=()).hold_seconds,
    "{target}: latency budget saturated for a minute",
    "Budget utilisation on {target} is {value}: the latency quantile has stayed at or "
    "above 95% of the budget for a minute. The budget is too tight for this traffic or "
    "the server needs capacity; batches are running as close to the latency ceiling as "
    "they can, leaving throughput on the table.",
    "percent",
)
MEMORY_BOUND = AlertSpec(
    "BatchingMemoryBound",
    "warning",
    120.0,
    "{target}: KV cache memory limits the batch",
    "On {target} {value} requests wait while the running batch stays under 90% of its "
    "cap, with the KV cache at 90% or more or preemptions in the window. A higher "
    "--max-num-seqs will not help: KV cache memory decides how many requests fit.",
    "number",
)
PREEMPTIONS_CLIMBING = AlertSpec(
    "BatchingPreemptionsClimbing",
    "warning",
    300.0,
    "{target}: preemptions keep climbing",
    "vllm:num_preemptions_total on {target} has grown for five minutes ({value}/s): the "
    "KV cache is short of memory and running requests are pushed back to the queue.",
    "number",
)
STALLED = AlertSpec(
    "BatchingStalled",
    "critical",
    60.0,
    "{target}: requests wait but generation has stopped",
    "On {target} requests wait, the running batch is under its cap and the KV cache has "
    "room, yet generation has (nearly) stopped ({value} tokens/s): the scheduler admits "
    "nothing while the server reports healthy.",
    "number",
)
TARGET_DOWN = AlertSpec(
    "BatchscopeTargetDown",
    "critical",
    60.0,
    "{target}: /metrics does not answer",
    "The scrape of {target} has failed for a minute: the server is down, unreachable or "
    "serving a payload no adapter reads. No batching signal is known for it.",
    "number",
)
EXPORTER_DOWN = AlertSpec(
    "BatchscopeExporterDown",
    "critical",
    60.0,
    "the batchscope exporter does not answer",
    "Prometheus has not scraped the batchscope exporter for a minute: every "
    "batchscope_* signal and the alerts built on them are blind.",
    "number",
)
SCRAPES_SLOW = AlertSpec(
    "BatchscopeScrapesSlow",
    "warning",
    300.0,
    "{target}: scrapes take {value}",
    "The exporter's scrape of {target} has taken over half the default 5 s interval for five "
    "minutes: the target is slow to render /metrics or the exporter is overloaded, and "
    "scrapes near the timeout start to fail.",
    "seconds",
)

ALERTS = (
    BUDGET_SATURATED,
    MEMORY_BOUND,
    PREEMPTIONS_CLIMBING,
    STALLED,
    TARGET_DOWN,
    EXPORTER_DOWN,
    SCRAPES_SLOW,
)
