"""batchscope-loadgen: open-loop load against the demo server, vLLM, or any OpenAI-style
endpoint, or against a fleet of them.

`batchscope-loadgen --base-url URL --endpoint embeddings --rates 10,50,100 --duration 30
--output results.json` sends arrivals at each rate for `duration` seconds (`step`) and
reports, per rate, throughput, latency percentiles, time to first token (completions,
streamed), errors by status and goodput within `--slo-ms`. `--set max_wait_ms=5,10,20`
(or `--sweep-max-wait 5,10,20`) repeats the sweep for each value, applied through the
demo server's `POST /admin/config`, so no restart is needed. Several `--url`s (repeated,
or a comma list) load a fleet, each request going where `--balance` says (`fleet`).

The result file holds `runs`, one per rate and setting, in the result format
(`batchscope.dashboard.load_format`): the field names of `vllm bench serve` where the
meaning is the same, plus `rate`, `setting`, `errors_by_status`, `goodput`, and for a
fleet `by_url`; a CSV of the same rows lies beside it. `--plot` draws them with plotly.

`--watch METRICS_URL` records the server's batching signals over each step (the
exporter's evaluator, in-process: `watch`), or `--exporter URL --target NAME` reads them
from a running exporter (`exporter_api`), and the knee of each setting is named with its
cause, printed at the end and written (`knees`). `--find-capacity` runs the steps a
capacity search plans (`capacity_search`) instead of `--rates`. A step the
over-saturation rule flags (`oversaturation`) ends early. `--report FILE.html` writes one
self-contained HTML report (`batchscope.dashboard.load_report`).
docs/reading-a-load-test.md says how to read it all.

Only the given URLs are contacted; every run is bounded in requests
(`MAX_REQUESTS_PER_RUN`) and in time (`duration` plus the request timeout).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import sys
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any, TextIO

import aiohttp

from batchscope.dashboard.load_format import Knee, setting_label, sweep_knees
from batchscope.demo_server.loadgen.arguments import (
    build_parser,
    fleet_of,
    load_spec,
    settings_of,
    usage_problem,
)
from batchscope.demo_server.loadgen.capacity_search import CapacitySearch, meets_slo
from batchscope.demo_server.loadgen.exporter_api import UsageError, exporter_signals
from batchscope.demo_server.loadgen.fleet import Fleet
from batchscope.demo_server.loadgen.report import (
    PlainProgress,
    RichProgress,
    RunResult,
    behind_schedule_note,
    format_table,
    write_plots,
    write_results,
)
from batchscope.demo_server.loadgen.step import StepSignals, run_rate
from batchscope.demo_server.loadgen.watch import WatchedServer, watch_target
from batchscope.demo_server.loadgen.workload import LoadSpec
from batchscope.exporter.config.settings import ConfigError
from batchscope.exporter.length_log import InputError

ADMIN_PATH = "/admin/config"


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
        fleet: Fleet,
        spec: LoadSpec,
        reporter: PlainProgress | None,
        signals: StepSignals | None,
    ) -> None:
        self.session = session
        self.fleet = fleet
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
            self.fleet,
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
    fleet: Fleet, spec: LoadSpec, progress: TextIO | None, signals: StepSignals | None
) -> AsyncIterator[Steps]:
    reporter: PlainProgress | None = None
    if progress is not None:
        reporter = RichProgress(progress) if progress.isatty() else PlainProgress(progress)
    timeout = aiohttp.ClientTimeout(total=spec.timeout_s)
    connector = aiohttp.TCPConnector(limit=spec.concurrency_limit or 0)
    try:
        async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
            yield Steps(session, fleet, spec, reporter, signals)
    finally:
        if reporter is not None:
            reporter.close()


async def sweep(
    target: str | Fleet,
    spec: LoadSpec,
    *,
    settings: Sequence[tuple[str, list[float | int]]] = (),
    progress: TextIO | None = None,
    signals: StepSignals | None = None,
) -> list[RunResult]:
    """Every combination of the settings' values, each followed by every rate of `spec`
    in turn, against `target` (a base URL, or a fleet: each setting goes to every URL).

    Progress goes to `progress` (a text stream) when given: a bar on a terminal, plain
    lines otherwise. `signals`: where each step's batching signals are read.
    """
    names = [name for name, _ in settings]
    combinations = [
        dict(zip(names, values, strict=True))
        for values in itertools.product(*(values for _, values in settings))
    ]
    total = len(combinations) * len(spec.rates)
    fleet = Fleet.of(target)
    async with _steps(fleet, spec, progress, signals) as steps:
        for setting in combinations:
            if setting:
                for url in fleet.urls:
                    await apply_setting(steps.session, url, setting)
            for rate in spec.rates:
                await steps.run(rate, setting, f"{len(steps.results) + 1}/{total}")
    return steps.results


async def find_capacity(
    target: str | Fleet,
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
    async with _steps(Fleet.of(target), spec, progress, signals) as steps:
        while (rate := search.next_rate()) is not None:
            result = await steps.run(
                rate, {}, f"search {len(steps.results) + 1}/{search.max_steps}"
            )
            search.record(rate, meets_slo(result.record(slo_ms), attainment))
    return steps.results


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
    if (problem := usage_problem(args)) is not None:
        parser.error(problem)
    try:
        fleet = fleet_of(args)
    except ValueError as error:
        parser.error(str(error))
    try:
        spec = load_spec(args)
    except (OSError, InputError) as error:
        print(f"--output-len-file: {error}", file=sys.stderr)
        return 2
    try:
        signals = step_signals(args)
    except UsageError as error:
        parser.error(str(error))
    except ConfigError as error:
        print(str(error), file=sys.stderr)
        return 2
    search = None
    if args.find_capacity:
        search = CapacitySearch(args.rates[0], args.max_steps, args.precision)
        run = find_capacity(
            fleet,
            spec,
            search,
            slo_ms=args.slo_ms,
            attainment=args.slo_attainment,
            progress=sys.stderr,
            signals=signals,
        )
    else:
        run = sweep(fleet, spec, settings=settings_of(args), progress=sys.stderr, signals=signals)
    results = asyncio.run(run)
    report(args, fleet, results, search)
    return 0


def step_signals(args: argparse.Namespace) -> StepSignals | None:
    """Where each step's batching signals come from: --watch, --exporter, or nowhere.
    Raises UsageError or ConfigError (naming the flag) for flags that do not fit."""
    signals: StepSignals | None = exporter_signals(args)
    watched = watch_target(args)
    return WatchedServer(watched) if watched is not None else signals


def report(
    args: argparse.Namespace,
    fleet: Fleet,
    results: Sequence[RunResult],
    search: CapacitySearch | None,
) -> None:
    """The table (or JSON) on stdout, what each step and setting came to, and the files
    the flags ask for."""
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
    meta = result_meta(args, fleet, knees, capacity)
    if args.output is not None:
        for written in write_results(args.output, records, meta):
            print(f"wrote {written}", file=sys.stderr)
        if args.plot:
            for note in write_plots(args.output.with_suffix(".html"), records):
                print(note, file=sys.stderr)
    if args.report is not None:
        from batchscope.dashboard.load_report import write_report

        print(f"wrote {write_report(args.report, records, meta)}", file=sys.stderr)


def result_meta(
    args: argparse.Namespace, fleet: Fleet, knees: Sequence[Knee], capacity: dict[str, Any] | None
) -> dict[str, Any]:
    """The result file's fields beside its runs: what was loaded and how, the knees, the
    capacity found. One URL is `base_url`; a fleet is `base_urls` and its `balance`."""
    if len(fleet.urls) == 1:
        loaded: dict[str, Any] = {"base_url": fleet.urls[0]}
    else:
        loaded = {"base_urls": list(fleet.urls), "balance": fleet.balance}
    return {
        **loaded,
        "endpoint": args.endpoint,
        "arrivals": args.arrivals,
        "burstiness": args.burstiness,
        "slo_ms": args.slo_ms,
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "knees": [knee.as_record() for knee in knees],
        **({"capacity": capacity} if capacity is not None else {}),
    }


if __name__ == "__main__":
    sys.exit(main())
