"""One step of a load test: one offered rate, under one setting, against a server or a fleet.

`run_rate` offers the load open loop (`arrivals.open_loop`): a request is sent at its
scheduled time whether or not earlier ones have answered, to the base URL the fleet's
policy picks (`fleet`), and its latency is measured from that scheduled time. Completions
stream, so the first chunk gives the time to first token and the usage chunk the output
tokens. The requests in flight are sampled for the over-saturation rule
(`oversaturation`), and the server's batching signals are read over the step when asked.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import random
import time
from typing import Any, Protocol

import aiohttp

from batchscope.demo_server.loadgen.arrivals import OpenLoopRun, open_loop
from batchscope.demo_server.loadgen.batching import BatchingReading, step_batching
from batchscope.demo_server.loadgen.fleet import Balancer, Fleet
from batchscope.demo_server.loadgen.oversaturation import QueueSample, over_saturation
from batchscope.demo_server.loadgen.report import (
    PlainProgress,
    ReplicaResult,
    RunResult,
    percentile,
)
from batchscope.demo_server.loadgen.workload import LoadSpec, make_payload

ENDPOINTS = {"embeddings": "/v1/embeddings", "completions": "/v1/completions"}
# Seconds between samples of the requests in flight (the over-saturation rule's).
QUEUE_SAMPLE_S = 1.0


class StepSignals(Protocol):
    """Where a step's batching signals come from: --watch (`watch.WatchedServer`) or
    --exporter (`exporter_api.ExporterSignals`)."""

    # The flag that chose it, recorded in the `batching` object.
    source: str

    async def read_step(
        self, window_seconds: float, stop: asyncio.Event
    ) -> list[BatchingReading | None]:
        """The server's readings from now until `stop` is set, oldest first (None: one
        that read nothing); `window_seconds`: how long the step measures."""
        ...


class _Step:
    """One running step: the request bodies, the requests in flight, the fleet's counts and
    the result they add up to."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        fleet: Fleet,
        spec: LoadSpec,
        rate_per_s: float,
        run_index: int,
        setting: dict[str, float | int] | None,
        progress: PlainProgress | None,
    ) -> None:
        self.session = session
        self.spec = spec
        self.progress = progress
        # The arrival times are drawn from it first, then the bodies (`payload`).
        self.rng = random.Random(spec.seed + run_index)
        self.lengths = itertools.cycle(spec.output_lengths or [None])
        self.payloads: list[dict[str, Any]] = []
        self.targets = [url.rstrip("/") + ENDPOINTS[spec.endpoint] for url in fleet.urls]
        self.balancer = Balancer(fleet)
        self.result = RunResult(
            setting or {},
            rate_per_s,
            spec.duration_s,
            arrivals=spec.arrivals,
            endpoint=spec.endpoint,
            replicas=[ReplicaResult(url) for url in fleet.urls],
        )
        # Sent and not yet answered: index -> scheduled time.
        self.in_flight: dict[int, float] = {}

    def payload(self, index: int) -> dict[str, Any]:
        """The body of arrival `index`. Drawn in arrival order after the arrival times,
        dropped arrivals' too, so the bodies sent do not depend on what was dropped."""
        while len(self.payloads) <= index:
            self.payloads.append(
                make_payload(
                    self.spec.endpoint,
                    self.rng,
                    self.spec.max_tokens,
                    self.spec.model,
                    length=next(self.lengths),
                    stream=True,
                    inputs=self.spec.inputs_per_request,
                )
            )
        return self.payloads[index]

    async def send(self, index: int, scheduled_at: float) -> None:
        """Send arrival `index` to the URL the policy picks and count how it answered."""
        payload = self.payload(index)
        where = self.balancer.take()
        replica = self.result.replicas[where]
        replica.sent += 1
        replica.max_outstanding = max(replica.max_outstanding, self.balancer.outstanding[where])
        self.in_flight[index] = scheduled_at
        try:
            status: int | str = await self._post(self.targets[where], payload, scheduled_at)
        except TimeoutError:
            status = "timeout"
        except aiohttp.ClientError:
            status = "connection"
        except asyncio.CancelledError:  # a stopped step: the run counts it from the stop
            replica.fail("cancelled")
            raise
        finally:
            del self.in_flight[index]
            self.balancer.release(where)
            if self.progress is not None:
                self.progress.request_done()
        self.result.answered(replica, status, (time.perf_counter() - scheduled_at) * 1000.0)

    async def _post(self, target: str, payload: dict[str, Any], scheduled_at: float) -> int:
        """POST the body and read the whole answer; its HTTP status."""
        async with self.session.post(target, json=payload) as response:
            if response.status == 200 and payload.get("stream"):
                await _read_stream(response, scheduled_at, self.result)
            else:
                await response.read()
            return response.status

    def finish(self, offered: OpenLoopRun[None]) -> RunResult:
        """The result once every arrival has been offered and every request answered."""
        result = self.result
        for _ in range(offered.cancelled):
            result.fail("cancelled")
        result.stopped_at_s = offered.stopped_at_s
        result.sent = offered.sent
        result.dropped = offered.dropped
        result.send_lags_ms = [lag * 1000.0 for lag in offered.send_lags_s]
        result.elapsed_s = offered.elapsed_s
        result.throughput_per_s = result.ok / result.measured_seconds()
        result.p50_ms = percentile(result.latencies_ms, 50)
        result.p99_ms = percentile(result.latencies_ms, 99)
        return result


async def run_rate(
    session: aiohttp.ClientSession,
    target: str | Fleet,
    spec: LoadSpec,
    rate_per_s: float,
    *,
    run_index: int = 0,
    setting: dict[str, float | int] | None = None,
    progress: PlainProgress | None = None,
    signals: StepSignals | None = None,
) -> RunResult:
    """Offer `spec`'s load at `rate_per_s` for `spec.duration_s` to `target` (a base URL,
    or a fleet and its policy), its random draws from `spec.seed + run_index`, and
    measure what came back.

    An arrival that finds `spec.concurrency_limit` requests in flight is not sent and is
    counted `dropped`; the run ends when every sent request has answered or timed out.
    Every QUEUE_SAMPLE_S after the warm-up the requests in flight and the oldest one's
    wait are sampled; a step the over-saturation rule flags ends early (with
    `spec.stop_over_saturated`), its requests in flight cancelled. `signals`: read over
    the step after its warm-up, they give the step's `batching` object.
    """
    step = _Step(session, Fleet.of(target), spec, rate_per_s, run_index, setting, progress)
    stop = asyncio.Event()
    ended = asyncio.Event()
    sampler = asyncio.create_task(
        _sample_queue(step.in_flight, spec, rate_per_s, step.result, stop)
    )
    watcher = asyncio.create_task(_read_step(signals, spec, ended)) if signals else None
    try:
        offered = await open_loop(
            rate_per_s,
            spec.duration_s,
            step.rng,
            step.send,
            process=spec.arrivals,
            burstiness=spec.burstiness,
            max_in_flight=spec.concurrency_limit,
            stop=stop,
        )
    finally:
        sampler.cancel()
        ended.set()
    if signals is not None and watcher is not None:
        step.result.batching = step_batching(await watcher, signals.source)
    return step.finish(offered)


async def _sample_queue(
    in_flight: dict[int, float],
    spec: LoadSpec,
    rate_per_s: float,
    result: RunResult,
    stop: asyncio.Event,
) -> None:
    """Sample the requests in flight every QUEUE_SAMPLE_S after the warm-up; mark the
    step over-saturated (and set `stop`, with `spec.stop_over_saturated`) when the rule
    says so. Runs until cancelled."""
    started = time.perf_counter()
    samples: list[QueueSample] = []
    await asyncio.sleep(spec.warmup_s)
    while True:
        await asyncio.sleep(QUEUE_SAMPLE_S)
        now = time.perf_counter()
        oldest = now - min(in_flight.values()) if in_flight else 0.0
        samples.append(QueueSample(now - started, len(in_flight), oldest))
        verdict = over_saturation(samples, rate_per_s)
        if verdict.over:
            result.over_saturated = True
            result.saturation_reason = verdict.reason
            if spec.stop_over_saturated:
                stop.set()
            return


async def _read_step(
    signals: StepSignals, spec: LoadSpec, ended: asyncio.Event
) -> list[BatchingReading | None]:
    """The server's readings from the end of the warm-up to `ended`."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(ended.wait(), spec.warmup_s)
    if ended.is_set():
        return []
    return await signals.read_step(spec.duration_s - spec.warmup_s, ended)


async def _read_stream(
    response: aiohttp.ClientResponse, scheduled_at: float, result: RunResult
) -> None:
    """Read an OpenAI completion stream: the first text chunk's time is the TTFT; the
    usage chunk's completion_tokens (else the text chunks counted) the output tokens."""
    chunks = 0
    usage_tokens = None
    async for raw in response.content:
        line = raw.decode("utf-8", errors="replace").strip()
        if not line.startswith("data:") or line == "data: [DONE]":
            continue
        body = json.loads(line[5:])
        if body.get("usage") and body["usage"].get("completion_tokens") is not None:
            usage_tokens = body["usage"]["completion_tokens"]
        if any(choice.get("text") for choice in body.get("choices") or ()):
            if chunks == 0:
                result.ttfts_ms.append((time.perf_counter() - scheduled_at) * 1000.0)
            chunks += 1
    result.output_tokens += usage_tokens if usage_tokens is not None else chunks
