"""Each engine over two scrapes 30 s apart, through the exporter: the numbers by hand.

The payloads (tests/fixtures/, two per engine) are written from each engine's own
source and documentation, with counters that move between the scrapes.
"""

from __future__ import annotations

import pytest

from batchscope.exporter.config.fleet_file import load_config
from batchscope.exporter.config.settings import Settings, Target
from batchscope.exporter.core.evaluate import SeriesSignals, TargetSignals
from batchscope.exporter.core.signals import SignalSettings
from batchscope.exporter.core.snapshot import Snapshot
from batchscope.exporter.engines import detect, read_series
from batchscope.exporter.scrape.loop import Exporter
from tests.support.evaluation import evaluate_target, snapshot_from_payload
from tests.support.paths import fixture_text

STEP = 30.0


def scrapes(target: Target, texts: list[str]) -> list[Snapshot]:
    """One snapshot of each payload, read as the target's engine says, STEP seconds apart."""
    return [
        Snapshot(target.name, 1000.0 + i * STEP, True, read_series(text, target.engine))
        for i, text in enumerate(texts)
    ]


def scenario(target: Target, *fixtures: str) -> TargetSignals:
    """The target's signals after one scrape of each fixture, through the exporter."""
    exporter = Exporter(Settings(targets=(target,), window_seconds=120))
    state = exporter.states[target.name]
    signals = None
    for snapshot in scrapes(target, [fixture_text(name) for name in fixtures]):
        signals = exporter.ingest(state, snapshot, snapshot.t)
    return signals


def only(signals: TargetSignals) -> SeriesSignals:
    [series] = signals.series
    return series


PAIRS = {
    "trtllm+triton": ("trtllm-triton-24.07-a.txt", "trtllm-triton-24.07-b.txt"),
    "triton": ("triton-24.05-summaries-a.txt", "triton-24.05-summaries-b.txt"),
    "rayserve": ("rayserve-2.50-a.txt", "rayserve-2.50-b.txt"),
    "llamacpp": ("llamacpp-b4500-a.txt", "llamacpp-b4500-b.txt"),
    "tgi": ("tgi-3.x-a.txt", "tgi-3.x-b.txt"),
}


@pytest.mark.parametrize(("engine", "fixture"), [(e, f[1]) for e, f in PAIRS.items()])
def test_auto_detects_each_engine(engine, fixture) -> None:
    assert "+".join(detect(fixture_text(fixture))) == engine
    assert {s.engine for s in read_series(fixture_text(fixture))} == {engine}


def test_trtllm_behind_triton_is_memory_bound_with_its_own_cap_and_a_mean_latency() -> None:
    target = Target("trt", "http://127.0.0.1:8002/metrics", budget_seconds=3.0)
    signals = scenario(target, *PAIRS["trtllm+triton"])
    s = only(signals)
    assert s.labels == {"model": "tensorrt_llm", "version": "1"}
    assert s.engine == "trtllm+triton"
    # active 40 of the engine's own max 64 (no cap configured), 20 waiting: the batch
    # manager's queue, not Triton's pending count (0) for the same model
    assert (s.running, s.cap, s.waiting) == (40.0, 64.0, 20.0)
    assert s.running_vs_cap == 0.625
    assert s.kv_cache_usage == pytest.approx(6100 / 6239)  # used / max blocks
    # 150 requests in 30 s; request duration counter +360 000 000 us -> 2.4 s each
    assert s.requests_per_second == 5.0
    assert (s.latency_seconds, s.latency_statistic) == (pytest.approx(2.4), "mean")
    assert s.budget_utilization == pytest.approx(0.8)
    assert s.diagnosis.state == "memory_bound"
    assert s.diagnosis.reason == (
        "running 40 of cap 64 while 20 wait, KV cache 98% full: KV cache memory limits the "
        "batch, a higher cap will not help (latency: only a mean is exposed, 2.400 s per "
        "request over the window; the tail is longer, so budget utilisation is a lower bound)"
    )
    assert "preemptions_per_second" in s.not_exposed and "kv_cache_usage" not in s.not_exposed


def test_a_configured_cap_overrides_the_trtllm_max() -> None:
    target = Target("trt", "http://127.0.0.1:8002/metrics", cap=48)
    signals = scenario(target, *PAIRS["trtllm+triton"])
    s = only(signals)
    assert (s.cap, s.running_vs_cap, signals.total.cap) == (48.0, 40 / 48, 48.0)


def test_one_engine_named_reads_only_its_own_families_of_a_triton_trtllm_payload() -> None:
    text = fixture_text(PAIRS["trtllm+triton"][1])
    [trt] = read_series(text, "trtllm")
    [tri] = read_series(text, "triton")
    assert (trt.engine, trt.running, trt.waiting, trt.requests_total) == ("trtllm", 40, 20, None)
    assert (tri.engine, tri.running, tri.waiting, tri.requests_total) == ("triton", None, 0, 1150)


@pytest.mark.parametrize(
    ("histogram", "seconds", "statistic"),
    [
        ("queue", 0.3, "mean"),  # +45 000 000 us over 150 requests
        ("inference", 2.0, "mean"),  # +300 000 000 us over 150 requests
        # first-response histogram (ms): 150 in the window, rank 148.5 lies in
        # (2000, 5000] holding 140..150 -> 2000 + 3000 x 8.5 / 10 ms
        ("ttft", 4.55, "quantile"),
    ],
)
def test_trtllm_triton_latency_kinds(histogram, seconds, statistic) -> None:
    target = Target("trt", "http://127.0.0.1:8002/metrics", histogram=histogram)
    s = only(scenario(target, *PAIRS["trtllm+triton"]))
    assert (s.latency_seconds, s.latency_statistic) == (pytest.approx(seconds), statistic)


def test_triton_dynamic_batching_reads_its_summary_quantile_and_mean_batch() -> None:
    target = Target("bert", "http://127.0.0.1:8002/metrics", cap=16, budget_seconds=0.1)
    s = only(scenario(target, *PAIRS["triton"]))
    # 3000 inferences in 375 executions: mean batch 8 of max 16, 45 pending
    assert (s.mean_batch_size, s.running_vs_cap, s.waiting) == (8.0, 0.5, 45.0)
    assert s.requests_per_second == 100.0
    # the p99 of Triton's own summary window: 98 000 us
    assert (s.latency_seconds, s.latency_statistic) == (pytest.approx(0.098), "quantile")
    assert s.budget_utilization == pytest.approx(0.98)
    assert s.diagnosis.state == "batch_limited"
    assert s.diagnosis.reason.startswith("batches average 8 of max 16 while 45 wait")
    assert "only a mean" not in s.diagnosis.reason
    assert {"running", "kv_cache_usage", "preemptions_per_second"} <= set(s.not_exposed)


def test_triton_without_summaries_falls_back_to_the_mean_over_the_window() -> None:
    strip = [
        "\n".join(line for line in fixture_text(f).splitlines() if "_summary_us" not in line)
        for f in PAIRS["triton"]
    ]
    target = Target("bert", "http://127.0.0.1:8002/metrics", budget_seconds=0.1)
    signals, _ = evaluate_target(
        "bert", target.url, scrapes(target, strip), SignalSettings(budget_seconds=0.1), {}, 1030.0
    )
    s = only(signals)
    # request duration +120 000 000 us over 3000 requests: 40 ms each
    assert (s.latency_seconds, s.latency_statistic) == (pytest.approx(0.04), "mean")
    assert s.budget_utilization == pytest.approx(0.4)
    assert "only a mean is exposed, 0.040 s per request" in s.diagnosis.reason


def test_ray_serve_batch_queue_with_the_cap_from_size_over_utilisation() -> None:
    target = Target(
        "embed", "http://127.0.0.1:8080/metrics", histogram="queue", budget_seconds=0.05
    )
    s = only(scenario(target, *PAIRS["rayserve"]))
    assert s.labels == {
        "application": "embed",
        "deployment": "Embedder",
        "function_name": "embed_batch",
    }
    # two replicas: 1440 requests in 120 batches -> 12 a batch; cap 4640 x 100 / 14500
    assert (s.mean_batch_size, s.cap, s.running_vs_cap) == (12.0, 32.0, 0.375)
    assert s.waiting == 24.0  # 10 + 14 in the two replicas' queues
    # batch wait (ms): 120 batches, rank 118.8 in (20, 50] holding 90..120
    assert s.latency_seconds == pytest.approx(0.0488)
    assert s.budget_utilization == pytest.approx(0.976)
    assert s.diagnosis.state == "batch_limited"
    assert s.diagnosis.reason.startswith(
        "batches average 12 of max 32 while 24 wait: the batcher fires before batches fill"
    )
    assert s.batch_size_distribution == [(8.0, 40 / 120), (16.0, 80 / 120)]


def test_llamacpp_slots_full_with_cap_from_parallel() -> None:
    target = Target("llama", "http://127.0.0.1:8080/metrics", cap=4)
    s = only(scenario(target, *PAIRS["llamacpp"]))
    assert (s.running, s.waiting, s.running_vs_cap) == (4.0, 6.0, 1.0)
    assert s.kv_cache_usage == 0.74
    assert s.generation_tokens_per_second == 50.0  # 1500 tokens in 30 s
    assert s.latency_seconds is None
    assert s.diagnosis == s.diagnosis.__class__(
        "healthy",
        "running 4 of cap 4 with 6 waiting: continuous batching is doing its job; the next "
        "limit is elsewhere",
    )
    assert {"latency_seconds", "requests_per_second", "preemptions_per_second"} <= set(
        s.not_exposed
    )


def test_tgi_token_cap_not_request_cap_is_named_in_the_diagnosis(tmp_path) -> None:
    config = tmp_path / "fleet.yaml"
    config.write_text(
        "targets:\n  - name: tgi\n    url: http://127.0.0.1:8080/metrics\n"
        "    engine: auto\n    token_cap: 16000\n    budget_seconds: 4.0\n"
    )
    (target,) = load_config(config).targets
    assert target.token_cap == 16000.0
    s = only(scenario(target, *PAIRS["tgi"]))
    assert (s.running, s.waiting, s.cap, s.running_vs_cap) == (5.0, 9.0, None, None)
    assert (s.batch_tokens, s.token_cap) == (15500.0, 16000.0)
    assert s.tokens_vs_cap == 15500 / 16000
    # 40 requests in the window, all in (1e-4 x 1.5^25, 1e-4 x 1.5^26]: p99 at 0.99 of it
    low, high = 1e-4 * 1.5**25, 1e-4 * 1.5**26
    assert s.latency_seconds == pytest.approx(low + (high - low) * 0.99)
    assert s.budget_utilization == pytest.approx((low + (high - low) * 0.99) / 4.0)
    assert s.requests_per_second == pytest.approx(40 / 30)
    assert s.diagnosis.state == "healthy"
    # the diagnosis reads the recent peak of the running batch: 6 at the first scrape
    assert s.diagnosis.reason == (
        "running 6 holding 15500 of 16000 batch tokens with 9 waiting: the batch is at its "
        "token budget (a token cap, not a request cap): continuous batching is doing its "
        "job, and longer requests make smaller batches"
    )


def test_an_unknown_payload_is_a_down_target_naming_what_was_looked_for() -> None:
    target = Target("mystery", "http://127.0.0.1:9/metrics")
    exporter = Exporter(Settings(targets=(target,)))
    text = "# TYPE foo_requests gauge\nfoo_requests 3\n"
    snapshot = snapshot_from_payload(target, 1000.0, text, None, 0.01)
    signals = exporter.ingest(exporter.states["mystery"], snapshot, 1000.0)
    assert not signals.up
    assert signals.total.diagnosis.state == "down"
    reason = signals.total.diagnosis.reason
    assert "unreadable payload: no known engine's metrics in the payload (looked for " in reason
    for looked_for in (
        "vllm:*",
        "tgi_*",
        "nv_trt_llm_*",
        "nv_inference_*",
        "ray_serve_*",
        "llamacpp:*",
        "sglang:*",
    ):
        assert looked_for in reason


def test_a_known_prefix_without_the_engine_series_names_the_families_it_wanted() -> None:
    text = "# TYPE ray_serve_num_http_requests counter\nray_serve_num_http_requests_total 5\n"
    snapshot = snapshot_from_payload(Target("r", "http://x/metrics"), 1.0, text, None, 0.01)
    assert snapshot == Snapshot(
        "r",
        1.0,
        False,
        scrape_seconds=0.01,
        error="unreadable payload: no rayserve series in the payload (looked for "
        "ray_serve_batch_queue_length, ray_serve_actual_batch_size, "
        "ray_serve_batch_utilization_percent, ray_serve_batches_processed, "
        "ray_serve_batch_wait_time_ms, ray_serve_batch_execution_time_ms)",
    )


def test_a_mean_latency_is_exported_with_quantile_mean() -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from tests.support.reference_exposition import SignalsCollector

    target = Target("trt", "http://127.0.0.1:8002/metrics", budget_seconds=3.0)
    signals = scenario(target, *PAIRS["trtllm+triton"])
    registry = CollectorRegistry()
    registry.register(SignalsCollector(lambda: [signals]))
    text = generate_latest(registry).decode()
    assert (
        'batchscope_latency_seconds{histogram="e2e",model="tensorrt_llm",quantile="mean",'
        'target="trt",version="1"} 2.4' in text
    )
    assert 'batchscope_batch_cap{model="tensorrt_llm",target="trt",version="1"} 64.0' in text


def test_the_token_cap_flag() -> None:
    import argparse

    from batchscope.exporter.config.flags import add_arguments, settings_from_args

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--target", "http://127.0.0.1:8080", "--token-cap", "16000"])
    (target,) = settings_from_args(args).targets
    assert (target.token_cap, target.cap) == (16000.0, None)
