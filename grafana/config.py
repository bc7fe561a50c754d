"""Every threshold, window and selector the rules and dashboards use, in one place.

Kept as monitoring mixins keep their `_config`: change a value here and run
`python -m batchscope.grafana.build`. The exporter's own defaults are read, not copied, so the
rules and the exporter cannot drift apart.
"""

from __future__ import annotations

from batchscope.exporter.alerts.specs import RUNBOOK_PATH, SLOW_SCRAPE_SECONDS
from batchscope.exporter.config.reserved_labels import SERIES_LABELS
from batchscope.exporter.config.settings import Settings
from batchscope.exporter.core.signals import SignalSettings

_EXPORTER = Settings(targets=())
_SIGNALS = SignalSettings()

CONFIG = {
    # The rate window of the recording rules: the exporter's default window.
    "window": f"{_EXPORTER.window_seconds:g}s",
    "saturation_threshold": _EXPORTER.saturation_threshold,
    # Also how long a series' newest sample stands for it through failed scrapes
    # (`promql.latest`), as the exporter holds its states through a target it cannot read,
    # and how long the vLLM saturation alert keeps firing after that (`keep_firing_for`),
    # as the exporter's saturated episode outlasts it.
    "saturation_hold_seconds": _EXPORTER.hold_seconds,
    "near_cap": _SIGNALS.near_cap,
    "kv_high": _SIGNALS.kv_high,
    # Stalled: generated tokens and finished requests per second under this.
    "stall_rate": _SIGNALS.stall_rate,
    # An exporter scrape slower than this is slow (half the default interval).
    "slow_scrape_seconds": SLOW_SCRAPE_SECONDS,
    # The SLO burn-rate windows' scale (1: the standard 1h/5m, 6h/30m, 3d/6h) and the
    # compliance period the error budget is counted over, as the exporter's settings.
    "slo_window_scale": _EXPORTER.slo_window_scale,
    "slo_period_days": _EXPORTER.slo_period_days,
    # How long a lower replica count must hold before the held count falls to it.
    "scale_down_seconds": _EXPORTER.scale_down_seconds,
    # Labels that tell one vLLM engine from another inside a target.
    "instance_labels": ("target", "model_name", "engine"),
    # The exporter's series labels (every engine adapter's keys); none of them: the total.
    "series_labels": SERIES_LABELS,
    # How Prometheus' job for the exporter is selected (grafana/prometheus/prometheus.yml).
    "exporter_selector": 'job="batchscope-exporter"',
    # While no scrape of the exporter has succeeded for the staleness, the saturation the
    # exporter last reported stands this long: a blind Prometheus has no evidence that it
    # ended (BatchscopeExporterDown says it is blind).
    "exporter_gap_seconds": 600,
    # Where runbook_url points: set it to where your operators read docs/runbook.md.
    "runbook_base": RUNBOOK_PATH,
    "dashboard_refresh": "30s",
    # How often Grafana evaluates its managed alert rules (provisioning/alerting/).
    "grafana_alert_interval": "10s",
    "dashboard_tags": ["batchscope", "batching"],
}
