"""The states where the Live page's boxes used to tell two stories, built by
the real exporter from real payload formats in virtual time, and served by its real app.

Each story is a target scraped every INTERVAL s, judged over a WINDOW s window with a
HOLD s saturation hold (`make demo`'s interval and window, the default hold):

- `slow-embeddings`: an in-house batcher whose requests take 150 ms of a 50 ms budget
  with nothing queued and batches of 3 of 32, for 18 s (under the hold): it read
  "underloaded ... nothing to fix" beside a budget used of 299%;
- `flicker-llm`: vLLM at 8 of 8, caught at 0 by the last scrape: its row read running 0
  beside the diagnosis "healthy, running 8 of cap 8";
- `waited-llm`: vLLM that waited at its cap early in the window and has no queue now: the
  advice (the window) said requests waited at the cap under a diagnosis (now) of
  "nothing waits";
- `saturated-llm`: vLLM at five times its budget for 72 s: the banner said the latency
  "has stayed at" the window's utilisation, for a duration to the hundredth of a second,
  without the hold;
- `overload-llm`: vLLM at 8 of 8 with 421 waiting, KV at 67% and preempting: called
  "the KV cache is short of memory" alone, while the request cap binds too.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, generate_latest

from batchscope.exporter.config.settings import Settings, Target
from batchscope.exporter.core.snapshot import Snapshot
from batchscope.exporter.engines import read_series
from batchscope.exporter.instrumentation import BatcherMetrics
from batchscope.exporter.scrape.loop import Exporter
from batchscope.exporter.serve.app import create_app
from batchscope.exporter.serve.history import Histories
from tests.support.scripted_fleet import BackgroundServer
from tests.support.vllm_payload import VllmState, render

INTERVAL = 3.0
WINDOW = 20.0
HOLD = 60.0
START = 1_800_000_000.0
# Scrapes before the last one: 18 s of evidence, under the hold.
SHORT = 7
# 72 s of evidence: past the hold.
LONG = 25

# A payload at each scrape, in turn, from a state the story advances.
Payloads = Callable[[], Iterator[str]]


def _vllm(steps: list[Callable[[VllmState], None]], state: VllmState) -> Iterator[str]:
    for step in steps:
        step(state)
        yield render(state)


def embeddings_batcher(registry: CollectorRegistry, queue_depth: int) -> BatcherMetrics:
    """An in-house embeddings batcher (max batch 32, max wait 5 ms, a 50 ms budget) with
    `queue_depth` requests queued, its metrics in `registry`."""
    batcher = BatcherMetrics(
        "embeddings",
        max_batch_size=32,
        max_wait_seconds=0.005,
        latency_budget_seconds=0.05,
        registry=registry,
    )
    batcher.set_queue_depth(queue_depth)
    return batcher


def slow_embeddings() -> Iterator[str]:
    registry = CollectorRegistry()
    batcher = embeddings_batcher(registry, 0)
    for _ in range(SHORT):
        for _ in range(20):
            batcher.observe_batch(3, "budget", 0.14)
            for _ in range(3):
                batcher.observe_request("ok", queue_wait_seconds=0.01, latency_seconds=0.116)
        yield generate_latest(registry).decode()


def _finishing(latency: float, running: float, waiting: float = 0.0, kv: float = 0.3):
    def step(state: VllmState) -> None:
        state.running, state.waiting, state.kv_usage = running, waiting, kv
        state.finish(2, latency, 100)

    return step


def flicker_llm() -> Iterator[str]:
    steps = [_finishing(0.4, 8)] * (SHORT - 1) + [_finishing(0.4, 0)]
    return _vllm(steps, VllmState())


def waited_llm() -> Iterator[str]:
    busy = [_finishing(0.9, 8, waiting=4, kv=0.5)] * 3
    quiet = [_finishing(0.5, 3, kv=0.2)] * (SHORT - 3)
    return _vllm(busy + quiet, VllmState(kv_cache_tokens=4096))


def saturated_llm() -> Iterator[str]:
    return _vllm([_finishing(9.0, 8, waiting=30, kv=0.6)] * LONG, VllmState())


def overload_llm() -> Iterator[str]:
    def step(state: VllmState) -> None:
        _finishing(1.0, 8, waiting=421, kv=0.67)(state)
        state.preemptions += 1.5

    return _vllm([step] * SHORT, VllmState())


STORIES: dict[str, tuple[Payloads, Target]] = {
    "slow-embeddings": (slow_embeddings, Target("slow-embeddings", "", engine="inhouse")),
    "flicker-llm": (flicker_llm, Target("flicker-llm", "", engine="vllm", cap=8, budget_seconds=2)),
    "waited-llm": (waited_llm, Target("waited-llm", "", engine="vllm", cap=8, budget_seconds=2)),
    "saturated-llm": (
        saturated_llm,
        Target("saturated-llm", "", engine="vllm", cap=8, budget_seconds=2),
    ),
    "overload-llm": (
        overload_llm,
        Target("overload-llm", "", engine="vllm", cap=8, budget_seconds=10),
    ),
}


def story_exporter(
    stories: dict[str, tuple[Payloads, Target]] = STORIES, now: float = START + LONG * INTERVAL
) -> tuple[Exporter, Histories]:
    """An exporter that evaluated every story's scrapes, the last of each at `now`, and
    the histories of those evaluations."""
    targets = tuple(
        Target(t.name, f"http://127.0.0.1:9/{t.name}/metrics", **_configured(t))
        for _, t in stories.values()
    )
    exporter = Exporter(
        Settings(
            targets=targets,
            interval_seconds=INTERVAL,
            window_seconds=WINDOW,
            hold_seconds=HOLD,
        ),
        clock=lambda: now,
    )
    histories = Histories(exporter)
    for name, (payloads, target) in stories.items():
        texts = list(payloads())
        state = exporter.states[name]
        for k, text in enumerate(texts):
            t = now - (len(texts) - 1 - k) * INTERVAL
            series = read_series(text, target.engine)
            exporter.notify(state, exporter.ingest(state, Snapshot(name, t, True, series), t))
    exporter.rounds += 1  # a finished round: the app renders its bodies from these
    return exporter, histories


def _configured(target: Target) -> dict:
    return {
        "engine": target.engine,
        "cap": target.cap,
        "budget_seconds": target.budget_seconds,
    }


def serve_stories(built: tuple[Exporter, Histories] | None = None) -> BackgroundServer:
    """The stories' exporter app (or that of `built`, an exporter and its histories) on a
    local port, started."""
    exporter, histories = built or story_exporter()
    server = BackgroundServer(create_app(exporter, histories=histories))
    server.start()
    return server
