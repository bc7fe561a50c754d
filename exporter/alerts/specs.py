"""The alerts batchscope raises, named and worded once.

Prometheus' rules (grafana/prometheus/, generated from these) and the exporter's own
delivery to Alertmanager (`--alertmanager-url`) raise the same alerts with the same
names, labels and words, so an operator sees one alert whichever path raised it.

The numbers an alert's words state (the saturation threshold and hold, the near-cap and
KV-high levels, how long it held, the SLO burn windows and the compliance period) are
settings: `AlertWords` carries the configured ones into the texts, so an exporter run
with `--saturation-threshold 0.9 --hold-seconds 120` posts "90%" and "2 minutes".
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from batchscope.exporter.config.settings import Settings
from batchscope.exporter.core.signals import SignalSettings
from batchscope.exporter.core.slo import (
    DAY_SECONDS,
    DEFAULT_PERIOD_DAYS,
    WINDOW_PAIRS,
    window_seconds,
)

RUNBOOK_PATH = "docs/runbook.md"
# A scrape slower than half the default interval is slow: the target's /metrics lags,
# as a model server's does when it is overloaded, before scrapes start to time out.
SLOW_SCRAPE_SECONDS = Settings(targets=()).interval_seconds / 2


@dataclass(frozen=True, slots=True)
class AlertSpec:
    """One alert: `summary` and `description` take `{target}`, `{value}` and the
    configured numbers of `AlertWords.fields`: `{threshold}`, `{hold}`, `{near_cap}`,
    `{kv_high}`, `{slow_scrape}`, and for the SLO burn alerts `{fast_pairs}`,
    `{slow_pairs}`, `{period}` and `{fast_exhaustion}`.

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
    "{target}: latency budget saturated for {hold}",
    "Budget utilisation on {target} is {value}: the latency quantile has stayed at or "
    "above {threshold} of the budget for {hold}. The budget is too tight for this traffic or "
    "the server needs capacity; batches are running as close to the latency ceiling as "
    "they can, leaving throughput on the table.",
    "percent",
)
MEMORY_BOUND = AlertSpec(
    "BatchingMemoryBound",
    "warning",
    120.0,
    "{target}: KV cache memory limits the batch",
    "On {target} {value} requests wait while the running batch stays under {near_cap} of "
    "its cap, with the KV cache at {kv_high} or more or preemptions in the window. A higher "
    "--max-num-seqs will not help: KV cache memory decides how many requests fit.",
    "number",
)
TOKEN_BUDGET_BOUND = AlertSpec(
    "BatchingTokenBudgetBound",
    "warning",
    120.0,
    "{target}: the per-step token budget limits the batch",
    "On {target} {value} requests wait while the running batch stays under {near_cap} of "
    "its cap and engine steps carry {near_cap} or more of --max-num-batched-tokens, with room "
    "in the KV cache. A higher --max-num-seqs will not help: a larger "
    "--max-num-batched-tokens will, at the cost of inter-token latency for running decodes, "
    "or serving prefill-heavy traffic (long prompts) separately.",
    "number",
)
PREEMPTIONS_CLIMBING = AlertSpec(
    "BatchingPreemptionsClimbing",
    "warning",
    300.0,
    "{target}: preemptions keep climbing",
    "vllm:num_preemptions_total on {target} has grown for {hold} ({value}/s): the "
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
    "The scrape of {target} has failed for {hold}: the server is down, unreachable or "
    "serving a payload no adapter reads. No batching signal is known for it.",
    "number",
)
EXPORTER_DOWN = AlertSpec(
    "BatchscopeExporterDown",
    "critical",
    60.0,
    "the batchscope exporter does not answer",
    "Prometheus has not scraped the batchscope exporter for {hold}: every "
    "batchscope_* signal and the alerts built on them are blind.",
    "number",
)
SCRAPES_SLOW = AlertSpec(
    "BatchscopeScrapesSlow",
    "warning",
    300.0,
    "{target}: scrapes take {value}",
    "The exporter's scrape of {target} has taken over {slow_scrape} (half the default "
    "interval) for {hold}: the target is slow to render /metrics or the exporter is overloaded, "
    "and "
    "scrapes near the timeout start to fail.",
    "seconds",
)

# The two burn alerts hold nothing: the long window of each pair is their hold, the
# short one ends them as soon as the burn stops (the SRE workbook's multiwindow alerts).
SLO_BURN_FAST = AlertSpec(
    "BatchingSLOBurnFast",
    "critical",
    0.0,
    "{target}: the latency promise is being broken, its error budget burns fast",
    "Requests on {target} miss the latency budget {value} times as fast as the SLO "
    "objective allows, over {fast_pairs} (both windows of a pair). This is the promise to "
    "users breaking now, not a batcher running at its ceiling: at the first pair's rate "
    "the error budget for {period} is gone in {fast_exhaustion}. Page.",
    "number",
)
SLO_BURN_SLOW = AlertSpec(
    "BatchingSLOBurnSlow",
    "warning",
    0.0,
    "{target}: the latency SLO's error budget burns faster than it lasts",
    "Requests on {target} miss the latency budget {value} times as fast as the SLO "
    "objective allows, over {slow_pairs} (both windows): at this pace the error budget for "
    "{period} runs out before the period ends. No page: a ticket to find why.",
    "number",
)

ALERTS = (
    BUDGET_SATURATED,
    MEMORY_BOUND,
    TOKEN_BUDGET_BOUND,
    PREEMPTIONS_CLIMBING,
    STALLED,
    TARGET_DOWN,
    EXPORTER_DOWN,
    SCRAPES_SLOW,
    SLO_BURN_FAST,
    SLO_BURN_SLOW,
)


_SIGNAL_DEFAULTS = SignalSettings()


def duration_words(seconds: float) -> str:
    """A hold as an alert's text says it: "a minute", "5 minutes", "an hour", "3 days",
    "90 s"."""
    if seconds >= 86400 and seconds % 86400 == 0:
        days = int(seconds // 86400)
        return "a day" if days == 1 else f"{days} days"
    if seconds >= 3600 and seconds % 3600 == 0:
        hours = int(seconds // 3600)
        return "an hour" if hours == 1 else f"{hours} hours"
    if seconds >= 60 and seconds % 60 == 0:
        minutes = int(seconds // 60)
        return "a minute" if minutes == 1 else f"{minutes} minutes"
    return f"{seconds:g} s"


def pairs_words(speed: str, scale: float) -> str:
    """The window pairs of a speed as an alert says them: "an hour and 5 minutes at 14.4x,
    or 6 hours and 30 minutes at 6x" (windows scaled by `scale`)."""
    return ", or ".join(
        f"{duration_words(window_seconds(p.long, scale))} and "
        f"{duration_words(window_seconds(p.short, scale))} at {p.factor:g}x"
        for p in WINDOW_PAIRS
        if p.speed == speed
    )


def percent_words(ratio: float) -> str:
    """0.95 -> "95%", 0.925 -> "92.5%"."""
    return f"{ratio * 100:.4g}%"


@dataclass(frozen=True, slots=True)
class AlertWords:
    """The configured numbers the alerts' texts state: from the exporter's settings on its
    own path (`from_settings`), from the rules' config in the generated rule files.
    `holds` overrides an alert's hold by name, as it overrides the hold itself."""

    saturation_threshold: float = _SIGNAL_DEFAULTS.saturation_threshold
    saturation_hold_seconds: float = _SIGNAL_DEFAULTS.hold_seconds
    near_cap: float = _SIGNAL_DEFAULTS.near_cap
    kv_high: float = _SIGNAL_DEFAULTS.kv_high
    slow_scrape_seconds: float = SLOW_SCRAPE_SECONDS
    holds: Mapping[str, float] = field(default_factory=dict)
    slo_window_scale: float = 1.0
    slo_period_days: float = DEFAULT_PERIOD_DAYS

    @classmethod
    def from_settings(
        cls, settings: Settings, holds: Mapping[str, float] | None = None
    ) -> AlertWords:
        return cls(
            settings.saturation_threshold,
            settings.hold_seconds,
            holds=holds or {},
            slo_window_scale=settings.slo_window_scale,
            slo_period_days=settings.slo_period_days,
        )

    @classmethod
    def from_config(cls, config: Mapping, holds: Mapping[str, float] | None = None) -> AlertWords:
        """From the rules' config (grafana/config.py's keys)."""
        return cls(
            config["saturation_threshold"],
            config["saturation_hold_seconds"],
            config["near_cap"],
            config["kv_high"],
            config["slow_scrape_seconds"],
            holds or {},
            config["slo_window_scale"],
            config["slo_period_days"],
        )

    def hold_seconds(self, spec: AlertSpec) -> float:
        """How long `spec`'s condition has held when it fires: saturation's hold for the
        saturation alert, the spec's own (or `holds`') for the others."""
        default = self.saturation_hold_seconds if spec is BUDGET_SATURATED else spec.hold_seconds
        return self.holds.get(spec.name, default)

    def fields(self, spec: AlertSpec) -> dict[str, str]:
        period = self.slo_period_days * DAY_SECONDS
        return {
            "threshold": percent_words(self.saturation_threshold),
            "hold": duration_words(self.hold_seconds(spec)),
            "near_cap": percent_words(self.near_cap),
            "kv_high": percent_words(self.kv_high),
            "slow_scrape": f"{self.slow_scrape_seconds:g} s",
            "fast_pairs": pairs_words("fast", self.slo_window_scale),
            "slow_pairs": pairs_words("slow", self.slo_window_scale),
            "period": duration_words(period),
            "fast_exhaustion": duration_words(period / WINDOW_PAIRS[0].factor),
        }

    def texts(self, spec: AlertSpec, target: str, value: str) -> tuple[str, str]:
        """`spec`'s summary and description for `target` reading `value` (already worded)."""
        words = {"target": target, "value": value, **self.fields(spec)}
        return spec.summary.format(**words), spec.description.format(**words)
