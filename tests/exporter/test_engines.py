"""Engine adapters on real payloads: exact numbers, every vLLM generation, peers."""

from __future__ import annotations

import pytest

from batchscope.exporter.config.settings import Settings, Target
from batchscope.exporter.engines import UnrecognisedPayload, detect, read_series
from batchscope.exporter.scrape.fetch import ScrapeResult
from batchscope.exporter.scrape.loop import Exporter
from tests.support.paths import fixture_text
from tests.support.vllm_payload import VllmState, render

TINY = (("model_name", "/tmp/tinyllama"), ("engine", "0"))


def test_vllm_032_load_payload_running_8_waiting_32() -> None:
    [s] = read_series(fixture_text("vllm-0.32.0-cpu-load.txt"), "vllm")
    assert s.key == TINY
    assert (s.running, s.waiting, s.preemptions_total) == (8.0, 32.0, 0.0)
    assert s.kv_usage == pytest.approx(0.001220852154804053)
    assert s.requests_total == 20.0
    assert s.generation_tokens_total == 1014.0
    assert set(s.latency) == {"e2e", "ttft", "queue", "inference", "tpot", "itl"}
    assert s.latency["e2e"].count == 20.0
    assert s.latency["e2e"].sum == pytest.approx(4.350913047790527)
    assert s.output_tokens is not None and s.output_tokens.sum == 661.0


def test_vllm_032_after_payload_has_every_finished_request_in_its_histograms() -> None:
    [s] = read_series(fixture_text("vllm-0.32.0-cpu-after.txt"), "vllm")
    assert (s.running, s.waiting) == (0.0, 0.0)
    assert s.requests_total == 60.0
    e2e = s.latency["e2e"]
    assert e2e.count == 60.0 and e2e.sum == pytest.approx(77.12233853340149)
    assert e2e.bounds[:3] == (0.3, 0.5, 0.8) and e2e.counts[:3] == (18.0, 25.0, 26.0)
    tokens = s.output_tokens
    assert tokens.bounds == (1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, float("inf"))
    assert tokens.counts == (0.0, 0.0, 1.0, 3.0, 6.0, 15.0, 21.0, 32.0, 60.0, 60.0)
    assert tokens.sum == 11642.0


def test_vllm_010_excerpt_reads_kv_cache_usage_with_engine_label() -> None:
    [s] = read_series(fixture_text("vllm-0.10.0-excerpt.txt"), "vllm")
    assert s.key == (("model_name", "zai-org/GLM-4.5"), ("engine", "0"))
    assert s.kv_usage == pytest.approx(9.75010481363281e-06)
    assert s.running is None  # the excerpt does not show it: unknown, not zero


V0_PAYLOAD = """# HELP vllm:num_requests_running Number of requests currently running on GPU.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="facebook/opt-125m"} 5.0
# TYPE vllm:num_requests_swapped gauge
vllm:num_requests_swapped{model_name="facebook/opt-125m"} 2.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="facebook/opt-125m"} 7.0
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{model_name="facebook/opt-125m"} 0.97
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{model_name="facebook/opt-125m"} 12.0
"""


def test_vllm_v0_names_model_name_only_and_gpu_cache_usage() -> None:
    [s] = read_series(V0_PAYLOAD, "auto")
    assert s.key == (("model_name", "facebook/opt-125m"),)
    assert (s.running, s.waiting, s.kv_usage, s.preemptions_total) == (5.0, 9.0, 0.97, 12.0)


def test_one_target_with_two_engines_gives_two_series() -> None:
    # The second copy's HELP/TYPE lines made comments: a second one is refused.
    second = V0_PAYLOAD.replace("facebook/opt-125m", "other/model")
    two = V0_PAYLOAD + second.replace("# TYPE", "# XTYPE").replace("# HELP", "# XHELP")
    series = read_series(two, "vllm")
    assert [dict(s.key)["model_name"] for s in series] == ["facebook/opt-125m", "other/model"]


def test_vllm_v0_excerpt_without_scheduler_metrics_is_unrecognised() -> None:
    with pytest.raises(UnrecognisedPayload, match="no vllm series"):
        read_series(fixture_text("vllm-v0-0.6-excerpt.txt"), "auto")


def test_sglang_docs_payload() -> None:
    [s] = read_series(fixture_text("sglang-0.4-docs.txt"), "auto")
    assert s.engine == "sglang"
    assert (s.running, s.waiting, s.kv_usage) == (162.0, 2826.0, 0.28)
    assert s.requests_total == 11228.0
    assert s.latency["ttft"].count == 11008.0


def test_triton_docs_payload_counts_inferences_and_executions() -> None:
    [s] = read_series(fixture_text("triton-23.11-docs.txt"), "auto")
    assert s.engine == "triton"
    assert s.key == (("model", "tensorrt_llm"), ("version", "1"))
    assert (s.items_total, s.batches_total, s.waiting) == (0.0, 0.0, 0.0)


TGI_PAYLOAD = """# TYPE tgi_batch_current_size gauge
tgi_batch_current_size 12
# TYPE tgi_queue_size gauge
tgi_queue_size 3
# TYPE tgi_request_duration histogram
tgi_request_duration_bucket{le="0.5"} 4
tgi_request_duration_bucket{le="1"} 9
tgi_request_duration_bucket{le="+Inf"} 10
tgi_request_duration_sum 7.5
tgi_request_duration_count 10
"""


def test_tgi_payload() -> None:
    [s] = read_series(TGI_PAYLOAD, "auto")
    assert (s.engine, s.key, s.running, s.waiting, s.requests_total) == ("tgi", (), 12, 3, 10)


def test_detect_finds_each_engine_and_nothing_in_html() -> None:
    assert detect(fixture_text("vllm-0.32.0-cpu-load.txt")) == ["vllm"]
    assert detect(fixture_text("sglang-0.4-docs.txt")) == ["sglang"]
    assert detect(fixture_text("triton-23.11-docs.txt")) == ["triton"]
    assert detect("<html>hello</html>") == []
    with pytest.raises(UnrecognisedPayload, match="no known engine"):
        read_series("<html>hello</html>")


def test_inhouse_batcher_read_back_from_instrumentation() -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from batchscope.exporter.instrumentation import BatcherMetrics

    registry = CollectorRegistry()
    m = BatcherMetrics("embed", max_batch_size=32, latency_budget_seconds=0.06, registry=registry)
    m.set_queue_depth(5)
    for size, seconds in ((1, 0.010), (1, 0.012), (8, 0.020), (32, 0.040)):
        m.observe_batch(size, "timeout" if size == 1 else "full", seconds)
    for _ in range(42):
        m.observe_request("ok", queue_wait_seconds=0.004, latency_seconds=0.03)
    m.observe_request("rejected")
    [s] = read_series(generate_latest(registry).decode(), "auto")
    assert s.engine == "inhouse" and s.key == (("batcher", "embed"),)
    assert (s.waiting, s.cap, s.budget_seconds) == (5.0, 32.0, 0.06)
    assert (s.items_total, s.batches_total, s.requests_total) == (42.0, 4.0, 42.0)
    assert s.latency["e2e"].count == 42.0
    assert s.execution_by_size[1] == (2.0, pytest.approx(0.022))
    assert s.execution_by_size[32] == (1.0, pytest.approx(0.040))


def test_vllm_032_cache_config_info_gives_kv_capacity_block_size_and_memory() -> None:
    (series,) = read_series(fixture_text("vllm-0.32.0-cpu-load.txt"))
    assert series.kv_capacity_tokens == 1048576  # kv_cache_size_tokens
    assert series.block_size == 128
    assert series.gpu_memory_utilization == 0.92
    assert series.kv_cache_memory_bytes == 1 << 30
    assert (series.prompt_tokens.sum, series.prompt_tokens.count) == (1170, 20)


def test_older_vllm_cache_config_gives_capacity_as_blocks_times_block_size() -> None:
    payload = (
        'vllm:cache_config_info{block_size="16",engine="0",gpu_memory_utilization="0.9",'
        'num_gpu_blocks="2048",num_cpu_blocks="None"} 1.0\n'
        'vllm:num_requests_running{engine="0",model_name="m"} 2.0\n'
    )
    (series,) = read_series(payload)
    assert series.kv_capacity_tokens == 2048 * 16
    assert series.kv_cache_memory_bytes is None  # not stated before 0.11: not guessed


def _with_bucket_value(text: str, family: str, index: int, value: str) -> str:
    """The payload with the `index`-th `_bucket` sample of `family` set to `value`."""
    lines = text.split("\n")
    at = [i for i, line in enumerate(lines) if line.startswith(family + "_bucket")][index]
    lines[at] = lines[at].rpartition(" ")[0] + " " + value
    return "\n".join(lines)


@pytest.mark.parametrize("value", ["NaN", "+Inf"])
def test_a_histogram_with_a_non_finite_count_is_absent_from_that_scrape_never_a_failure(
    value,
) -> None:
    exporter = Exporter(Settings(targets=(Target("t", "http://h/metrics", engine="vllm", cap=8),)))
    state, server = exporter.states["t"], VllmState(running=4)
    estimates = []
    for n in range(5):
        server.finish(10, latency=0.4, output_tokens=3 + 40 * (n % 2))
        text = render(server)
        if n == 3:
            text = _with_bucket_value(text, "vllm:request_generation_tokens", 3, value)
            (poisoned,) = read_series(text, "vllm")
            assert poisoned.output_tokens is None and poisoned.running == 4.0
        signals = exporter.evaluate(state, ScrapeResult(text, None, 0.01), 1000.0 + 5 * n)
        assert signals.error is None and signals.total.diagnosis.state != "unreadable"
        estimates.append(signals.total.static_utilization.estimate if n else None)
    # the poisoned scrape's estimate is the window's, from the scrapes around it
    assert estimates[3] == pytest.approx(estimates[2]) and 0.0 < estimates[3] < 1.0
    assert dict(state.errors) == {}
