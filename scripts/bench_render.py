"""Render benchmark: the exporter's /metrics body at fleet size, new writer against the old.

1,000 targets (`--targets`) are evaluated by the real `Exporter.evaluate` over three
successive scrapes of `fleet_sim.py`'s moving variants of the real vLLM 0.32 payload
(counters growing, gauges moving, each target its own model name and a `team` label).
Their TargetSignals are then rendered, in interleaved repetitions in this one process
(the order swaps every repetition), by:

- `render_metrics`, what the exporter serves (lines written straight from the signals);
- the previous writer (prometheus_client Metric objects from `SignalsCollector`, then the
  label-caching text writer the exporter had until this change, kept below for the
  comparison only);
- prometheus_client's `generate_latest` of a registry holding `SignalsCollector`.

Every repetition checks that the three bodies are the same bytes. CPU time (not wall
time), medians. The gzip of the body is measured with zlib (levels 1 and 6) and with
the exporter's own compression (`server.gzip_body`, ISA-L), as the exporter compresses
each round's body once. The /api/v1/signals body of the same targets is timed the same
way, `api.encode(api.signals_response(...))` against the API's plain definition that
tests/exporter/test_api_json.py holds it to (dataclasses.asdict, then a walk replacing NaN),
bytes compared every repetition.

    .venv/bin/python scripts/bench_render.py [--quick] [--targets N] [--output FILE]
"""

from __future__ import annotations

import argparse
import gzip
import random
import statistics
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from fleet_sim import FIXTURE, Template
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import Metric
from prometheus_client.utils import floatToGoString

from batchscope.exporter.config.settings import Settings, Target
from batchscope.exporter.core.evaluate import TargetSignals
from batchscope.exporter.scrape.fetch import ScrapeResult
from batchscope.exporter.scrape.loop import Exporter
from batchscope.exporter.serve import api_json as api
from batchscope.exporter.serve.app import GZIP_LEVEL, gzip_body
from batchscope.exporter.serve.exposition import render_metrics

# The JSON reference (the plain asdict definition) is the tests': `make bench` runs this
# from scripts/, so the repository root goes on the path for it.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.support.reference_exposition import SignalsCollector  # noqa: E402
from tests.support.reference_json import reference_encode, reference_series_json  # noqa: E402

TARGETS = 1000
QUICK_TARGETS = 100
SCRAPES = 3  # enough for rates, latency quantiles and advice
REPETITIONS = 15
QUICK_REPETITIONS = 3
# Compressors of the body: zlib's (the standard library's gzip) and ISA-L's, which serves.
GZIP_CODECS = {
    "zlib level 1": lambda body: gzip.compress(body, 1),
    "zlib level 6": lambda body: gzip.compress(body, 6),
    f"ISA-L level {GZIP_LEVEL} (served)": gzip_body,
}
TARGET_RATIO = 3.0
GENERATED_AT = 1000.0
EVALUATION = api.evaluation_json(Settings(targets=()))


def fleet_signals(targets: int, seed: int = 0) -> list[TargetSignals]:
    """Every target's signals after SCRAPES scrapes 5 s apart, through Exporter.evaluate."""
    template = Template(FIXTURE.read_text(encoding="utf-8"))
    rng = random.Random(seed)
    configured = tuple(
        Target(
            f"t{i}",
            f"http://127.0.0.1:9/t/{i}/metrics",
            engine="vllm",
            cap=256,
            budget_seconds=1.0,
            labels=(("team", f"team-{i % 7}"),),
        )
        for i in range(targets)
    )
    exporter = Exporter(Settings(targets=configured, interval_seconds=5.0))
    for scrape in range(SCRAPES):
        for i, state in enumerate(exporter.states.values()):
            payload = template.render(i, scrape, rng)
            exporter.evaluate(state, ScrapeResult(payload, None, 0.01), 1000.0 + 5 * scrape)
    return exporter.current()


def previous_render(targets: list[TargetSignals]) -> bytes:
    """/metrics as the exporter rendered it before `render_metrics` (2137ba4): the
    Collector's Metric objects, written by a text writer that escapes each label set once."""
    return _previous_exposition(SignalsCollector(lambda: targets).collect())


def _escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _previous_exposition(families: Iterable[Metric]) -> bytes:
    label_texts: dict[tuple[tuple[str, str], ...], str] = {}
    out: list[str] = []
    for metric in families:
        name = metric.name + "_total" if metric.type == "counter" else metric.name
        help_text = metric.documentation.replace("\\", "\\\\").replace("\n", "\\n")
        out.append(f"# HELP {name} {help_text}\n# TYPE {name} {metric.type}\n")
        for sample in metric.samples:
            key = tuple(sample.labels.items())
            labels = label_texts.get(key)
            if labels is None:
                pairs = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(key))
                labels = label_texts[key] = f"{{{pairs}}}" if pairs else ""
            out.append(f"{sample.name}{labels} {floatToGoString(sample.value)}\n")
    return "".join(out).encode()


def reference_render(targets: list[TargetSignals]) -> bytes:
    """prometheus_client's generate_latest of a registry holding SignalsCollector."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SignalsCollector(lambda: targets))
    return generate_latest(registry)


def signals_json(targets: list[TargetSignals]) -> bytes:
    """The /api/v1/signals body the exporter serves."""
    return api.encode(api.signals_response(GENERATED_AT, targets, EVALUATION))


def reference_signals_json(targets: list[TargetSignals]) -> bytes:
    """The same body by the API's plain definition: asdict per series, the NaN walk."""
    body = api.signals_response(GENERATED_AT, [], EVALUATION)
    body["targets"] = [
        {
            **api.target_json(t),
            "series": [reference_series_json(s) for s in t.series],
            "total": reference_series_json(t.total),
        }
        for t in targets
    ]
    return reference_encode(body)


def cpu_seconds(fn: Callable[[], object]) -> tuple[float, object]:
    started = time.process_time()
    result = fn()
    return time.process_time() - started, result


@dataclass(frozen=True)
class Result:
    targets: int
    repetitions: int
    body_bytes: int
    samples: int
    seconds: dict[str, list[float]]  # renderer -> CPU seconds per repetition
    identical: bool
    gzip: dict[str, tuple[float, int]]  # compressor -> (median CPU seconds, compressed bytes)
    json_bytes: int
    json_seconds: dict[str, list[float]]
    json_identical: bool

    def median(self, renderer: str, timings: str = "seconds") -> float:
        return statistics.median(getattr(self, timings)[renderer])

    def ratio(self, renderer: str, timings: str = "seconds") -> float:
        return self.median(renderer, timings) / self.median("new", timings)


RENDERERS: dict[str, Callable[[list[TargetSignals]], bytes]] = {
    "new": render_metrics,
    "previous": previous_render,
    "prometheus_client": reference_render,
}


JSON_RENDERERS: dict[str, Callable[[list[TargetSignals]], bytes]] = {
    "new": signals_json,
    "previous": reference_signals_json,
}


def side_by_side(
    renderers: dict[str, Callable[[list[TargetSignals]], bytes]],
    signals: list[TargetSignals],
    repetitions: int,
) -> tuple[dict[str, list[float]], bool, bytes]:
    """CPU seconds of each renderer per repetition (the order swaps every repetition; a
    first, uncounted one warms up), whether all gave the same bytes every time, and the
    body."""
    seconds: dict[str, list[float]] = {name: [] for name in renderers}
    identical = True
    body = b""
    for repetition in range(repetitions + 1):
        order = list(renderers) if repetition % 2 else list(reversed(renderers))
        bodies = {}
        for name in order:
            spent, bodies[name] = cpu_seconds(lambda name=name: renderers[name](signals))
            if repetition:
                seconds[name].append(spent)
        body = bodies["new"]
        identical = identical and len(set(bodies.values())) == 1
    return seconds, identical, body


def run(quick: bool = False, targets: int | None = None) -> Result:
    count = targets or (QUICK_TARGETS if quick else TARGETS)
    repetitions = QUICK_REPETITIONS if quick else REPETITIONS
    print(f"render: evaluating {count} targets x {SCRAPES} scrapes", file=sys.stderr, flush=True)
    signals = fleet_signals(count)
    seconds, identical, body = side_by_side(RENDERERS, signals, repetitions)
    json_seconds, json_identical, json_body = side_by_side(JSON_RENDERERS, signals, repetitions)
    print(f"render: gzip by {', '.join(GZIP_CODECS)}", file=sys.stderr, flush=True)
    compressed = {}
    for name, compress in GZIP_CODECS.items():
        runs = [cpu_seconds(lambda compress=compress: compress(body)) for _ in range(5)]
        compressed[name] = (statistics.median(s for s, _ in runs), len(runs[0][1]))
    samples = sum(1 for line in body.splitlines() if not line.startswith(b"#"))
    return Result(
        count,
        repetitions,
        len(body),
        samples,
        seconds,
        identical,
        compressed,
        len(json_body),
        json_seconds,
        json_identical,
    )


# The renderers of each body, as the report names them.
METRICS_TITLES = {
    "new": "`render_metrics` (served)",
    "previous": "previous: Collector + text writer",
    "prometheus_client": "prometheus_client `generate_latest`",
}
JSON_TITLES = {
    "new": "`api.encode(api.signals_response(...))` (served)",
    "previous": "plain definition: asdict + NaN walk",
}


def results(result: Result) -> dict:
    """The numbers of the report section, as `scripts/bench.py --json` writes them: CPU
    seconds, and each renderer's median against the served one's."""

    def renderers(timings: str) -> dict:
        return {
            name: {
                "median_cpu_seconds": result.median(name, timings),
                "ratio": result.ratio(name, timings),
            }
            for name in getattr(result, timings)
        }

    return {
        "targets": result.targets,
        "scrapes": SCRAPES,
        "repetitions": result.repetitions,
        "target_ratio": TARGET_RATIO,
        "metrics": {
            "bytes": result.body_bytes,
            "samples": result.samples,
            "renderers": renderers("seconds"),
            "identical": result.identical,
        },
        "gzip": {
            name: {"median_cpu_seconds": spent, "bytes": size}
            for name, (spent, size) in result.gzip.items()
        },
        "json": {
            "bytes": result.json_bytes,
            "renderers": renderers("json_seconds"),
            "identical": result.json_identical,
        },
    }


def markdown(results: dict) -> str:
    """The report section of `results`: medians in milliseconds, ratios against the new
    writer."""
    metrics, body, served_json = results["metrics"], results["metrics"]["bytes"], results["json"]
    lines = [
        f"## /metrics render ({results['targets']} targets)",
        "",
        f"`scripts/bench_render.py`: {results['targets']} targets evaluated by "
        f"`Exporter.evaluate` over {results['scrapes']} scrapes of `fleet_sim.py`'s moving "
        f"vLLM 0.32 payloads (a `team` label each); the body is {body / 1e6:.2f} MB, "
        f"{metrics['samples']} samples. {results['repetitions']} interleaved repetitions in "
        "one process, CPU time, medians. The previous writer is the exporter's until this "
        "change (`SignalsCollector`'s Metric objects + a label-caching text writer).",
        "",
        "| renderer | median CPU (ms) | CPU vs `render_metrics` |",
        "|---|---:|---:|",
    ]
    for name, title in METRICS_TITLES.items():
        row = metrics["renderers"][name]
        lines.append(f"| {title} | {row['median_cpu_seconds'] * 1e3:.1f} | {row['ratio']:.2f}x |")
    met = "met" if metrics["renderers"]["previous"]["ratio"] >= TARGET_RATIO else "missed"
    lines += [
        "",
        f"Identical bytes from all three in every repetition: {metrics['identical']}. "
        f"Target: >= {TARGET_RATIO:g}x less CPU than the previous writer: {met}.",
        "",
        "gzip of that body (the exporter compresses each round's body once, with ISA-L at "
        f"level {GZIP_LEVEL}):",
        "",
        "| compressor | median CPU (ms) | bytes | vs plain |",
        "|---|---:|---:|---:|",
    ]
    for name, row in results["gzip"].items():
        spent, size = row["median_cpu_seconds"], row["bytes"]
        lines.append(f"| {name} | {spent * 1e3:.1f} | {size:,} | {size / body:.1%} |")
    lines += [
        "",
        f"/api/v1/signals of the same targets ({served_json['bytes'] / 1e6:.2f} MB), rendered "
        "each round while a dashboard reads it:",
        "",
        "| renderer | median CPU (ms) | CPU vs served |",
        "|---|---:|---:|",
    ]
    for name, title in JSON_TITLES.items():
        row = served_json["renderers"][name]
        lines.append(f"| {title} | {row['median_cpu_seconds'] * 1e3:.1f} | {row['ratio']:.2f}x |")
    lines.append(f"\nIdentical bytes in every repetition: {served_json['identical']}.")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="100 targets, 3 repetitions")
    parser.add_argument("--targets", type=int, help=f"targets (default {TARGETS})")
    parser.add_argument("--output", type=Path, help="write the report section here too")
    args = parser.parse_args(argv)
    report = markdown(results(run(args.quick, args.targets)))
    print(report)
    if args.output is not None:
        args.output.write_text(report, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
