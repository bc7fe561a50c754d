"""The load a run offers: when requests arrive, what each asks, how long its output.

`LoadSpec` is what a sweep offers at each of its rates. Arrival processes (`poisson`,
`gamma` of a given burstiness, `constant`) at a mean rate, request bodies of a few random
words (`completion_body` is the one builder of an OpenAI completion body), and output
lengths drawn from a log-normal or read from a file of observed lengths. Pure, given the
random generator, except `lengths_from_file`, which reads its file.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from batchscope.demo_server.names import MODEL_NAME
from batchscope.exporter.length_log import FileReport, InputError, read_lengths

MAX_REQUESTS_PER_RUN = 100_000
ARRIVAL_PROCESSES = ("poisson", "gamma", "constant")
WORDS = (
    "batch",
    "queue",
    "latency",
    "budget",
    "token",
    "model",
    "server",
    "request",
    "wait",
    "throughput",
    "tail",
    "median",
    "cache",
    "slot",
    "step",
    "encoder",
    "decoder",
    "vector",
)


def arrival_times(
    rate_per_s: float,
    duration_s: float,
    rng: random.Random,
    process: str = "poisson",
    burstiness: float = 1.0,
) -> list[float]:
    """Arrival offsets (seconds from the start) within `duration_s`, at most
    MAX_REQUESTS_PER_RUN of them, at a mean of `rate_per_s`.

    `poisson`: exponential gaps. `gamma`: gamma gaps of shape `burstiness` (as `vllm bench
    serve --burstiness`): 1 is Poisson, below 1 burstier, above 1 more regular.
    `constant`: one every 1 / rate seconds.
    """
    if rate_per_s <= 0:
        raise ValueError(f"rate must be above 0, got {rate_per_s}")
    if process not in ARRIVAL_PROCESSES:
        raise ValueError(f"arrivals must be one of {ARRIVAL_PROCESSES}, got {process!r}")
    if burstiness <= 0:
        raise ValueError(f"burstiness must be above 0, got {burstiness}")

    def gap() -> float:
        if process == "poisson":
            return rng.expovariate(rate_per_s)
        if process == "gamma":
            return rng.gammavariate(burstiness, 1.0 / (rate_per_s * burstiness))
        return 1.0 / rate_per_s

    times: list[float] = []
    at = gap()
    while at < duration_s and len(times) < MAX_REQUESTS_PER_RUN:
        times.append(at)
        at += gap()
    return times


def lognormal_lengths(
    count: int, median: float, sigma: float, maximum: int, rng: random.Random
) -> list[int]:
    """`count` output lengths from a log-normal of this median and sigma, in 1..maximum."""
    mu = math.log(median)
    return [min(maximum, max(1, round(rng.lognormvariate(mu, sigma)))) for _ in range(count)]


def lengths_from_file(path: str) -> list[int]:
    """Every length in a file batchscope-static-util reads (plain numbers, CSV, JSON lines,
    a vLLM bench result with per-request data, the demo server's request log). Raises
    InputError naming the file when it holds none."""
    report = FileReport(path)
    with open(path, encoding="utf-8") as stream:
        lengths = [n for chunk in read_lengths(stream, report, None) for n in chunk if n > 0]
    if not lengths:
        raise InputError(f"{path}: no output lengths ({report.bad_lines} lines unreadable)")
    return lengths


@dataclass(frozen=True)
class LoadSpec:
    """The load a sweep offers at each of its `rates`, for `duration_s` each.

    Completions ask for `max_tokens` drawn from its choices, or for `output_lengths` in
    order (cycled) when given. At most `concurrency_limit` requests are in flight (None:
    no limit); each request is given `timeout_s`. Run i of a sweep draws from `seed + i`.
    The first `warmup_share` of each step is its warm-up: the server signals and the
    over-saturation rule read what follows. `stop_over_saturated`: a step the rule finds
    over-saturated ends early (`oversaturation`). Embeddings carry `inputs_per_request`
    texts each (as a client embedding a list sends them).
    """

    endpoint: str = "embeddings"
    rates: tuple[float, ...] = (10.0,)
    duration_s: float = 10.0
    arrivals: str = "poisson"
    burstiness: float = 1.0
    model: str = MODEL_NAME
    max_tokens: tuple[int, ...] = (16,)
    output_lengths: tuple[int, ...] | None = None
    concurrency_limit: int | None = None
    timeout_s: float = 30.0
    seed: int = 0
    warmup_share: float = 0.2
    stop_over_saturated: bool = True
    inputs_per_request: int = 1

    @property
    def warmup_s(self) -> float:
        return self.warmup_share * self.duration_s


def completion_body(
    prompt: str,
    max_tokens: int,
    *,
    model: str | None = MODEL_NAME,
    stream: bool = False,
    ignore_eos: bool = True,
    **extra: Any,
) -> dict[str, Any]:
    """An OpenAI `/v1/completions` body for `prompt`. With `ignore_eos` (the default) the
    answer is exactly `max_tokens` tokens long; `stream` asks for SSE chunks and a usage
    chunk; `model` None leaves the server to pick its one model; `extra` fields are added
    as given (`temperature=0`)."""
    body: dict[str, Any] = {"prompt": prompt, "max_tokens": max_tokens, "ignore_eos": ignore_eos}
    if model is not None:
        body["model"] = model
    if stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    return {**body, **extra}


def make_payload(
    endpoint: str,
    rng: random.Random,
    max_tokens: Sequence[int],
    model: str = MODEL_NAME,
    *,
    length: int | None = None,
    stream: bool = False,
    inputs: int = 1,
) -> dict[str, Any]:
    """One request body: a few random words; completions also get `max_tokens` drawn
    from the given choices (or `length`, when given) and `ignore_eos`, so output lengths
    are what was asked, and stream when `stream`. Embeddings: one text, or a list of
    `inputs` texts when more than one."""
    text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 12)))
    if endpoint == "embeddings":
        if inputs == 1:
            return {"model": model, "input": text}
        more = [
            " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 12)))
            for _ in range(inputs - 1)
        ]
        return {"model": model, "input": [text, *more]}
    # Drawn even when `length` is given, so the bodies that follow are the same either way.
    drawn = rng.choice(max_tokens)
    return completion_body(text, drawn if length is None else length, model=model, stream=stream)
