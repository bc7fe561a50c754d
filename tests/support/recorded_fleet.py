"""A recorded fleet: every body the exporter serves, step by step, over a scripted run.

Sixteen targets, scraped every INTERVAL s for STEPS scrapes through `Exporter.evaluate`
(the scrape loop's per-target path: read the payload, evaluate the window, keep the
history row): the real vLLM 0.32 payload with its counters growing and its gauges moving
(one series; two, with an SLO objective and a token budget; steps at their token budget;
counters that stop while requests wait), a target that goes down and sends an
unreadable payload, the vLLM fixtures in turn, the Live page's stories
(`live_stories.STORIES`: an in-house batcher, saturation, preemption, a queue at the
cap) and each engine's written fixtures. After each step, `bodies` gives /metrics,
/api/v1/signals (full and summary) and /api/v1/advice as the app encodes them, and
after the last every target's /api/v1/history (each step's row).

tests/fixtures/recorded-fleet.json holds the SHA-256 of each body at each step, as the
code gave them when it was written; `python -m tests.support.recorded_fleet --write`
writes them anew, for a change meant to change what the exporter says.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
from collections.abc import Callable, Iterator

from batchscope.exporter.config.settings import Settings, Target
from batchscope.exporter.scrape.fetch import ScrapeResult
from batchscope.exporter.scrape.loop import Exporter
from batchscope.exporter.serve import api_json as api
from batchscope.exporter.serve.exposition import render_metrics
from batchscope.exporter.serve.history import Histories
from tests.support.live_stories import STORIES
from tests.support.paths import FIXTURES, fixture_text

INTERVAL = 5.0
# More than a history block (history.BLOCK_ROWS): the last step reads a compressed one.
STEPS = 34
START = 1_800_000_000.0
REFERENCE = FIXTURES / "recorded-fleet.json"
BODIES = ("metrics", "signals", "summary", "advice", "history")

_MODEL = 'model_name="/tmp/tinyllama"'
_GROWING = ("_total", "_bucket", "_count", "_sum")
_SAMPLE = re.compile(r"^(vllm:[^{ ]+)(.*) (\S+)$")

# A payload at each step (None: the scrape failed with that error).
Script = Callable[[int], str | None]


def grown(step: int, models: tuple[str, ...] = ("fleet/a",)) -> str:
    """The real vLLM 0.32 load payload at `step`, one series per model: its counters and
    histograms at (step + 1) times the fixture's (each model at its own pace), and its
    running, waiting and KV usage moving along a fixed cycle."""
    out = []
    for line in fixture_text("vllm-0.32.0-cpu-load.txt").splitlines():
        match = _SAMPLE.match(line)
        if match is None or _MODEL not in line:
            out.append(line)
            continue
        name, labels, value = match.groups()
        for pace, model in enumerate(models, 1):
            gauges = {
                "vllm:num_requests_running": float((37 * step + 11 * pace) % 257),
                "vllm:num_requests_waiting": float((13 * step + pace) % 9 * (step % 3)),
                "vllm:kv_cache_usage_perc": 0.05 + ((7 * step + pace) % 19) / 20,
            }
            if name in gauges:
                number = gauges[name]
            elif name.endswith(_GROWING):
                number = float(value) * (step + 1) * pace
            else:
                number = float(value)
            relabelled = labels.replace(_MODEL, f'model_name="{model}"')
            out.append(f"{name}{relabelled} {number!r}")
    return "\n".join(out) + "\n"


def _flaky(step: int) -> str | None:
    """Down for three scrapes, then an unreadable payload, then readable again."""
    if 10 <= step < 13:
        return None
    if step == 15:
        return 'vllm:num_requests_running{model_name="x"} not-a-number\n'
    return grown(step)


def _story(payloads: Callable[[], Iterator[str]]) -> Script:
    """A Live page story's payloads in turn; after its last, that one again."""
    texts = list(payloads())
    return lambda step: texts[min(step, len(texts) - 1)]


def _alternating(*names: str) -> Script:
    texts = [fixture_text(name) for name in names]
    return lambda step: texts[step % len(texts)]


def _target(name: str, **settings) -> Target:
    return Target(name, f"http://127.0.0.1:9/{name}/metrics", **settings)


def _scripts() -> dict[str, tuple[Target, Script]]:
    scripts: dict[str, tuple[Target, Script]] = {
        "fleet-one": (
            _target("fleet-one", engine="vllm", cap=256, budget_seconds=1, labels=(("team", "a"),)),
            grown,
        ),
        "fleet-two": (
            _target(
                "fleet-two",
                engine="vllm",
                cap=64,
                budget_seconds=0.5,
                max_num_batched_tokens=2048,
                slo_objective=0.99,
            ),
            lambda step: grown(step, ("fleet/b", "fleet/c")),
        ),
        "flaky": (_target("flaky", engine="vllm", cap=8, budget_seconds=0.05), _flaky),
        # Steps of 15.5 tokens on average, against a budget of 16.
        "token-bound": (
            _target("token-bound", engine="vllm", cap=256, max_num_batched_tokens=16),
            grown,
        ),
        # Its counters stop at step 4, with 8 requests waiting below the cap.
        "stalled": (_target("stalled", engine="vllm", cap=256), lambda step: grown(min(step, 4))),
        "vllm-fixtures": (
            _target("vllm-fixtures", cap=8, budget_seconds=1),
            _alternating(
                "vllm-0.32.0-cpu-idle.txt", "vllm-0.32.0-cpu-load.txt", "vllm-0.32.0-cpu-after.txt"
            ),
        ),
    }
    for name, (payloads, story) in STORIES.items():
        target = _target(
            name, engine=story.engine, cap=story.cap, budget_seconds=story.budget_seconds
        )
        scripts[name] = (target, _story(payloads))
    for engine, files in (
        ("tgi", ("tgi-3.x-a.txt", "tgi-3.x-b.txt")),
        ("llamacpp", ("llamacpp-b4500-a.txt", "llamacpp-b4500-b.txt")),
        ("rayserve", ("rayserve-2.50-a.txt", "rayserve-2.50-b.txt")),
        ("triton", ("triton-24.05-summaries-a.txt", "triton-24.05-summaries-b.txt")),
        ("trtllm", ("trtllm-triton-24.07-a.txt", "trtllm-triton-24.07-b.txt")),
    ):
        target = _target(engine, budget_seconds=2, token_cap=16000)
        scripts[engine] = (target, _alternating(*files))
    return scripts


def bodies() -> Iterator[dict[str, bytes]]:
    """Each step's bodies, by name (BODIES), after every target evaluated that step; the
    histories only at the last step, where they hold every step's row."""
    scripts = _scripts()
    settings = Settings(targets=tuple(t for t, _ in scripts.values()), interval_seconds=INTERVAL)
    exporter = Exporter(settings, clock=lambda: START)
    histories = Histories(exporter)
    evaluation = api.evaluation_json(settings)
    for step in range(STEPS):
        now = START + step * INTERVAL
        for offset, (name, (_, script)) in enumerate(scripts.items()):
            text = script(step)
            error = None if text is not None else "timed out after 4 s"
            result = ScrapeResult(text, error, 0.01 * (offset + 1))
            exporter.evaluate(exporter.states[name], result, now + 0.1 * offset)
        current = exporter.current()
        found = {
            "metrics": render_metrics(current),
            "signals": api.encode(api.signals_response(now, current, evaluation)),
            "summary": api.encode(api.summary_response(now, current, evaluation)),
            "advice": api.encode(api.advice_response(now, current)),
        }
        if step == STEPS - 1:
            found["history"] = b"".join(
                api.encode(api.history_response(name, histories.rows(name) or []))
                for name in scripts
            )
        yield found


def digests() -> list[dict[str, str]]:
    """The SHA-256 of each body at each step."""
    return [
        {name: hashlib.sha256(body).hexdigest() for name, body in step.items()} for step in bodies()
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help=f"write {REFERENCE.name}")
    args = parser.parse_args()
    found = digests()
    if args.write:
        REFERENCE.write_text(json.dumps({"steps": found}, indent=1) + "\n", encoding="utf-8")
    else:
        print(json.dumps(found[-1], indent=1))


if __name__ == "__main__":
    main()
