"""Open-loop load generator for the demo server (or any OpenAI-style endpoint).

`batchscope-loadgen --rates 10,50,100 --duration 10` sends Poisson arrivals at each
rate for `duration` seconds and reports, per rate, the achieved throughput, p50 and
p99 latency, errors and 429s. `--set max_wait_ms=5,10,20` repeats the sweep for each
value, applied through the server's `POST /admin/config`, so no restart is needed.

Open loop: a request is sent at its scheduled time whether or not earlier ones have
answered, and its latency is measured from that scheduled time, so a slow server
shows up as latency instead of silently lowering the offered load. Only the given URL
is contacted; every run is bounded in requests (`MAX_REQUESTS_PER_RUN`) and in time
(`duration` plus the request timeout).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import math
import random
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, TextIO

import aiohttp

ENDPOINTS = {"embeddings": "/v1/embeddings", "completions": "/v1/completions"}
ADMIN_PATH = "/admin/config"
MAX_REQUESTS_PER_RUN = 100_000
WORDS = (
    "batch", "queue", "latency", "budget", "token", "model", "server", "request", "wait",
    "throughput", "tail", "median", "cache", "slot", "step", "encoder", "decoder", "vector",
)  # fmt: skip


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0..100) of `values`, interpolating linearly between the
    two nearest ranks (as numpy's default does); None when there are no values."""
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"q must be within 0..100, got {q}")
    if not values:
        return None
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100.0
    lower = math.floor(position)
    upper = min(lower + 1, len(ordered) - 1)
    return ordered[lower] + (position - lower) * (ordered[upper] - ordered[lower])


def arrival_times(rate_per_s: float, duration_s: float, rng: random.Random) -> list[float]:
    """Poisson arrival offsets (seconds from the start) within `duration_s`, at most
    MAX_REQUESTS_PER_RUN of them."""
    if rate_per_s <= 0:
        raise ValueError(f"rate must be above 0, got {rate_per_s}")
    times: list[float] = []
    at = rng.expovariate(rate_per_s)
    while at < duration_s and len(times) < MAX_REQUESTS_PER_RUN:
        times.append(at)
        at += rng.expovariate(rate_per_s)
    return times


def parse_setting(text: str) -> tuple[str, list[float | int]]:
    """`name=v1,v2,...` as (name, values); integers stay integers."""
    name, sep, values = text.partition("=")
    if not sep or not name or not values:
        raise ValueError(f"a setting looks like max_wait_ms=5,10,20, got {text!r}")
    return name.strip(), [_number(v) for v in values.split(",")]


def _number(text: str) -> float | int:
    value = float(text)
    return int(value) if value.is_integer() and "." not in text else value


@dataclass
class RunResult:
    """What one rate (under one setting) gave: counts, throughput, latency in ms."""

    setting: dict[str, float | int]
    rate_per_s: float
    duration_s: float
    sent: int = 0
    ok: int = 0
    errors: int = 0
    rejected_429: int = 0
    dropped: int = 0
    elapsed_s: float = 0.0
    throughput_per_s: float = 0.0
    p50_ms: float | None = None
    p99_ms: float | None = None
    latencies_ms: list[float] = field(default_factory=list, repr=False)

    def summary(self) -> dict[str, Any]:
        """The result as plain JSON-ready data, without the per-request latencies."""
        data = asdict(self)
        del data["latencies_ms"]
        return data


def make_payload(endpoint: str, rng: random.Random, max_tokens: Sequence[int]) -> dict[str, Any]:
    """One request body: a few random words; completions also get `max_tokens` drawn
    from the given choices and `ignore_eos`, so output lengths are what was asked."""
    text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 12)))
    if endpoint == "embeddings":
        return {"model": "batchscope-demo", "input": text}
    return {
        "model": "batchscope-demo",
        "prompt": text,
        "max_tokens": rng.choice(max_tokens),
        "ignore_eos": True,
    }


async def run_rate(
    session: aiohttp.ClientSession,
    url: str,
    endpoint: str,
    rate_per_s: float,
    duration_s: float,
    *,
    seed: int,
    max_tokens: Sequence[int] = (16,),
    concurrency_limit: int | None = None,
    setting: dict[str, float | int] | None = None,
) -> RunResult:
    """Offer Poisson load at `rate_per_s` for `duration_s` and measure what came back.

    An arrival that finds `concurrency_limit` requests in flight is not sent and is
    counted `dropped`; the run ends when every sent request has answered or timed out.
    """
    rng = random.Random(seed)
    schedule = arrival_times(rate_per_s, duration_s, rng)
    payloads = [make_payload(endpoint, rng, max_tokens) for _ in schedule]
    result = RunResult(setting or {}, rate_per_s, duration_s)
    target = url.rstrip("/") + ENDPOINTS[endpoint]
    in_flight: set[asyncio.Task[None]] = set()

    async def one(scheduled_at: float, payload: dict[str, Any]) -> None:
        try:
            async with session.post(target, json=payload) as response:
                await response.read()
                status = response.status
        except (aiohttp.ClientError, TimeoutError):
            result.errors += 1
            return
        if status == 429:
            result.rejected_429 += 1
        elif 200 <= status < 300:
            result.ok += 1
            result.latencies_ms.append((time.perf_counter() - scheduled_at) * 1000.0)
        else:
            result.errors += 1

    start = time.perf_counter()
    for offset, payload in zip(schedule, payloads, strict=True):
        delay = start + offset - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        if concurrency_limit is not None and len(in_flight) >= concurrency_limit:
            result.dropped += 1
            continue
        task = asyncio.create_task(one(start + offset, payload))
        in_flight.add(task)
        task.add_done_callback(in_flight.discard)
        result.sent += 1
    if in_flight:
        await asyncio.gather(*in_flight)
    result.elapsed_s = time.perf_counter() - start
    result.throughput_per_s = result.ok / max(result.elapsed_s, duration_s)
    result.p50_ms = percentile(result.latencies_ms, 50)
    result.p99_ms = percentile(result.latencies_ms, 99)
    return result


async def apply_setting(
    session: aiohttp.ClientSession, url: str, setting: dict[str, float | int]
) -> None:
    """POST the setting to the server's admin endpoint; raises on a non-2xx answer."""
    async with session.post(url.rstrip("/") + ADMIN_PATH, json=setting) as response:
        body = await response.text()
        if response.status >= 300:
            raise RuntimeError(f"{ADMIN_PATH} answered {response.status}: {body[:200]}")


async def sweep(
    url: str,
    endpoint: str,
    rates: Sequence[float],
    duration_s: float,
    *,
    settings: Sequence[tuple[str, list[float | int]]] = (),
    seed: int = 0,
    max_tokens: Sequence[int] = (16,),
    concurrency_limit: int | None = None,
    timeout_s: float = 30.0,
    progress: TextIO | None = None,
) -> list[RunResult]:
    """Every combination of the settings' values, each followed by every rate in turn.

    Progress lines go to `progress` (a text stream) when given.
    """
    names = [name for name, _ in settings]
    combinations = [
        dict(zip(names, values, strict=True))
        for values in itertools.product(*(values for _, values in settings))
    ]
    total = len(combinations) * len(rates)
    results: list[RunResult] = []
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    connector = aiohttp.TCPConnector(limit=concurrency_limit or 0)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        for setting in combinations:
            if setting:
                await apply_setting(session, url, setting)
            for rate in rates:
                if progress is not None:
                    label = _setting_label(setting) or "-"
                    print(
                        f"[{len(results) + 1}/{total}] {label} rate={rate:g}/s "
                        f"for {duration_s:g} s",
                        file=progress,
                        flush=True,
                    )
                result = await run_rate(
                    session,
                    url,
                    endpoint,
                    rate,
                    duration_s,
                    seed=seed + len(results),
                    max_tokens=max_tokens,
                    concurrency_limit=concurrency_limit,
                    setting=setting,
                )
                results.append(result)
                if progress is not None:
                    print(
                        f"    ok={result.ok} errors={result.errors} 429={result.rejected_429} "
                        f"p50={_ms(result.p50_ms)} ms p99={_ms(result.p99_ms)} ms",
                        file=progress,
                        flush=True,
                    )
    return results


def _setting_label(setting: dict[str, float | int]) -> str:
    return " ".join(f"{name}={value:g}" for name, value in setting.items())


def format_table(results: Sequence[RunResult]) -> str:
    """The results as a fixed-width text table, one row per run."""
    header = (
        "setting",
        "rate/s",
        "sent",
        "ok",
        "errors",
        "429",
        "dropped",
        "thr/s",
        "p50 ms",
        "p99 ms",
    )
    rows = [header]
    for r in results:
        rows.append(
            (
                _setting_label(r.setting) or "-",
                f"{r.rate_per_s:g}",
                str(r.sent),
                str(r.ok),
                str(r.errors),
                str(r.rejected_429),
                str(r.dropped),
                f"{r.throughput_per_s:.1f}",
                _ms(r.p50_ms),
                _ms(r.p99_ms),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = []
    for row in rows:
        cells = [row[0].ljust(widths[0])] + [
            c.rjust(w) for c, w in zip(row[1:], widths[1:], strict=True)
        ]
        lines.append("  ".join(cells))
    return "\n".join(lines)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",")]


def _floats(text: str) -> list[float]:
    return [float(v) for v in text.split(",")]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="batchscope-loadgen",
        description="Open-loop Poisson load against the demo server; p50/p99 per rate.",
    )
    parser.add_argument("--url", default="http://127.0.0.1:8000", help="server base URL")
    parser.add_argument("--endpoint", choices=sorted(ENDPOINTS), default="embeddings")
    parser.add_argument(
        "--rates",
        type=_floats,
        default=[10.0, 50.0, 100.0, 200.0],
        help="requests per second, comma-separated",
    )
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per rate")
    parser.add_argument(
        "--concurrency-limit",
        type=int,
        default=None,
        help="at most this many requests in flight; more arrivals are dropped",
    )
    parser.add_argument(
        "--max-tokens",
        type=_ints,
        default=[16],
        help="completions: max_tokens, or a comma list drawn at random",
    )
    parser.add_argument(
        "--set",
        dest="settings",
        action="append",
        type=parse_setting,
        default=[],
        metavar="NAME=V1,V2",
        help="sweep a server setting via POST /admin/config (repeatable)",
    )
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds per request")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the sweep and print the table (or JSON) to stdout; 0 on success."""
    args = build_parser().parse_args(argv)
    if any(rate <= 0 for rate in args.rates) or args.duration <= 0:
        print("rates and duration must be above 0", file=sys.stderr)
        return 2
    results = asyncio.run(
        sweep(
            args.url,
            args.endpoint,
            args.rates,
            args.duration,
            settings=args.settings,
            seed=args.seed,
            max_tokens=args.max_tokens,
            concurrency_limit=args.concurrency_limit,
            timeout_s=args.timeout,
            progress=sys.stderr,
        )
    )
    if args.json:
        print(json.dumps([r.summary() for r in results], indent=2))
    else:
        print(format_table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
