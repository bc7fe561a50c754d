"""The demo server's generation scheduler driven step by step on a simulated H200's clock,
scraped as the exporter scrapes it: a scenario's truth and what the exporter makes of it,
deterministic and in seconds of CPU.

The scheduler steps on the calling thread (`Scheduler.step_here`); a listener adds up each
step's cost on the sim:h200 curves (decode rows plus prefill tokens), and that sum is the
clock the scrapes are stamped with. Clients run a closed loop: each finished request is
replaced at once by a new one of the same shape.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch
from prometheus_client import CollectorRegistry, generate_latest

from batchscope.demo_server.devices import SIMULATED_CURVES, SIMULATED_PREFILL_MS_PER_TOKEN, Device
from batchscope.demo_server.generation.decoder import TinyDecoder
from batchscope.demo_server.generation.scheduler import (
    Scheduler,
    SchedulerConfig,
    SimulatedClock,
)
from batchscope.demo_server.generation.vllm_metrics import SchedulerCollector, VllmRequestMetrics
from batchscope.demo_server.names import MODEL_NAME
from batchscope.exporter.core.snapshot import Snapshot
from batchscope.exporter.engines import read_series


def sim_h200() -> Device:
    """sim:h200's cost curves on the CPU, unpaced: the clock is `SimulatedClock`'s."""
    return Device(
        "sim:h200",
        torch.device("cpu"),
        curves=SIMULATED_CURVES["h200"],
        prefill_ms_per_token=SIMULATED_PREFILL_MS_PER_TOKEN["h200"],
    )


@dataclass(frozen=True)
class Scenario:
    """Clients in a closed loop sending prompts of `prompt_tokens` for `max_tokens` each."""

    config: SchedulerConfig
    clients: int
    prompt_tokens: int
    max_tokens: int
    seconds: float = 30.0
    scrape_every: float = 1.0


@dataclass(frozen=True)
class Run:
    """Every scrape of the run (stamped with the simulated clock), and at each scrape the
    truth: steps by the limit that bound them, cumulative."""

    snapshots: list[Snapshot]
    truth: list[dict[str, int]]

    def truth_majority(self, since: float) -> str:
        """The limit that bound most steps between the scrape at `since` and the last."""
        first = next(i for i, s in enumerate(self.snapshots) if s.t >= since)
        start, end = self.truth[first], self.truth[-1]
        steps = {limit: n - start.get(limit, 0) for limit, n in end.items()}
        return max(steps, key=steps.__getitem__)


def run(scenario: Scenario, seed: int = 0) -> Run:
    """Drive the scenario and scrape it every `scrape_every` simulated seconds."""
    device = sim_h200()
    registry = CollectorRegistry()
    model = TinyDecoder(seed=seed)
    metrics = VllmRequestMetrics(registry, MODEL_NAME, model.config.max_model_len)
    clock = SimulatedClock(device)
    scheduler = Scheduler(model, device, scenario.config, seed=seed, listeners=[metrics, clock])
    registry.register(SchedulerCollector(scheduler, device, MODEL_NAME))
    rng = random.Random(seed)

    def submit():
        prompt = [rng.randrange(4, 250) for _ in range(scenario.prompt_tokens)]
        return scheduler.submit(prompt, scenario.max_tokens, ignore_eos=True).future

    pending = [submit() for _ in range(scenario.clients)]
    snapshots: list[Snapshot] = []
    truth: list[dict[str, int]] = []
    next_scrape = 0.0
    while clock.seconds < scenario.seconds:
        scheduler.step_here()
        # Scraped between a step and the clients' next requests: what waits is what the
        # step could not admit, not a request sent a moment ago.
        if clock.seconds >= next_scrape:
            text = generate_latest(registry).decode()
            snapshots.append(Snapshot("demo", clock.seconds, True, read_series(text, "vllm")))
            truth.append(scheduler.stats().steps_bound_by)
            next_scrape += scenario.scrape_every
        pending = [f if not f.done() else submit() for f in pending]
    return Run(snapshots, truth)
