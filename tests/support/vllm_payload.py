"""Synthetic vLLM 0.32-format /metrics payloads for scripted scenarios.

Names, types, labels and bucket layouts are those of the real payload in
tests/fixtures/vllm-0.32.0-cpu-load.txt; only the numbers are chosen by the test.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from batchscope.exporter.engines.vllm import REQUEST_LATENCY_BUCKETS

# vLLM's own default e2e buckets, as the real payload has them.
E2E_BOUNDS = REQUEST_LATENCY_BUCKETS
TOKEN_BOUNDS = (1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0)
STEP_BOUNDS = (1.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0)
LABELS = 'engine="0",model_name="tiny"'


@dataclass
class VllmState:
    """Cumulative counters of a simulated vLLM server; the test advances them."""

    running: float = 0.0
    waiting: float = 0.0
    kv_usage: float = 0.0
    preemptions: float = 0.0
    e2e: dict[float, float] = field(default_factory=dict)  # non-cumulative count per bound
    e2e_sum: float = 0.0
    tokens: dict[float, float] = field(default_factory=dict)
    tokens_sum: float = 0.0
    kv_cache_tokens: float | None = None  # stated in cache_config_info when set
    steps: float = 0.0  # engine steps (iteration_tokens' count) and the tokens they carried
    step_tokens: float = 0.0
    # Waiting requests vLLM 0.32 deferred by a transient constraint; stated, with the rest
    # as `capacity`, in num_requests_waiting_by_reason when set.
    deferred: float | None = None
    # Prompt tokens looked up in the prefix cache and those it held; a speculative
    # decoder's draft tokens and those accepted: rendered when set.
    prefix_queries: float | None = None
    prefix_hits: float = 0.0
    draft_tokens: float | None = None
    accepted_tokens: float = 0.0
    # The share of a request's e2e latency it ran (vLLM's request_inference_time_seconds,
    # rendered when set): the rest it queued.
    inference_share: float | None = None
    inference: dict[float, float] = field(default_factory=dict)
    inference_sum: float = 0.0
    # vLLM's data-parallel engine index, which each of the engine's series carries.
    engine: str = "0"

    @property
    def finished(self) -> float:
        return sum(self.e2e.values())

    def finish(self, n: int, latency: float, output_tokens: int) -> None:
        """Record n requests finishing with this latency and output length."""
        bound = next((b for b in E2E_BOUNDS if latency <= b), float("inf"))
        self.e2e[bound] = self.e2e.get(bound, 0.0) + n
        self.e2e_sum += n * latency
        if self.inference_share is not None:
            ran = latency * self.inference_share
            ibound = next((b for b in E2E_BOUNDS if ran <= b), float("inf"))
            self.inference[ibound] = self.inference.get(ibound, 0.0) + n
            self.inference_sum += n * ran
        tbound = next((b for b in TOKEN_BOUNDS if output_tokens <= b), float("inf"))
        self.tokens[tbound] = self.tokens.get(tbound, 0.0) + n
        self.tokens_sum += n * output_tokens


def _labels(engine: str) -> str:
    return LABELS.replace('engine="0"', f'engine="{engine}"')


def _histogram(
    name: str,
    bounds: tuple[float, ...],
    counts: dict[float, float],
    total: float,
    help_text: str,
    engine: str,
) -> list[str]:
    lines = [f"# HELP {name} {help_text}", f"# TYPE {name} histogram"]
    cumulative = 0.0
    for b in (*bounds, float("inf")):
        cumulative += counts.get(b, 0.0)
        le = "+Inf" if b == float("inf") else repr(b)
        bucket = f'engine="{engine}",le="{le}",model_name="tiny"'
        lines.append(f"{name}_bucket{{{bucket}}} {cumulative}")
    lines.append(f"{name}_count{{{_labels(engine)}}} {cumulative}")
    lines.append(f"{name}_sum{{{_labels(engine)}}} {total}")
    return lines


def render(s: VllmState) -> str:
    """The payload a vLLM 0.32 server in this state would serve."""
    labels = _labels(s.engine)
    lines = [
        "# HELP vllm:num_requests_running Number of requests in model execution batches.",
        "# TYPE vllm:num_requests_running gauge",
        f"vllm:num_requests_running{{{labels}}} {s.running}",
        "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.",
        "# TYPE vllm:num_requests_waiting gauge",
        f"vllm:num_requests_waiting{{{labels}}} {s.waiting}",
        "# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.",
        "# TYPE vllm:kv_cache_usage_perc gauge",
        f"vllm:kv_cache_usage_perc{{{labels}}} {s.kv_usage}",
        "# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.",
        "# TYPE vllm:num_preemptions_total counter",
        f"vllm:num_preemptions_total{{{labels}}} {s.preemptions}",
        "# HELP vllm:request_success_total Count of successfully processed requests.",
        "# TYPE vllm:request_success_total counter",
        f'vllm:request_success_total{{engine="{s.engine}",finished_reason="length",'
        f'model_name="tiny"}} {s.finished}',
        "# HELP vllm:generation_tokens_total Number of generation tokens processed.",
        "# TYPE vllm:generation_tokens_total counter",
        f"vllm:generation_tokens_total{{{labels}}} {s.tokens_sum}",
    ]
    if s.deferred is not None:
        lines += [
            "# HELP vllm:num_requests_waiting_by_reason Number of waiting requests by reason.",
            "# TYPE vllm:num_requests_waiting_by_reason gauge",
            *(
                f'vllm:num_requests_waiting_by_reason{{{labels},reason="{reason}"}} {value}'
                for reason, value in (
                    ("capacity", s.waiting - s.deferred),
                    ("deferred", s.deferred),
                )
            ),
        ]
    counters = (
        ("vllm:prefix_cache_queries_total", s.prefix_queries, "Prefix cache queries."),
        ("vllm:prefix_cache_hits_total", s.prefix_hits, "Prefix cache hits."),
        ("vllm:spec_decode_num_draft_tokens_total", s.draft_tokens, "Number of draft tokens."),
        ("vllm:spec_decode_num_accepted_tokens_total", s.accepted_tokens, "Accepted tokens."),
    )
    for (name, value, help_text), given in zip(
        counters, (s.prefix_queries, s.prefix_queries, s.draft_tokens, s.draft_tokens), strict=True
    ):
        if given is not None:
            lines += [
                f"# HELP {name} {help_text}",
                f"# TYPE {name} counter",
                f"{name}{{{labels}}} {value}",
            ]
    if s.kv_cache_tokens is not None:
        lines += [
            "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig",
            "# TYPE vllm:cache_config_info gauge",
            f'vllm:cache_config_info{{block_size="16",engine="{s.engine}",'
            f'kv_cache_size_tokens="{s.kv_cache_tokens:.0f}"}} 1.0',
        ]
    lines += _histogram(
        "vllm:e2e_request_latency_seconds",
        E2E_BOUNDS,
        s.e2e,
        s.e2e_sum,
        "Histogram of e2e request latency in seconds.",
        s.engine,
    )
    if s.inference_share is not None:
        lines += _histogram(
            "vllm:request_inference_time_seconds",
            E2E_BOUNDS,
            s.inference,
            s.inference_sum,
            "Histogram of time spent in RUNNING phase for request.",
            s.engine,
        )
    lines += _histogram(
        "vllm:iteration_tokens_total",
        STEP_BOUNDS,
        {2048.0: s.steps},
        s.step_tokens,
        "Histogram of number of tokens per engine_step.",
        s.engine,
    )
    lines += _histogram(
        "vllm:request_generation_tokens",
        TOKEN_BOUNDS,
        s.tokens,
        s.tokens_sum,
        "Number of generation tokens processed.",
        s.engine,
    )
    return "\n".join(lines) + "\n"


def render_engines(states: list[VllmState]) -> str:
    """The payload of one vLLM server running data-parallel engines (one state each, its
    `engine` set): each family's HELP and TYPE once, then every engine's samples."""
    headers: dict[str, list[str]] = {}
    samples: dict[str, list[str]] = {}
    for state in states:
        name = ""
        for line in render(state).splitlines():
            if line.startswith("# "):
                name = line.split()[2]
                header = headers.setdefault(name, [])
                if line not in header:
                    header.append(line)
            else:
                samples.setdefault(name, []).append(line)
    return "".join(f"{line}\n" for name in headers for line in (*headers[name], *samples[name]))
