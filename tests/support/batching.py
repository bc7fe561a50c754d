"""The embedding batcher in a test: a fake model, a simulated device for virtual time,
open-loop load (`batchscope.demo_server.loadgen.arrivals`), and readers of the batcher's metrics."""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections.abc import Callable

from prometheus_client import CollectorRegistry

from batchscope.demo_server.embedding.batcher import Batcher, run_isolating_failures
from batchscope.demo_server.embedding.batcher_settings import BatcherSettings
from batchscope.demo_server.loadgen.arrivals import open_loop
from batchscope.demo_server.queueing import OverBudget
from batchscope.exporter.instrumentation import BatcherMetrics
from tests.support.virtual_time import loop_clock

NAME = "embeddings"
BATCHER_SETTINGS = BatcherSettings(max_batch_size=8)


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float:
    """A sample's value, 0 when the series does not exist yet."""
    value = registry.get_sample_value(name, {"batcher": NAME, **labels})
    return 0.0 if value is None else value


def outcomes(registry: CollectorRegistry) -> dict[str, float]:
    return {
        outcome: sample(registry, "batchscope_batcher_requests_total", outcome=outcome)
        for outcome in ("ok", "error", "rejected", "cancelled")
    }


def triggers(registry: CollectorRegistry) -> dict[str, float]:
    return {
        trigger: sample(registry, "batchscope_batcher_batches_total", trigger=trigger)
        for trigger in ("full", "timeout", "budget")
    }


class FakeModel:
    """Records each batch it sees, sleeps `cost_s(batch size)`, returns [len(text)]."""

    def __init__(self, cost_s: Callable[[int], float] = lambda size: 0.0) -> None:
        self.cost_s = cost_s
        self.batches: list[list[str]] = []

    def __call__(self, texts: list[str]) -> list[list[float]]:
        self.batches.append(list(texts))
        time.sleep(self.cost_s(len(texts)))
        return [[float(len(text))] for text in texts]


class GatedModel(FakeModel):
    """A fake model that holds every batch until `gate` is set: the next batch queues."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()

    def __call__(self, texts: list[str]) -> list[list[float]]:
        self.batches.append(list(texts))
        self.gate.wait(10)
        return [[float(len(text))] for text in texts]


class VirtualDevice:
    """A batch function run on the event loop that takes `cost_s(batch size)` of the
    loop's time: under `run_virtual`, a device whose every batch costs exactly that.
    Records each batch it sees and returns [len(text)] per text."""

    def __init__(self, cost_s: Callable[[int], float]) -> None:
        self.cost_s = cost_s
        self.batches: list[list[str]] = []

    def model(self, texts: list[str]) -> list[list[float]]:
        self.batches.append(list(texts))
        return [[float(len(text))] for text in texts]

    async def execute(self, texts: list[str]) -> tuple[list[object], float]:
        results = run_isolating_failures(self.model, texts)
        seconds = self.cost_s(len(texts))
        await asyncio.sleep(seconds)
        return results, seconds


def make_batcher(
    run: Callable[[list[str]], list[list[float]]] | VirtualDevice,
    registry: CollectorRegistry,
    settings: BatcherSettings = BATCHER_SETTINGS,
    *,
    max_queue: int = 1000,
    cost_prior: dict[int, float] | None = None,
) -> Batcher:
    """A batcher named NAME over `run`. A `VirtualDevice` runs on the loop's clock: call
    this inside the running loop, under `run_virtual`."""
    metrics = BatcherMetrics(NAME, max_batch_size=settings.max_batch_size, registry=registry)
    if isinstance(run, VirtualDevice):
        return Batcher(
            run.model,
            settings=settings,
            max_queue=max_queue,
            metrics=metrics,
            cost_prior=cost_prior,
            clock=asyncio.get_running_loop().time,
            execute=run.execute,
        )
    return Batcher(
        run, settings=settings, max_queue=max_queue, metrics=metrics, cost_prior=cost_prior
    )


async def until(condition: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = time.perf_counter() + timeout_s
    while not condition():
        assert time.perf_counter() < deadline, "condition not met in time"
        await asyncio.sleep(0.001)


async def poisson_load(
    batcher: Batcher,
    rate_per_s: float,
    duration_s: float,
    seed: int,
    refused: list[OverBudget] | None = None,
) -> list[float]:
    """Open-loop arrivals of one-text requests; each served request's latency in
    seconds on the loop's clock (virtual under `run_virtual`). With `refused`, a request
    refused over budget is kept there, not raised."""
    clock = loop_clock()
    latencies: list[float] = []

    async def one(_: int, scheduled_at: float) -> None:
        try:
            await batcher.submit(["x" * 20])
        except OverBudget as refusal:
            if refused is None:
                raise
            refused.append(refusal)
            return
        latencies.append(clock() - scheduled_at)

    await open_loop(rate_per_s, duration_s, random.Random(seed), one, clock=clock)
    return latencies
