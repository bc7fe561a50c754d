"""Prometheus recording and alerting rules, as plain data built from CONFIG.

Two paths raise the same alerts (exporter/alerts/specs.py):
- `exporter-alerts.yml` reads the exporter's `batchscope_*` series (one exporter);
- `vllm-rules.yml` records the batching signals from vLLM's raw series and
  `vllm-alerts.yml` alerts on them (a fleet, in Prometheus, Thanos or Mimir), with each
  target's cap and budget from `batchscope-rules --config fleet.yaml`.
Every vLLM rule keeps target, model_name and engine: one saturated engine never hides
among idle ones.

The SLO rules record, for the targets held to an objective only (their constants come
with it), the requests within the budget and in all over the exporter's window and the
5-minute window from the latency histogram's buckets, the longer windows as averages of
the 5-minute rates (a rate over three days of every bucket would cost Prometheus that
much), then attainment, burn rates and the error budget left over the compliance period.
"""

from __future__ import annotations

from collections.abc import Mapping

from batchscope.exporter.alerts.fleet_rules import (
    BUDGET_RULE,
    CAP_RULE,
    RECORDED_QUANTILES,
    SLO_BUCKET_RULE,
    SLO_EDGES_RULE,
    SLO_OBJECTIVE_RULE,
    TOKEN_BUDGET_RULE,
    quantile_label,
)
from batchscope.exporter.alerts.specs import (
    BUDGET_SATURATED,
    EXPORTER_DOWN,
    MEMORY_BOUND,
    PREEMPTIONS_CLIMBING,
    SCRAPES_SLOW,
    SLO_BURN_FAST,
    SLO_BURN_SLOW,
    STALLED,
    TARGET_DOWN,
    TOKEN_BUDGET_BOUND,
    AlertSpec,
    AlertWords,
)
from batchscope.exporter.core.catalog import rule_of
from batchscope.exporter.core.limits import DEFERRED_SHARE
from batchscope.exporter.core.reading import OBSERVED_AT_FINISH, OBSERVED_AT_FIRST_TOKEN
from batchscope.exporter.core.slo import DAY_SECONDS, WINDOW_PAIRS, WINDOWS, window_seconds
from batchscope.exporter.engines.vllm import LATENCY_FAMILIES, TOKEN_LATENCY_KINDS
from batchscope.grafana.exporter_series import (
    diagnosed,
    exporter_burning,
    exporter_saturated,
    worst,
)
from batchscope.grafana.promql import instance_by, latest, newest, record, seconds

LEVEL = "target_model_engine"

# Recorded names, level:metric:operations. The dashboards read these too; a signal the
# exporter also computes one for one is named in its catalog entry (`rule_of`).
RUNNING = rule_of("running")
WAITING = rule_of("waiting")
RUNNING_VS_CAP = rule_of("running_vs_cap")
PREEMPTIONS = rule_of("preemptions_per_second")
KV_USAGE = rule_of("kv_cache_usage")
REQUESTS = rule_of("requests_per_second")
GENERATION_TOKENS = rule_of("generation_tokens_per_second")
LATENCY = f"{LEVEL}:vllm_latency_seconds:quantile"
BUDGET_UTILIZATION = f"{LEVEL}:vllm_budget_utilization:ratio"
# 1 where requests were in flight through the window and none finished, by `histogram`:
# the window measures no latency, and the overload has not ended.
UNFINISHED = f"{LEVEL}:vllm_in_flight_unfinished:bool"
ABOVE_THRESHOLD = f"{LEVEL}:vllm_budget_utilization:above_threshold"
BUDGET_SATURATED_RULE = f"{LEVEL}:vllm_budget_saturated:min_over_hold"
OUTPUT_TOKENS_MEAN = f"{LEVEL}:vllm_request_generation_tokens:mean"
MEMORY_BOUND_RULE = f"{LEVEL}:vllm_memory_bound:bool"
STALLED_RULE = f"{LEVEL}:vllm_stalled:bool"
TOKENS_PER_STEP = rule_of("tokens_per_step")
TOKEN_BUDGET_RATIO = f"{LEVEL}:vllm_token_budget:ratio"
TOKEN_BUDGET_BOUND_RULE = f"{LEVEL}:vllm_token_budget_bound:bool"
DEFERRED = rule_of("waiting_deferred")
PREFIX_CACHE_HIT = rule_of("prefix_cache_hit_rate")
SPEC_ACCEPTANCE = rule_of("spec_decode_acceptance_rate")
# 1 for the limit that binds the batch, by `limit` (exporter/core/limits.py's rule), 0
# for each other limit of BINDING_LIMITS (`binding_limit_rules` records them in this order).
BINDING_LIMIT = f"{LEVEL}:vllm_binding_limit:bool"
BINDING_LIMITS = ("kv_cache", "token_budget", "requests", "arrivals", "deferred", "unexplained")
# The SLO, by `histogram` and `window` (a standard window's name; none: the exporter's
# window, `config["window"]`): each budget edge's requests (`edge`), those within the
# budget, all requests, attainment, burn rate; the error budget left.
SLO_BUCKET = f"{LEVEL}:vllm_slo_budget_bucket:rate"
SLO_WITHIN = f"{LEVEL}:vllm_slo_within_budget:rate"
SLO_REQUESTS = f"{LEVEL}:vllm_slo_requests:rate"
SLO_ATTAINMENT = f"{LEVEL}:vllm_slo_attainment:ratio"
SLO_BURN_RATE = f"{LEVEL}:vllm_slo_burn_rate:ratio"
SLO_ERROR_BUDGET = f"{LEVEL}:vllm_slo_error_budget_remaining:ratio"
# The standard window the others are averaged from.
SLO_BASE_WINDOW = "5m"

# Both vLLM generations: V0 counted swapped requests apart, 0.9 renamed the KV gauge.
WAITING_NAMES = ("vllm:num_requests_waiting", "vllm:num_requests_swapped")
KV_NAMES = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")


# The series of every scraped vLLM (a target label names it).
SCRAPED = 'target!=""'

# The signals read straight from vLLM's series, in the order Prometheus evaluates them (a
# rule may read one recorded above it): recorded name, how (`_signal`), and what it reads.
SIGNALS = (
    (RUNNING, "sum of newest", ("vllm:num_requests_running",)),
    # V0's swapped requests wait too: added where the engine has them.
    (WAITING, "sum of newest", WAITING_NAMES),
    (RUNNING_VS_CAP, "over the target's constant", (RUNNING, CAP_RULE)),
    (PREEMPTIONS, "rate", ("vllm:num_preemptions_total",)),
    # The fullest engine's view, as the exporter's total: max, never an average; the 0.9+
    # name where an engine has both.
    (KV_USAGE, "max of newest", KV_NAMES),
    (REQUESTS, "rate", ("vllm:request_success_total",)),
    (GENERATION_TOKENS, "rate", ("vllm:generation_tokens_total",)),
    # vLLM credits a whole prompt to the step its prefill finished in: the mean over the
    # window is what a step carried (docs/metrics.md, "What limits the batch").
    (TOKENS_PER_STEP, "mean", ("vllm:iteration_tokens_total",)),
    (TOKEN_BUDGET_RATIO, "over the target's constant", (TOKENS_PER_STEP, TOKEN_BUDGET_RULE)),
    (OUTPUT_TOKENS_MEAN, "mean", ("vllm:request_generation_tokens",)),
    (
        PREFIX_CACHE_HIT,
        "share",
        ("vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total"),
    ),
    (
        SPEC_ACCEPTANCE,
        "share",
        ("vllm:spec_decode_num_accepted_tokens_total", "vllm:spec_decode_num_draft_tokens_total"),
    ),
)


def _rate(name: str, config: Mapping) -> str:
    return f"sum by ({instance_by(config)}) (rate({name}{{{SCRAPED}}}[{config['window']}]))"


def _signal(how: str, reads: tuple[str, ...], config: Mapping) -> str:
    """One row of SIGNALS as PromQL. Gauges are read as their newest sample within the
    staleness: a scrape of vLLM that failed is a gap, not an absence (rates already read
    over a window). Each name is read apart: last_over_time drops the name, and two names
    would then collide."""
    by = instance_by(config)
    if how == "sum of newest":
        return newest("sum", by, reads, SCRAPED, config, " + ")
    if how == "max of newest":
        return newest("max", by, reads, SCRAPED, config, " or ")
    if how == "rate":
        return _rate(reads[0], config)
    if how == "mean":
        return f"{_rate(reads[0] + '_sum', config)}\n/ {_rate(reads[0] + '_count', config)}"
    if how == "share":  # one counter's increase over another's, none while that is 0
        return f"{_rate(reads[0], config)}\n/ ({_rate(reads[1], config)} > 0)"
    signal, constant = reads
    return f"{signal} / on (target) group_left () {constant}"


def _latency_rules(config: Mapping) -> list[dict]:
    """Each latency histogram's recorded quantiles, per engine."""
    rules = []
    for histogram, family in LATENCY_FAMILIES.items():
        # Per-token latencies only for the targets that judge them (a budget for the
        # kind): the others record no per-token series.
        judged = (
            f'\nand on (target) {BUDGET_RULE}{{histogram="{histogram}"}}'
            if histogram in TOKEN_LATENCY_KINDS
            else ""
        )
        for quantile in RECORDED_QUANTILES:
            rules.append(
                record(
                    LATENCY,
                    f"histogram_quantile({quantile:g}, sum by (le, {instance_by(config)}) "
                    f"(rate({family}_bucket{{{SCRAPED}}}[{config['window']}])))" + judged,
                    {"quantile": quantile_label(quantile), "histogram": histogram},
                )
            )
    return rules


def _progress_stopped(config: Mapping) -> str:
    """Progress stopped (as the exporter's `progress_stopped`): a known generation rate
    under the stall rate, and finished requests, where known, too. Stalled reads it, and
    the carry of a window that finished nothing must not."""
    stall = config["stall_rate"]
    return f"(({GENERATION_TOKENS} < {stall:g}) unless ({REQUESTS} >= {stall:g}))"


def _in_flight(histogram: str, config: Mapping) -> str:
    """Requests the latency of `histogram` has not observed yet, in flight through the
    window (as the exporter's `in_flight_unfinished`): waiting, or running, at every
    evaluation, or, for a latency observed as a request finishes, tokens generated
    (vLLM's gauges can read 0 while its token counter advances)."""
    window = config["window"]
    if histogram in OBSERVED_AT_FIRST_TOKEN:
        return f"min_over_time({WAITING}[{window}:]) > 0"
    gauges = f"min_over_time(({RUNNING} + {WAITING})[{window}:]) > 0"
    if histogram not in OBSERVED_AT_FINISH:
        return gauges
    return f"({gauges})\nor on ({instance_by(config)}) ({GENERATION_TOKENS} > 0)"


def _budget_rules(config: Mapping) -> list[dict]:
    """Budget utilisation, carried through a window that finished nothing with requests in
    flight, and its sustained saturation."""
    by, window = instance_by(config), config["window"]
    threshold, hold = config["saturation_threshold"], seconds(config["saturation_hold_seconds"])
    rules = [
        # Requests in flight, none finished (a rate known to be 0: a vLLM Prometheus cannot
        # read has none), and the engine still generates: a stopped one is stalled, once
        # its saturation is released.
        record(
            UNFINISHED,
            f"clamp({_in_flight(histogram, config)}, 1, 1)\nand on ({by}) "
            f'(sum by ({by}) (rate({family}_bucket{{{SCRAPED}, le="+Inf"}}[{window}])) == 0)\n'
            f"unless on ({by}) {_progress_stopped(config)}\n"
            f'and on (target) {BUDGET_RULE}{{histogram="{histogram}"}}',
            {"histogram": histogram},
        )
        for histogram, family in LATENCY_FAMILIES.items()
    ]
    measured = f"{LATENCY} / on (target, quantile, histogram) group_left () {BUDGET_RULE}"
    return [
        *rules,
        # The measured utilisation; where nothing finished with requests in flight, the one
        # last measured stands, as the exporter's does (exporter/core/evaluate.py,
        # `in_flight_unfinished`); else NaN, as a window without a finished request reads.
        record(
            BUDGET_UTILIZATION,
            f"({measured}) >= 0\n"
            f"or (\n{latest(BUDGET_UTILIZATION, config)} >= 0\n"
            f"and on ({by}, histogram) {UNFINISHED}\n)\n"
            f"or {measured}",
        ),
        record(ABOVE_THRESHOLD, f"{BUDGET_UTILIZATION} >= bool {threshold:g}"),
        # 1 once every evaluation of the hold was at or above the threshold.
        record(BUDGET_SATURATED_RULE, f"min_over_time({ABOVE_THRESHOLD}[{hold}])"),
    ]


def _state_rules(config: Mapping) -> list[dict]:
    """Memory-bound and stalled, 1 or 0 like the exporter's diagnosis, where the first
    matching state wins: sustained saturation comes first."""
    by = instance_by(config)
    near_cap, kv_high = config["near_cap"], config["kv_high"]
    return [
        # A missing KV or preemption series is no evidence.
        record(
            MEMORY_BOUND_RULE,
            _as_bool(
                f"({WAITING} > 0)\nand ({RUNNING_VS_CAP} < {near_cap:g})\n"
                f"and (({KV_USAGE} >= {kv_high:g}) or ({PREEMPTIONS} > 0))\n"
                f"unless on ({by}) ({BUDGET_SATURATED_RULE} == 1)"
            ),
        ),
        # Stalled needs a known generation rate; no cap, KV or finished-request series
        # is not a reason to doubt it (as the exporter's diagnosis).
        record(
            STALLED_RULE,
            _as_bool(
                f"({WAITING} > 0)\nand {_progress_stopped(config)}\n"
                f"unless ({RUNNING_VS_CAP} >= {near_cap:g})\nunless ({KV_USAGE} >= {kv_high:g})\n"
                f"unless ({PREEMPTIONS} > 0)\n"
                f"unless on ({by}) ({BUDGET_SATURATED_RULE} == 1)"
            ),
        ),
    ]


def vllm_recording_rules(config: Mapping) -> dict:
    """The rule file that turns vLLM's raw series into batchscope's signals."""
    from batchscope.grafana.replica_rules import replica_recording_rules  # reads our names

    signals = [record(name, _signal(how, reads, config)) for name, how, reads in SIGNALS]
    return {
        "groups": [
            {
                "name": "batchscope-vllm-signals",
                "rules": [
                    *signals,
                    *_latency_rules(config),
                    *_budget_rules(config),
                    *_state_rules(config),
                    *binding_limit_rules(config),
                    *replica_recording_rules(config),
                ],
            },
            {"name": "batchscope-vllm-slo", "rules": slo_recording_rules(config)},
        ]
    }


def _per_histogram(expr_of: dict[str, str]) -> str:
    """One expression per latency histogram (each labelled `histogram`), as a union."""
    return "\nor ".join(expr_of.values())


def _slo_bucket_rate(config: Mapping, window: str) -> str:
    """The requests per second at or below each budget edge of each SLO target (weighted,
    by `edge`): its histogram's buckets joined on the edges `batchscope-rules` wrote."""
    by = instance_by(config)
    return _per_histogram(
        {
            histogram: f"sum by ({by}, histogram, edge) (\n"
            f'  rate({family}_bucket{{target!=""}}[{window}])\n'
            f"  * on (target, le) group_left (histogram, edge) "
            f'{SLO_BUCKET_RULE}{{histogram="{histogram}"}}\n)'
            for histogram, family in LATENCY_FAMILIES.items()
        }
    )


def _slo_requests(config: Mapping, window: str) -> str:
    """The requests per second of each SLO target's histogram (its count)."""
    by = instance_by(config)
    return _per_histogram(
        {
            histogram: f'sum by ({by}) (rate({family}_count{{target!=""}}[{window}]))\n'
            f"* on (target) group_left (histogram) "
            f'({SLO_EDGES_RULE}{{histogram="{histogram}"}} > bool 0)'
            for histogram, family in LATENCY_FAMILIES.items()
        }
    )


def slo_windows(config: Mapping) -> dict[str, str]:
    """Each standard window's name and its range as the rules write it (scaled by
    `slo_window_scale`)."""
    return {name: seconds(window_seconds(name, config["slo_window_scale"])) for name in WINDOWS}


def slo_recording_rules(config: Mapping) -> list[dict]:
    """Attainment, goodput, burn rates and error budget from vLLM's latency histograms,
    for the targets `batchscope-rules` wrote SLO constants for (exporter/core/slo.py
    computes the same). The exporter's window and the 5-minute window are rates of the
    buckets; 30m, 1h, 6h and 3d are averages of the 5-minute rates over them."""
    by, windows = instance_by(config), slo_windows(config)
    # The exporter's window carries no `window` label: a dashboard selects it as
    # `window=""`, whatever its length.
    measured = ((config["window"], {}), (windows[SLO_BASE_WINDOW], {"window": SLO_BASE_WINDOW}))
    rules = []
    for window, labels in measured:
        rules += [
            record(SLO_BUCKET, _slo_bucket_rate(config, window), labels),
            record(SLO_REQUESTS, _slo_requests(config, window), labels),
        ]
    # Within the budget only where every edge it needs was found: a bucket missing from
    # the engine's layout would leave a part of the interpolation out.
    rules.append(
        record(
            SLO_WITHIN,
            f"sum without (edge) ({SLO_BUCKET})\n"
            f"and on ({by}, histogram, window)\n"
            f"(count without (edge) ({SLO_BUCKET})\n"
            f" == on (target, histogram) group_left () {SLO_EDGES_RULE})",
        )
    )
    base = f'{{window="{SLO_BASE_WINDOW}"}}'
    for name, window in windows.items():
        if name == SLO_BASE_WINDOW:
            continue
        rules += [
            record(series, f"avg_over_time({series}{base}[{window}])", {"window": name})
            for series in (SLO_WITHIN, SLO_REQUESTS)
        ]
    allowed = f"on (target, histogram) group_left () (1 - {SLO_OBJECTIVE_RULE})"
    period = seconds(config["slo_period_days"] * DAY_SECONDS)
    rules += [
        record(SLO_ATTAINMENT, f"{SLO_WITHIN} / {SLO_REQUESTS}"),
        record(
            SLO_BURN_RATE,
            f'(1 - {SLO_ATTAINMENT}{{window!=""}})\n/ {allowed}',
        ),
        record(
            SLO_ERROR_BUDGET,
            f"1 - (\n1 - sum without (window) (sum_over_time({SLO_WITHIN}{base}[{period}]))\n"
            f"/ sum without (window) (sum_over_time({SLO_REQUESTS}{base}[{period}]))\n"
            f") / {allowed}",
        ),
    ]
    return rules


def binding_limit_rules(config: Mapping) -> list[dict]:
    """The token-budget state and the binding limit, as the exporter's rules read them
    (exporter/core/limits.py): requests wait below the cap, KV has room, and steps carry
    near_cap of the token budget; the binding limit by the same first match, over what
    the raw series give (the request cap, the KV cache, the token budget, deferred
    requests, arrivals)."""
    by = instance_by(config)
    scraped = 'target!="", reason="deferred"'
    deferred = newest("sum", by, ("vllm:num_requests_waiting_by_reason",), scraped, config)
    deferred_bind = f"({DEFERRED} >= {DEFERRED_SHARE:g} * {WAITING})"
    near_cap, kv_high = config["near_cap"], config["kv_high"]
    waits, idle = f"({WAITING} > 0)", f"({WAITING} == 0)"
    busy = f"(({RUNNING} + {WAITING}) > 0)"
    kv_short = f"(({KV_USAGE} >= {kv_high:g}) or ({PREEMPTIONS} > 0))"
    at_cap = f"({RUNNING_VS_CAP} >= {near_cap:g})"
    at_budget = f"({TOKEN_BUDGET_RATIO} >= {near_cap:g})"
    preempting = f"({PREEMPTIONS} > 0)"
    on = f"on ({by})"

    binds = {
        "kv_cache": f"{busy}\nand ({preempting} or ({waits} and {kv_short} unless {at_cap}))",
        "token_budget": f"{waits}\nand {at_budget}\nunless {at_cap}\nunless {on} {kv_short}",
        "requests": f"{busy}\nand {at_cap}\nunless {on} {preempting}",
        "arrivals": f"{busy}\nand {idle}\nunless {on} {at_cap}\nunless {on} {preempting}",
        "deferred": f"{waits}\nand {deferred_bind}\nunless {on} {at_cap}\n"
        f"unless {on} {kv_short}\nunless {on} {at_budget}",
        "unexplained": f"{waits}\nunless {on} {at_cap}\nunless {on} {kv_short}\n"
        f"unless {on} {at_budget}\nunless {on} {deferred_bind}",
    }
    return [
        record(DEFERRED, deferred),
        record(
            TOKEN_BUDGET_BOUND_RULE,
            _as_bool(
                f"{waits}\nand {at_budget}\nunless {at_cap}\nunless {on} {kv_short}\n"
                f"unless {on} ({BUDGET_SATURATED_RULE} == 1)"
            ),
        ),
        *(
            record(BINDING_LIMIT, _as_bool(binds[limit]), {"limit": limit})
            for limit in BINDING_LIMITS
        ),
    ]


def _as_bool(condition: str) -> str:
    """1 where the filtering `condition` holds, 0 for every other known instance."""
    return f"clamp(\n{condition},\n1, 1)\nor {WAITING} * 0"


def _templated(spec: AlertSpec, config: Mapping, holds: Mapping[str, float]) -> tuple[str, str]:
    """`spec`'s summary and description as Prometheus templates, stating the configured
    numbers."""
    value = {
        "percent": "{{ $value | humanizePercentage }}",
        "seconds": "{{ $value | humanizeDuration }}",
        "number": "{{ $value | humanize }}",
    }[spec.value_format]
    return AlertWords.from_config(config, holds).texts(spec, "{{ $labels.target }}", value)


def _alert(
    spec: AlertSpec,
    expr: str,
    config: Mapping,
    holds: Mapping[str, float],
    hold_seconds: float | None = None,
    keep_firing_seconds: float = 0.0,
) -> dict:
    """The rule for `spec`: held `hold_seconds` (the spec's hold by default; `holds`
    overrides it by name); once firing, kept firing `keep_firing_seconds` through
    evaluations whose expression came back empty."""
    hold = holds.get(spec.name, spec.hold_seconds if hold_seconds is None else hold_seconds)
    summary, description = _templated(spec, config, holds)
    keep = {"keep_firing_for": seconds(keep_firing_seconds)} if keep_firing_seconds else {}
    return {
        "alert": spec.name,
        "expr": expr,
        "for": seconds(hold),
        **keep,
        "labels": {"severity": spec.severity},
        "annotations": {
            "summary": summary,
            "description": description,
            "runbook_url": f"{config['runbook_base']}#{spec.runbook_anchor}",
        },
    }


def exporter_alerts(config: Mapping, holds: Mapping[str, float] | None = None) -> dict:
    """Alerts on the exporter's series: one alert per target, labelled as the exporter posts,
    from the worst of its series (a saturated model fires even when the total has no latency).

    Every series is read as its newest sample within the staleness, so a scrape of the
    exporter that failed (or a target the exporter could not read, whose signals it leaves
    out) neither ends nor restarts an alert. Saturation is the exporter's own held state,
    `batchscope_budget_saturated`, which has its hold and hysteresis already: it fires as
    the exporter's does, at once. `holds` overrides an alert's `for:` by name (tests use
    short ones).
    """
    holds = holds or {}
    rules = [
        _alert(BUDGET_SATURATED, exporter_saturated(config), config, holds, hold_seconds=0.0),
        _alert(
            MEMORY_BOUND,
            f"{worst('batchscope_waiting_requests', config)}\n"
            f"and on (target) {diagnosed('memory_bound', config)}",
            config,
            holds,
        ),
        _alert(
            TOKEN_BUDGET_BOUND,
            f"{worst('batchscope_waiting_requests', config)}\n"
            f"and on (target) {diagnosed('token_budget_bound', config)}",
            config,
            holds,
        ),
        _alert(
            PREEMPTIONS_CLIMBING,
            f"{worst('batchscope_preemptions_per_second', config)} > 0",
            config,
            holds,
        ),
        _alert(
            STALLED,
            f"{worst('batchscope_generation_tokens_per_second', config)}\n"
            f"and on (target) {diagnosed('stalled', config)}",
            config,
            holds,
        ),
        _alert(TARGET_DOWN, f"{worst('batchscope_target_up', config)} == 0", config, holds),
        # Prometheus writes `up` at every scrape, failed or not: one failure is one 0.
        _alert(
            EXPORTER_DOWN,
            f"up{{{config['exporter_selector']}}} == 0 or "
            f"absent(up{{{config['exporter_selector']}}})",
            config,
            holds,
        ),
        _alert(
            SCRAPES_SLOW,
            f"{worst('batchscope_scrape_duration_seconds', config)} > "
            f"{config['slow_scrape_seconds']:g}",
            config,
            holds,
        ),
        *(
            _alert(spec, exporter_burning(speed, config), config, holds)
            for spec, speed in ((SLO_BURN_FAST, "fast"), (SLO_BURN_SLOW, "slow"))
        ),
    ]
    return {"groups": [{"name": "batchscope-exporter-alerts", "rules": rules}]}


def vllm_burning(speed: str, config: Mapping) -> str:
    """An engine both of whose windows of a pair of `speed` burn over the pair's factor,
    at the long window's burn rate."""
    on = f"on ({instance_by(config)}, histogram)"
    pairs = [
        f'({SLO_BURN_RATE}{{window="{p.long}"}} > {p.factor:g}\n'
        f' and {on} {SLO_BURN_RATE}{{window="{p.short}"}} > {p.factor:g})'
        for p in WINDOW_PAIRS
        if p.speed == speed
    ]
    return "max without (window) (\n" + "\nor ".join(pairs) + "\n)"


def vllm_alerts(config: Mapping, holds: Mapping[str, float] | None = None) -> dict:
    """Alerts on the recorded vLLM signals, per target, model and engine."""
    holds = holds or {}
    threshold = config["saturation_threshold"]
    rules = [
        # After a stall of Prometheus or of vLLM's /metrics for most of the rate window, the
        # window holds one sample: the rates, and with them the utilisation, come back empty
        # for an evaluation, which resolved the alert mid-overload on a starved machine.
        # Once firing, it stays firing through such evaluations for the hold.
        _alert(
            BUDGET_SATURATED,
            f"{BUDGET_UTILIZATION} >= {threshold:g}",
            config,
            holds,
            hold_seconds=config["saturation_hold_seconds"],
            keep_firing_seconds=config["saturation_hold_seconds"],
        ),
        _alert(
            MEMORY_BOUND,
            f"{WAITING}\nand on ({instance_by(config)}) {MEMORY_BOUND_RULE} == 1",
            config,
            holds,
        ),
        _alert(
            TOKEN_BUDGET_BOUND,
            f"{WAITING}\nand on ({instance_by(config)}) {TOKEN_BUDGET_BOUND_RULE} == 1",
            config,
            holds,
        ),
        _alert(PREEMPTIONS_CLIMBING, f"{PREEMPTIONS} > 0", config, holds),
        _alert(
            STALLED,
            f"{GENERATION_TOKENS}\nand on ({instance_by(config)}) {STALLED_RULE} == 1",
            config,
            holds,
        ),
        _alert(TARGET_DOWN, 'max by (target) (up{target!=""}) == 0', config, holds),
        *(
            _alert(spec, vllm_burning(speed, config), config, holds)
            for spec, speed in ((SLO_BURN_FAST, "fast"), (SLO_BURN_SLOW, "slow"))
        ),
    ]
    return {"groups": [{"name": "batchscope-vllm-alerts", "rules": rules}]}
