"""A fleet for looking at the Live page's first screen: the stories of live_stories.py
and three more, each in a state a user should recognise at a glance, evaluated by the
real exporter in virtual time; and that exporter's JSON API in process, for AppTest.

- `steady-llm`: vLLM at 8 of 8 with 2 waiting, 1.2 s of a 2 s budget, its prefix cache
  and speculative decoder in use: healthy at its cap;
- `memory-llm`: vLLM full at 8 of 8 until its KV cache fills, then 3 of 8 running with 6
  waiting, the cache 97% full and preempting: memory-bound;
- `costly-embeddings`: a batcher whose batches of 8 cost 20 times a batch of 1 (a CPU)
  while its requests take 456 ms of a 50 ms budget for 72 s: saturated, with a
  throughput gain below 1 and a device-time model far under the measured latency.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest

from batchscope.dashboard import client
from batchscope.exporter.config.settings import Target
from batchscope.exporter.scrape.loop import Exporter
from batchscope.exporter.serve import api_json as api
from batchscope.exporter.serve.history import Histories
from batchscope.exporter.serve.replica_plan import ReplicaPlanner
from tests.support.live_stories import (
    LONG,
    STORIES,
    Payloads,
    _finishing,
    _vllm,
    embeddings_batcher,
    serve_stories,
    story_exporter,
)
from tests.support.network import free_port, wait_http
from tests.support.paths import REPO
from tests.support.vllm_payload import VllmState


def steady_llm() -> Iterator[str]:
    def step(state: VllmState) -> None:
        _finishing(1.2, 8, waiting=2, kv=0.6)(state)
        state.prefix_queries = (state.prefix_queries or 0.0) + 1000
        state.prefix_hits += 620
        state.draft_tokens = (state.draft_tokens or 0.0) + 400
        state.accepted_tokens += 280

    return _vllm([step] * LONG, VllmState(kv_cache_tokens=8192))


def memory_llm() -> Iterator[str]:
    filling = [_finishing(1.5, 8, kv=0.6 + 0.03 * k) for k in range(10)]

    def short(state: VllmState) -> None:
        _finishing(1.5, 3, waiting=6, kv=0.97)(state)
        state.preemptions += 1

    return _vllm([*filling, *[short] * (LONG - 10)], VllmState(kv_cache_tokens=2048))


def costly_embeddings() -> Iterator[str]:
    registry = CollectorRegistry()
    batcher = embeddings_batcher(registry, 12)
    for _ in range(LONG):
        for _ in range(10):
            batcher.observe_batch(1, "timeout", 0.002)
        for _ in range(20):
            batcher.observe_batch(8, "full", 0.04)
        for _ in range(170):
            batcher.observe_request("ok", queue_wait_seconds=0.4, latency_seconds=0.456)
        yield generate_latest(registry).decode()


LLM = {"engine": "vllm", "cap": 8, "budget_seconds": 2}
SCREENS: dict[str, tuple[Payloads, Target]] = {
    **STORIES,
    "steady-llm": (steady_llm, Target("steady-llm", "", **LLM)),
    "memory-llm": (memory_llm, Target("memory-llm", "", **LLM)),
    "costly-embeddings": (costly_embeddings, Target("costly-embeddings", "", engine="inhouse")),
}


def screens_exporter(now: float) -> tuple[Exporter, Histories]:
    """An exporter that evaluated every screen's scrapes, the last of each at `now`, and
    the histories of those evaluations."""
    return story_exporter(SCREENS, now)


def _json(body: dict) -> dict:
    """A body as the client gets it: encoded by the app's encoder and read back."""
    return json.loads(api.encode(body))


def in_process_api(built: tuple[Exporter, Histories]) -> dict[str, Callable]:
    """`batchscope.dashboard.client`'s readers answered in process from `built` (an
    exporter and its histories): the bodies the app serves, without a socket; name ->
    replacement, for monkeypatch."""
    exporter, histories = built
    evaluation = api.evaluation_json(exporter.settings)

    def fleet_summary(_base: str) -> dict:
        return _json(api.summary_response(exporter.clock(), exporter.current(), evaluation))

    def target_signals(_base: str, target: str) -> dict | None:
        latest = exporter.latest(target)
        if latest is None:
            return None
        return _json(api.signals_response(exporter.clock(), latest, evaluation))["targets"][0]

    def history(_base: str, target: str | None = None) -> dict:
        assert target is not None, "the Live page reads one target's history"
        return _json(api.history_response(target, histories.rows(target) or []))

    def replicas(_base: str) -> dict:
        # One round's count, as the app's planner steps it after a round.
        planner = ReplicaPlanner(exporter.settings)
        models = planner.step(exporter.current(), exporter.targets(), exporter.clock())
        return _json(api.replicas_response(exporter.clock(), models, planner.settings))

    return {
        "fleet_summary": fleet_summary,
        "target_signals": target_signals,
        "history": history,
        "replicas": replicas,
    }


def patch_client(monkeypatch, built: tuple[Exporter, Histories]) -> None:
    """Point the dashboard's client at `built` (an exporter and its histories), in
    process."""
    for name, reader in in_process_api(built).items():
        monkeypatch.setattr(client, name, reader)


@contextmanager
def serving_screens(logs: Path) -> Iterator[str]:
    """The screens' exporter (evaluated now) on a local port and the dashboard reading
    it (a `batchscope-dashboard` process); the dashboard's URL."""
    server = serve_stories(screens_exporter(time.time()))
    port = free_port()
    log = logs / "dashboard.log"
    dashboard = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "batchscope.dashboard.cli",
            "--exporter",
            server.url,
            "--port",
            str(port),
        ],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(f"{url}/_stcore/health", 60, log, processes=[dashboard])
        yield url
    finally:
        dashboard.terminate()
        dashboard.wait(timeout=20)
        server.stop()


def select_target(page, name: str) -> None:
    """Pick `name` in the Live page's target selector and wait for its panel."""
    page.get_by_test_id("stSelectbox").filter(has_text="matching").click()
    page.get_by_role("option", name=name, exact=True).click()
    page.get_by_text(f"Target {name}", exact=True).wait_for(timeout=60_000)
