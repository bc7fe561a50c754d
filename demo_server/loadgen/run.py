"""Open-loop load generator for the demo server, vLLM, or any OpenAI-style endpoint.

`batchscope-loadgen --base-url URL --endpoint embeddings --rates 10,50,100 --duration 30
--output results.json` sends arrivals at each rate for `duration` seconds and reports,
per rate, throughput, latency percentiles, time to first token (completions, streamed),
errors by status and goodput within `--slo-ms`. `--set max_wait_ms=5,10,20` (or
`--sweep-max-wait 5,10,20`) repeats the sweep for each value, applied through the demo
server's `POST /admin/config`, so no restart is needed.

The result file holds `runs`, one per rate and setting, with the field names of
`vllm bench serve` where the meaning is the same (`request_throughput`,
`output_throughput`, `p50_e2el_ms`, `p90_e2el_ms`, `p99_e2el_ms`, `mean_ttft_ms`,
`p99_ttft_ms`, `completed`, `failed`), plus `rate`, `setting`, `errors_by_status` and
`goodput`; a CSV of the same rows lies beside it. `--plot` draws them with plotly.

`--watch METRICS_URL` records the server's batching signals over each step (the
exporter's evaluator, in-process: `watch`), or `--exporter URL --target NAME` reads them
from a running exporter (`exporter_api`), and the knee of each setting is named with
its cause (`batchscope.dashboard.load_format`), printed at the end and written (`knees`). `--find-capacity` runs the
steps a capacity search plans (`capacity_search`) instead of `--rates`. A step the
over-saturation rule flags (`oversaturation`) ends early. `--report FILE.html` writes
one self-contained HTML report (`batchscope.dashboard.load_report`). docs/reading-a-load-test.md
says how to read it all.

Open loop: a request is sent at its scheduled time whether or not earlier ones have
answered, and its latency is measured from that scheduled time, so a slow server
shows up as latency instead of silently lowering the offered load. When the generator
itself cannot keep its schedule (the client is the bottleneck), the run says so
(`behind_schedule`, `p99_send_lag_ms`) rather than reporting a lower load as the one
asked for. Only the given URL is contacted; every run is bounded in requests
(`MAX_REQUESTS_PER_RUN`) and in time (`duration` plus the request timeout).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import random
import sys
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any, Protocol, TextIO

import aiohttp

from batchscope.dashboard.load_format import setting_label, sweep_knees
from batchscope.demo_server.loadgen.arrivals import open_loop
from batchscope.demo_server.loadgen.batching import BatchingReading, step_batching
from batchscope.demo_server.loadgen.capacity_search import CapacitySearch, meets_slo
from batchscope.demo_server.loadgen.exporter_api import (
    UsageError,
    add_exporter_arguments,
    exporter_signals,
)
from batchscope.demo_server.loadgen.oversaturation import QueueSample, over_saturation
from batchscope.demo_server.loadgen.report import (
    PlainProgress,
    RichProgress,
    RunResult,
    behind_schedule_note,
    format_table,
    percentile,
    write_plots,
    write_results,
)
from batchscope.demo_server.loadgen.watch import WatchedServer, add_watch_arguments, watch_target
from batchscope.demo_server.loadgen.workload import (
    ARRIVAL_PROCESSES,
    MAX_REQUESTS_PER_RUN,
    LoadSpec,
    lengths_from_file,
    lognormal_lengths,
    make_payload,
)
from batchscope.demo_server.names import MODEL_NAME
from batchscope.exporter.config.settings import ConfigError
from batchscope.exporter.length_log import InputError

ENDPOINTS = {"embeddings": "/v1/embeddings", "completions": "/v1/completions"}
ADMIN_PATH = "/admin/config"
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


def parse_setting(text: str) -> tuple[str, list[float | int]]:
    """`name=v1,v2,...` as (name, values); integers stay integers."""
    name, sep, values = text.partition("=")
    if not sep or not name or not values:
        raise ValueError(f"a setting looks like max_wait_ms=5,10,20, got {text!r}")
    return name.strip(), [_typed_number(v) for v in values.split(",")]


def _typed_number(text: str) -> float | int:
    value = float(text)
    return int(value) if value.is_integer() and "." not in text else value


async def run_rate(
    session: aiohttp.ClientSession,
    url: str,
    spec: LoadSpec,
    rate_per_s: float,
    *,
    run_index: int = 0,
    setting: dict[str, float | int] | None = None,
    progress: PlainProgress | None = None,
    signals: StepSignals | None = None,
) -> RunResult:
    """Offer `spec`'s load at `rate_per_s` for `spec.duration_s`, its random
    draws from `spec.seed + run_index`, and measure what came back.

    Completions stream, so the first chunk gives the time to first token and the usage
    chunk the output tokens. An arrival that finds `spec.concurrency_limit` requests in
    flight is not sent and is counted `dropped`; the run ends when every sent request has
    answered or timed out. Every QUEUE_SAMPLE_S after the warm-up the requests in flight
    and the oldest one's wait are sampled; a step the over-saturation rule flags ends
    early (with `spec.stop_over_saturated`), its requests in flight cancelled. `signals`:
    read over the step after its warm-up, they give the step's `batching` object.
    """
    rng = random.Random(spec.seed + run_index)
    lengths = itertools.cycle(spec.output_lengths or [None])
    payloads: list[dict[str, Any]] = []

    def payload_of(index: int) -> dict[str, Any]:
        # Drawn in arrival order after the arrival times, dropped arrivals' too, so the
        # bodies sent do not depend on what was dropped.
        while len(payloads) <= index:
            payloads.append(
                make_payload(
                    spec.endpoint,
                    rng,
                    spec.max_tokens,
                    spec.model,
                    length=next(lengths),
                    stream=True,
                )
            )
        return payloads[index]

    result = RunResult(
        setting or {}, rate_per_s, spec.duration_s, arrivals=spec.arrivals, endpoint=spec.endpoint
    )
    target = url.rstrip("/") + ENDPOINTS[spec.endpoint]
    # Sent and not yet answered: index -> scheduled time.
    in_flight: dict[int, float] = {}

    async def one(index: int, scheduled_at: float) -> None:
        payload = payload_of(index)
        in_flight[index] = scheduled_at
        try:
            async with session.post(target, json=payload) as response:
                status = response.status
                if status == 200 and payload.get("stream"):
                    await _read_stream(response, scheduled_at, result)
                else:
                    await response.read()
        except TimeoutError:
            result.fail("timeout")
            return
        except aiohttp.ClientError:
            result.fail("connection")
            return
        finally:
            del in_flight[index]
            if progress is not None:
                progress.request_done()
        if 200 <= status < 300:
            result.ok += 1
            result.latencies_ms.append((time.perf_counter() - scheduled_at) * 1000.0)
        else:
            result.fail(str(status))

    stop = asyncio.Event()
    ended = asyncio.Event()
    sampler = asyncio.create_task(_sample_queue(in_flight, spec, rate_per_s, result, stop))
    watcher = asyncio.create_task(_read_step(signals, spec, ended)) if signals else None
    try:
        offered = await open_loop(
            rate_per_s,
            spec.duration_s,
            rng,
            one,
            process=spec.arrivals,
            burstiness=spec.burstiness,
            max_in_flight=spec.concurrency_limit,
            stop=stop,
        )
    finally:
        sampler.cancel()
        ended.set()
    if signals is not None and watcher is not None:
        result.batching = step_batching(await watcher, signals.source)
    for _ in range(offered.cancelled):
        result.fail("cancelled")
    result.stopped_at_s = offered.stopped_at_s
    result.sent = offered.sent
    result.dropped = offered.dropped
    result.send_lags_ms = [lag * 1000.0 for lag in offered.send_lags_s]
    result.elapsed_s = offered.elapsed_s
    seconds = result.elapsed_s if result.stopped_at_s is not None else spec.duration_s
    result.throughput_per_s = result.ok / max(result.elapsed_s, seconds)
    result.p50_ms = percentile(result.latencies_ms, 50)
    result.p99_ms = percentile(result.latencies_ms, 99)
    return result


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


async def apply_setting(
    session: aiohttp.ClientSession, url: str, setting: dict[str, float | int]
) -> None:
    """POST the setting to the server's admin endpoint; raises on a non-2xx answer."""
    async with session.post(url.rstrip("/") + ADMIN_PATH, json=setting) as response:
        body = await response.text()
        if response.status >= 300:
            raise RuntimeError(f"{ADMIN_PATH} answered {response.status}: {body[:200]}")


class Steps:
    """Runs steps one after another on one HTTP session, with progress and numbering."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        url: str,
        spec: LoadSpec,
        reporter: PlainProgress | None,
        signals: StepSignals | None,
    ) -> None:
        self.session = session
        self.url = url
        self.spec = spec
        self.reporter = reporter
        self.signals = signals
        self.results: list[RunResult] = []

    async def run(self, rate: float, setting: dict[str, float | int], of: str) -> RunResult:
        """One step at `rate` under `setting`; `of` says where it stands ("3/8")."""
        if self.reporter is not None:
            label = setting_label(setting) or "-"
            self.reporter.start_run(
                f"[{of}] {label} rate={rate:g}/s for {self.spec.duration_s:g} s",
                round(rate * self.spec.duration_s),
            )
        result = await run_rate(
            self.session,
            self.url,
            self.spec,
            rate,
            run_index=len(self.results),
            setting=setting,
            progress=self.reporter,
            signals=self.signals,
        )
        self.results.append(result)
        if self.reporter is not None:
            self.reporter.end_run(result)
        return result


@contextlib.asynccontextmanager
async def _steps(
    url: str, spec: LoadSpec, progress: TextIO | None, signals: StepSignals | None
) -> AsyncIterator[Steps]:
    reporter: PlainProgress | None = None
    if progress is not None:
        reporter = RichProgress(progress) if progress.isatty() else PlainProgress(progress)
    timeout = aiohttp.ClientTimeout(total=spec.timeout_s)
    connector = aiohttp.TCPConnector(limit=spec.concurrency_limit or 0)
    try:
        async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
            yield Steps(session, url, spec, reporter, signals)
    finally:
        if reporter is not None:
            reporter.close()


async def sweep(
    url: str,
    spec: LoadSpec,
    *,
    settings: Sequence[tuple[str, list[float | int]]] = (),
    progress: TextIO | None = None,
    signals: StepSignals | None = None,
) -> list[RunResult]:
    """Every combination of the settings' values, each followed by every rate of `spec`
    in turn.

    Progress goes to `progress` (a text stream) when given: a bar on a terminal, plain
    lines otherwise. `signals`: where each step's batching signals are read.
    """
    names = [name for name, _ in settings]
    combinations = [
        dict(zip(names, values, strict=True))
        for values in itertools.product(*(values for _, values in settings))
    ]
    total = len(combinations) * len(spec.rates)
    async with _steps(url, spec, progress, signals) as steps:
        for setting in combinations:
            if setting:
                await apply_setting(steps.session, url, setting)
            for rate in spec.rates:
                await steps.run(rate, setting, f"{len(steps.results) + 1}/{total}")
    return steps.results


async def find_capacity(
    url: str,
    spec: LoadSpec,
    search: CapacitySearch,
    *,
    slo_ms: float,
    attainment: float,
    progress: TextIO | None = None,
    signals: StepSignals | None = None,
) -> list[RunResult]:
    """Run the steps `search` plans, each passing when `meets_slo`, until it stops;
    returns the steps in the order run (the search holds the bracket)."""
    async with _steps(url, spec, progress, signals) as steps:
        while (rate := search.next_rate()) is not None:
            result = await steps.run(
                rate, {}, f"search {len(steps.results) + 1}/{search.max_steps}"
            )
            search.record(rate, meets_slo(result.record(slo_ms), attainment))
    return steps.results


EPILOG = """examples:
  # each step's batching signals, from the exporter's evaluator run in-process
  batchscope-loadgen --base-url http://127.0.0.1:8000 --endpoint completions \\
      --rates 2,4,8,16 --slo-ms 1500 --watch http://127.0.0.1:8000/metrics --cap 16
  # the same, read from a running exporter that monitors the server as `llm`
  batchscope-loadgen --base-url http://127.0.0.1:8000 --endpoint completions \\
      --rates 2,4,8,16 --slo-ms 1500 --exporter http://127.0.0.1:9500 --target llm

docs/reading-a-load-test.md says how to read the result."""


def _ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",")]


def _floats(text: str) -> list[float]:
    return [float(v) for v in text.split(",")]


def _lognormal_spec(text: str) -> tuple[float, float, int]:
    parts = text.split(":")
    if len(parts) not in (2, 3):
        raise argparse.ArgumentTypeError(f"looks like MEDIAN:SIGMA[:MAX], got {text!r}")
    median, sigma = float(parts[0]), float(parts[1])
    maximum = int(parts[2]) if len(parts) == 3 else 2048
    if median <= 0 or sigma < 0 or maximum < 1:
        raise argparse.ArgumentTypeError(f"median > 0, sigma >= 0, max >= 1; got {text!r}")
    return median, sigma, maximum


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="batchscope-loadgen",
        description="Open-loop load against an OpenAI-style server (the demo server, vLLM):\n"
        "latency percentiles, TTFT, errors and goodput per rate.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--base-url", "--url", dest="url", default="http://127.0.0.1:8000", help="server base URL"
    )
    parser.add_argument("--endpoint", choices=sorted(ENDPOINTS), default="embeddings")
    parser.add_argument("--model", default=MODEL_NAME, help="model name sent in each request")
    parser.add_argument(
        "--rates",
        type=_floats,
        default=[10.0, 50.0, 100.0, 200.0],
        help="requests per second, comma-separated",
    )
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per rate")
    parser.add_argument("--arrivals", choices=ARRIVAL_PROCESSES, default="poisson")
    parser.add_argument(
        "--burstiness",
        type=float,
        default=1.0,
        help="gamma arrivals: shape of the gaps; 1 is Poisson, below 1 burstier",
    )
    parser.add_argument(
        "--concurrency-limit",
        type=int,
        default=None,
        help="at most this many requests in flight; more arrivals are dropped",
    )
    lengths = parser.add_mutually_exclusive_group()
    lengths.add_argument(
        "--max-tokens",
        type=_ints,
        default=[16],
        help="completions: output length, or a comma list drawn at random",
    )
    lengths.add_argument(
        "--output-len-dist",
        type=_lognormal_spec,
        metavar="MEDIAN:SIGMA[:MAX]",
        help="completions: log-normal output lengths",
    )
    lengths.add_argument(
        "--output-len-file",
        metavar="PATH",
        help="completions: output lengths in order (cycled), from any file "
        "batchscope-static-util reads",
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
    parser.add_argument(
        "--sweep-max-wait",
        type=_floats,
        metavar="MS1,MS2",
        help="shorthand for --set max_wait_ms=MS1,MS2",
    )
    parser.add_argument("--slo-ms", type=float, default=None, help="goodput: answers within this")
    capacity = parser.add_argument_group("capacity at the SLO")
    capacity.add_argument(
        "--find-capacity",
        action="store_true",
        help="search for the highest rate meeting the SLO (--slo-ms, --slo-attainment): "
        "a geometric ramp from the first of --rates, then bisection; each step lasts "
        "--duration",
    )
    capacity.add_argument(
        "--slo-attainment",
        type=float,
        default=0.99,
        help="share of arrivals a passing step answers within --slo-ms (default: 0.99)",
    )
    capacity.add_argument(
        "--max-steps", type=int, default=10, help="the search's step bound (default: 10)"
    )
    capacity.add_argument(
        "--precision",
        type=float,
        default=0.10,
        help="the search stops when its failing rate is within this share of its passing "
        "one (default: 0.10)",
    )
    parser.add_argument(
        "--warmup-share",
        type=float,
        default=0.2,
        help="share of each step before the server signals and the over-saturation rule "
        "read it (default: 0.2)",
    )
    parser.add_argument(
        "--keep-over-saturated",
        action="store_true",
        help="run an over-saturated step to its end instead of stopping it",
    )
    add_watch_arguments(parser)
    add_exporter_arguments(parser)
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds per request")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", type=Path, help="result file (JSON); a CSV lands beside it")
    parser.add_argument(
        "--plot", action="store_true", help="with --output: plotly charts as .html (and .png)"
    )
    parser.add_argument(
        "--report",
        type=Path,
        metavar="FILE.html",
        help="one self-contained HTML report (charts, knee, capacity, table; no network)",
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    return parser


def load_spec(args: argparse.Namespace) -> LoadSpec:
    """The load the command line asks for; raises OSError or InputError when
    --output-len-file cannot be read."""
    output_lengths = None
    if args.output_len_file:
        output_lengths = tuple(lengths_from_file(args.output_len_file))
    elif args.output_len_dist:
        median, sigma, maximum = args.output_len_dist
        output_lengths = tuple(
            lognormal_lengths(
                MAX_REQUESTS_PER_RUN, median, sigma, maximum, random.Random(args.seed)
            )
        )
    return LoadSpec(
        endpoint=args.endpoint,
        rates=tuple(args.rates),
        duration_s=args.duration,
        arrivals=args.arrivals,
        burstiness=args.burstiness,
        model=args.model,
        max_tokens=tuple(args.max_tokens),
        output_lengths=output_lengths,
        concurrency_limit=args.concurrency_limit,
        timeout_s=args.timeout,
        seed=args.seed,
        warmup_share=args.warmup_share,
        stop_over_saturated=not args.keep_over_saturated,
    )


def capacity_record(search: CapacitySearch, records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The search's result for the result file, with the batching signals at the rate
    found (the last step run at it)."""
    found = search.result()
    at_rate = [r for r in records if r["rate"] == found.rate]
    return {
        **found.as_record(),
        "batching": at_rate[-1].get("batching") if at_rate else None,
        "words": found.words(),
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Run the sweep, print the table (or JSON) to stdout, write the files; 0 on success."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if any(rate <= 0 for rate in args.rates) or args.duration <= 0 or args.burstiness <= 0:
        print("rates, duration and burstiness must be above 0", file=sys.stderr)
        return 2
    if args.plot and args.output is None:
        parser.error("--plot needs --output")
    if args.find_capacity and args.slo_ms is None:
        parser.error("--find-capacity needs --slo-ms")
    if args.find_capacity and (args.settings or args.sweep_max_wait):
        parser.error("--find-capacity searches one setting: apply it first, without --set")
    if not 0 < args.slo_attainment <= 1:
        parser.error("--slo-attainment is a share within (0, 1]")
    settings = list(args.settings)
    if args.sweep_max_wait:
        settings.append(("max_wait_ms", [_typed_number(f"{v:g}") for v in args.sweep_max_wait]))
    try:
        spec = load_spec(args)
    except (OSError, InputError) as error:
        print(f"--output-len-file: {error}", file=sys.stderr)
        return 2
    try:
        signals: StepSignals | None = exporter_signals(args)
        watched = watch_target(args)
    except UsageError as error:
        parser.error(str(error))
    except ConfigError as error:
        print(str(error), file=sys.stderr)
        return 2
    if watched is not None:
        signals = WatchedServer(watched)
    search = None
    if args.find_capacity:
        search = CapacitySearch(args.rates[0], args.max_steps, args.precision)
        results = asyncio.run(
            find_capacity(
                args.url,
                spec,
                search,
                slo_ms=args.slo_ms,
                attainment=args.slo_attainment,
                progress=sys.stderr,
                signals=signals,
            )
        )
    else:
        results = asyncio.run(
            sweep(args.url, spec, settings=settings, progress=sys.stderr, signals=signals)
        )
    said = sys.stderr if args.json else sys.stdout
    if args.json:
        print(json.dumps([r.summary() for r in results], indent=2))
    else:
        print(format_table(results))
    records = [r.record(args.slo_ms) for r in results]
    for record in records:
        if record["behind_schedule"]:
            print(f"rate {record['rate']:g}/s: {behind_schedule_note(record)}", file=sys.stderr)
        if record["over_saturated"]:
            print(f"rate {record['rate']:g}/s: over-saturated", file=said)
    knees = sweep_knees(records, args.slo_ms)
    for knee in knees:
        print(f"{knee.setting + ': ' if knee.setting else ''}{knee.sentence}", file=said)
    capacity = capacity_record(search, records) if search is not None else None
    if capacity is not None:
        print(capacity["words"], file=said)
    meta = {
        "base_url": args.url,
        "endpoint": args.endpoint,
        "arrivals": args.arrivals,
        "burstiness": args.burstiness,
        "slo_ms": args.slo_ms,
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "knees": [knee.as_record() for knee in knees],
        **({"capacity": capacity} if capacity is not None else {}),
    }
    if args.output is not None:
        for written in write_results(args.output, records, meta):
            print(f"wrote {written}", file=sys.stderr)
        if args.plot:
            for note in write_plots(args.output.with_suffix(".html"), records):
                print(note, file=sys.stderr)
    if args.report is not None:
        from batchscope.dashboard.load_report import write_report

        print(f"wrote {write_report(args.report, records, meta)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
