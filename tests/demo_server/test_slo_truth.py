"""The exporter's SLO attainment against the truth: every request's latency, measured by
the load generator, on the demo server's embedding batcher.

The batcher (fixed batches of up to 16, fired as soon as the device is free) runs on a
simulated device whose batch of n costs 4 ms + 1 ms x n (16 items a 20 ms batch: 800
items/s at most), in virtual time: the load generator's open-loop arrivals
(`batchscope.demo_server.loadgen.arrivals.open_loop`, Poisson) time each request from its scheduled
arrival to its answer on the same clock the batcher's latency histogram is observed
with. The exporter's path reads the batcher's /metrics text once a second (its
`inhouse` adapter, its window and evaluation), from before the first request to after
the last, so its window holds exactly the requests the generator measured.

Three loads, light to at capacity (200, 500, 800 requests a second, for 3 s each), and
two budgets on the batcher's default latency buckets: 15 ms, a bucket edge, where the
exporter's attainment must be the exact share; and 12 ms, between the edges at 10 and
15 ms, where the exact share must lie within the bounds the exporter states. The table
the figures this test checks are printed (pytest -s).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from batchscope.demo_server.embedding.batcher_settings import BatcherSettings
from batchscope.exporter.core.evaluate import SeriesSignals, TargetIdentity, evaluate_window
from batchscope.exporter.core.signals import SignalSettings
from batchscope.exporter.core.snapshot import Snapshot
from batchscope.exporter.core.window import Window
from batchscope.exporter.engines import read_series
from batchscope.exporter.instrumentation import LATENCY_BUCKETS
from tests.support.batching import VirtualDevice, make_batcher, poisson_load
from tests.support.virtual_time import loop_clock, run_virtual

ON_EDGE, BETWEEN_EDGES = 0.015, 0.012
LOADS = (200, 500, 800)
SECONDS = 3.0
SCRAPE_EVERY = 1.0


def batch_cost(size: int) -> float:
    return 0.004 + 0.001 * size


@dataclass(frozen=True)
class Measured:
    """What one run gave: each request's latency as the load generator measured it, and
    the exporter's evaluation of the batcher over the run."""

    latencies: list[float]
    series: SeriesSignals
    span: float


async def _measure(rate: float, budget: float) -> Measured:
    """Offer `rate` requests a second for SECONDS to a batcher that publishes `budget`,
    scraped by the exporter's path every SCRAPE_EVERY seconds throughout."""
    registry = CollectorRegistry()
    batcher = make_batcher(
        VirtualDevice(batch_cost),
        registry,
        BatcherSettings(
            mode="fixed", max_batch_size=16, max_wait_seconds=0.0, latency_budget_seconds=budget
        ),
        max_queue=100_000,
    )
    # A window longer than the run: the evaluation reads every scrape's increase.
    window = Window(10 * SECONDS, SignalSettings())
    clock = loop_clock()

    def scrape() -> None:
        text = generate_latest(registry).decode()
        window.add(Snapshot("demo", clock(), True, read_series(text, "inhouse")))

    async def scrape_throughout() -> None:
        while True:
            scrape()
            await asyncio.sleep(SCRAPE_EVERY)

    await batcher.start()
    scraper = asyncio.create_task(scrape_throughout())
    await asyncio.sleep(0)  # the first scrape, before any request
    latencies = await poisson_load(batcher, rate, SECONDS, seed=int(rate))
    await batcher.stop()
    scraper.cancel()
    scrape()  # after the last answer
    signals, _ = evaluate_window(TargetIdentity("demo", "x"), window, {}, clock())
    [series] = signals.series
    points = window.series[series_key(series)].points
    return Measured(latencies, series, points[-1][0] - points[0][0])


def series_key(series: SeriesSignals) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(series.labels.items()))


def exact_share(latencies: list[float], budget: float) -> float:
    return sum(1 for x in latencies if x <= budget) / len(latencies)


def test_the_budgets_sit_on_and_between_the_batchers_default_edges() -> None:
    assert ON_EDGE in LATENCY_BUCKETS
    assert BETWEEN_EDGES not in LATENCY_BUCKETS and 0.01 < BETWEEN_EDGES < 0.015


@pytest.mark.parametrize("rate", LOADS)
def test_attainment_is_the_exact_share_on_an_edge_and_bounds_it_between_edges(rate) -> None:
    rows = []
    for budget in (ON_EDGE, BETWEEN_EDGES):
        measured = run_virtual(_measure(rate, budget))
        attained = measured.series.slo_attainment
        exact = exact_share(measured.latencies, budget)
        # Every request the generator measured, and no other, is in the window.
        assert attained.requests == len(measured.latencies) > 0.9 * rate * SECONDS
        share = attained.share
        if budget == ON_EDGE:
            assert attained.exact and share.estimate == share.lower == share.upper
            assert share.estimate == pytest.approx(exact, abs=1e-12)
            within = exact * len(measured.latencies)
            goodput = measured.series.goodput_per_second.estimate
            assert goodput == pytest.approx(within / measured.span, rel=1e-12)
        else:
            assert not attained.exact
            assert share.lower <= exact <= share.upper
            assert share.lower <= share.estimate <= share.upper
            assert share.lower < share.upper  # bounded, not exact: the edges say so
        rows.append((rate, budget, exact, share))
    print()
    for rate, budget, exact, share in rows:
        print(
            f"load {rate}/s  budget {budget * 1000:g} ms  exact {exact:.4f}  exporter "
            f"{share.estimate:.4f} [{share.lower:.4f}, {share.upper:.4f}]"
        )
