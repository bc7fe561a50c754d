"""batchscope-loadgen's command line: its flags, in groups, and what they ask for (the
fleet, the load, the settings to sweep)."""

from __future__ import annotations

import argparse
import random
from pathlib import Path

from batchscope.demo_server.loadgen.exporter_api import add_exporter_arguments
from batchscope.demo_server.loadgen.fleet import (
    BALANCE_POLICIES,
    DEFAULT_URL,
    Fleet,
    split_urls,
)
from batchscope.demo_server.loadgen.step import ENDPOINTS
from batchscope.demo_server.loadgen.watch import add_watch_arguments
from batchscope.demo_server.loadgen.workload import (
    ARRIVAL_PROCESSES,
    MAX_REQUESTS_PER_RUN,
    LoadSpec,
    lengths_from_file,
    lognormal_lengths,
)
from batchscope.demo_server.names import MODEL_NAME

EPILOG = """examples:
  # each step's batching signals, from the exporter's evaluator run in-process
  batchscope-loadgen --base-url http://127.0.0.1:8000 --endpoint completions \\
      --rates 2,4,8,16 --slo-ms 1500 --watch http://127.0.0.1:8000/metrics --cap 16
  # the same, read from a running exporter that monitors the server as `llm`
  batchscope-loadgen --base-url http://127.0.0.1:8000 --endpoint completions \\
      --rates 2,4,8,16 --slo-ms 1500 --exporter http://127.0.0.1:9500 --target llm
  # two replicas, each request to the one with the fewest requests outstanding
  batchscope-loadgen --url http://127.0.0.1:8000,http://127.0.0.1:8001 \\
      --balance least-outstanding --endpoint completions --rates 4,8 --output fleet.json

docs/reading-a-load-test.md says how to read the result."""


def parse_setting(text: str) -> tuple[str, list[float | int]]:
    """`name=v1,v2,...` as (name, values); integers stay integers."""
    name, sep, values = text.partition("=")
    if not sep or not name or not values:
        raise ValueError(f"a setting looks like max_wait_ms=5,10,20, got {text!r}")
    return name.strip(), [_typed_number(v) for v in values.split(",")]


def _typed_number(text: str) -> float | int:
    value = float(text)
    return int(value) if value.is_integer() and "." not in text else value


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
    """The command line of batchscope-loadgen."""
    parser = argparse.ArgumentParser(
        prog="batchscope-loadgen",
        description="Open-loop load against an OpenAI-style server (the demo server, vLLM)\n"
        "or a fleet of them: latency percentiles, TTFT, errors and goodput per rate.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_fleet_arguments(parser)
    _add_load_arguments(parser)
    _add_sweep_arguments(parser)
    add_watch_arguments(parser)
    add_exporter_arguments(parser)
    _add_output_arguments(parser)
    return parser


def _add_fleet_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--base-url",
        "--url",
        dest="urls",
        action="append",
        metavar="URL",
        help=f"server base URL (default {DEFAULT_URL}); repeat it, or give a comma list, "
        "to load a fleet of replicas",
    )
    parser.add_argument(
        "--balance",
        choices=BALANCE_POLICIES,
        default="round-robin",
        help="with several URLs: which one each request goes to; round-robin in turn, "
        "least-outstanding the one with the fewest requests unanswered (default %(default)s)",
    )


def _add_load_arguments(parser: argparse.ArgumentParser) -> None:
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
        "--inputs-per-request",
        type=int,
        default=1,
        metavar="N",
        help="embeddings: texts each request carries, as a list when more than one (a "
        "batcher queues each as an item) (default %(default)s)",
    )
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds per request")
    parser.add_argument("--seed", type=int, default=0)


def _add_sweep_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--set",
        dest="settings",
        action="append",
        type=parse_setting,
        default=[],
        metavar="NAME=V1,V2",
        help="sweep a server setting via POST /admin/config (repeatable; every URL of a "
        "fleet gets it)",
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


def _add_output_arguments(parser: argparse.ArgumentParser) -> None:
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


def usage_problem(args: argparse.Namespace) -> str | None:
    """What is wrong with the flags taken together, or None."""
    if args.plot and args.output is None:
        return "--plot needs --output"
    if args.find_capacity and args.slo_ms is None:
        return "--find-capacity needs --slo-ms"
    if args.find_capacity and (args.settings or args.sweep_max_wait):
        return "--find-capacity searches one setting: apply it first, without --set"
    if not 0 < args.slo_attainment <= 1:
        return "--slo-attainment is a share within (0, 1]"
    if args.inputs_per_request < 1:
        return "--inputs-per-request must be at least 1"
    if args.inputs_per_request > 1 and args.endpoint != "embeddings":
        return "--inputs-per-request sends a list of texts to embeddings only"
    return None


def fleet_of(args: argparse.Namespace) -> Fleet:
    """The base URLs and policy asked for; ValueError for an empty or repeated URL."""
    return Fleet(split_urls(args.urls or [DEFAULT_URL]), args.balance)


def settings_of(args: argparse.Namespace) -> list[tuple[str, list[float | int]]]:
    """The server settings to sweep: each --set, then --sweep-max-wait's."""
    settings = list(args.settings)
    if args.sweep_max_wait:
        settings.append(("max_wait_ms", [_typed_number(f"{v:g}") for v in args.sweep_max_wait]))
    return settings


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
        inputs_per_request=args.inputs_per_request,
    )
