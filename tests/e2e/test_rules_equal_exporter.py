"""Rules equal the exporter: the same vLLM series, fed to both, give the same signals.

The scripted run of tests/support/rules_equal.py, with a real Prometheus evaluating the
recording rules of grafana/prometheus/.

Tolerance (plus 0.001 for values near zero): gauges and states exactly; rates and
quantiles 7.7% (TOLERANCE below). Where both windows lie inside one phase the two
computations differ only by (1) window alignment: the exporter's window ends at its
last scrape and spans first to last snapshot, while Prometheus' rate() extrapolates its
samples to the window's edges (the same slope for linear counters; the few ms between a
scrape's timestamp and the moment the payload is rendered are under 0.1% of a 15 s
window), and (2) histogram interpolation, PromQL's linear interpolation in both
(exporter/core/histogram.py follows it). Measured: under 0.1% for every rate, 0 for the rest.
A scrape late by seconds makes rate() extrapolate a shorter run of samples (7% off once),
which is the scheduler, not the rule: the comparison skips windows with a gap.
"""

from __future__ import annotations

import pytest
import yaml

from tests.support.monitoring_stack import prometheus
from tests.support.rules_equal import (
    MAX_GAP,
    SCRAPE,
    WINDOW,
    check_phases,
    compare_signals,
    rule_files,
    scrape_jobs,
    scripted_run,
    wait_for_the_run,
)

pytestmark = pytest.mark.slow

# Gauges and states are the same numbers read twice. A rate can differ by a late scrape at
# the window's edge: when the first sample in Prometheus' window lies more than 1.1
# intervals past its start, rate() extrapolates half an interval instead of to the edge.
# The comparison admits gaps up to MAX_GAP, so up to MAX_GAP - SCRAPE / 2 of the window is
# lost (a clean-clone run under load read 4.8%), plus 1% for timestamp jitter.
TOLERANCE = {"gauge": 1e-9, "state": 1e-9, "rate": (MAX_GAP - SCRAPE / 2) / WINDOW + 0.01}


def test_recording_rules_compute_what_the_exporter_computes(tmp_path):
    with (
        scripted_run(tmp_path) as (started, targets, exp),
        prometheus(tmp_path, scrape_jobs(targets, exp), rule_files(targets)) as prom,
    ):
        wait_for_the_run(started)
        differences = compare_signals(prom, started, TOLERANCE)
        check_phases(prom, started, TOLERANCE["rate"])
    print("\nrelative differences, rules vs exporter (max over comparable instants):")
    print(yaml.safe_dump(differences))
