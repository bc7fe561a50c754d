"""What limits the batch: the breakdown's rules, the diagnosis that agrees with them, and
both read from real vLLM 0.32 payloads (tests/fixtures) with the values of a scenario."""

from __future__ import annotations

import argparse
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest

from batchscope.exporter.config.flags import add_arguments, settings_from_args
from batchscope.exporter.config.fleet_file import load_config, load_file_sd
from batchscope.exporter.config.settings import ConfigError
from batchscope.exporter.core.diagnosis import DiagnosisInputs, diagnose
from batchscope.exporter.core.evaluate import TargetSignals
from batchscope.exporter.core.limits import LIMITS, LimitInputs, limits
from batchscope.exporter.core.reading import trigger_shares
from batchscope.exporter.core.signals import SignalSettings
from batchscope.exporter.core.snapshot import Snapshot
from batchscope.exporter.engines import read_series
from batchscope.exporter.instrumentation import BatcherMetrics
from batchscope.exporter.scrape.loop import signal_settings
from batchscope.exporter.serve.exposition import render_metrics
from tests.support.evaluation import evaluate_target
from tests.support.paths import fixture_text

LOAD = fixture_text("vllm-0.32.0-cpu-load.txt")
IDLE = fixture_text("vllm-0.32.0-cpu-idle.txt")
SERIES = '{engine="0",model_name="/tmp/tinyllama"}'
BUCKETS = ("1.0", "8.0", "16.0", "32.0", "64.0", "128.0", "256.0", "512.0", "1024.0", "2048.0")
BUCKETS += ("4096.0", "8192.0", "16384.0", "+Inf")


def _set(text: str, name: str, value: float, labels: str = SERIES) -> str:
    line = f"{name}{labels} "
    assert line in text, line
    return re.sub(re.escape(line) + r"\S+", line + repr(float(value)), text)


def vllm_032(
    *,
    running: float,
    waiting: float,
    kv: float,
    steps: float,
    step_tokens: float,
    deferred: float = 0.0,
    rejected: float = 0.0,
    preemptions: float = 0.0,
    generated: float = 0.0,
    finished: float = 0.0,
    lengths: tuple[float, float, float] = (0.0, 0.0, 0.0),
) -> str:
    """The live 0.32 load payload with a scenario's values: cumulative steps and tokens of
    `iteration_tokens_total` (every step in the 64-token bucket and up), the gauges, and the
    counters of progress, refusals and preemptions."""
    text = LOAD
    for name, value in (
        ("vllm:num_requests_running", running),
        ("vllm:num_requests_waiting", waiting),
        ("vllm:kv_cache_usage_perc", kv),
        ("vllm:iteration_tokens_total_sum", step_tokens),
        ("vllm:iteration_tokens_total_count", steps),
        ("vllm:num_preemptions_total", preemptions),
        ("vllm:generation_tokens_total", generated),
    ):
        text = _set(text, name, value)
    length = '{engine="0",finished_reason="length",model_name="/tmp/tinyllama"}'
    text = _set(text, "vllm:request_success_total", finished, length)
    for le in BUCKETS:
        bucket = f'{{engine="0",le="{le}",model_name="/tmp/tinyllama"}}'
        below_64 = float(le) < 64
        text = _set(text, "vllm:iteration_tokens_total_bucket", 0 if below_64 else steps, bucket)
    for reason, value in (("capacity", waiting - deferred), ("deferred", deferred)):
        labels = SERIES[:-1] + f',reason="{reason}"}}'
        text = _set(text, "vllm:num_requests_waiting_by_reason", value, labels)
    # `lengths`: requests finished, their prompt and output tokens, all in one bucket each
    requests, prompt, output = lengths
    for family, total, smallest in (
        ("vllm:request_prompt_tokens", prompt, 500),
        ("vllm:request_generation_tokens", output, 50),
    ):
        text = _set(text, family + "_sum", total)
        text = _set(text, family + "_count", requests)
        for le in ("1.0", "2.0", "5.0", "10.0", "20.0", "50.0", "100.0", "200.0", "500.0", "+Inf"):
            bucket = f'{{engine="0",le="{le}",model_name="/tmp/tinyllama"}}'
            text = _set(text, family + "_bucket", requests if float(le) >= smallest else 0, bucket)
    rejections = '{model_name="/tmp/tinyllama",reason="max_num_queued_reqs"}'
    return _set(text, "vllm:admission_rejections_total", rejected, rejections)


def evaluate(payloads: list[str], **configured: float) -> object:
    """The target total over scrapes 10 s apart, with a window holding them all."""
    settings_ = SignalSettings(budget_seconds=30.0, **configured)
    snapshots = [
        Snapshot("vllm", 10.0 * i, True, read_series(text)) for i, text in enumerate(payloads)
    ]
    signals, _ = evaluate_target("vllm", "u", snapshots, settings_, {}, 10.0 * len(payloads))
    return signals.total


# The issue's real run, as a scenario: --max-num-batched-tokens 64, a cap of 64, two dozen
# clients with ~400-token prompts: running 3, waiting 21, KV 2%, 63.5 tokens per step.
START = vllm_032(running=0, waiting=0, kv=0, steps=0, step_tokens=0)
TOKEN_BOUND = vllm_032(
    running=3,
    waiting=21,
    kv=0.02,
    steps=2_000,
    step_tokens=127_000,
    generated=6_000,
    finished=300,
    lengths=(300, 120_000, 7_200),  # prompts of 400 tokens, answers of 24
)


def test_the_token_budget_binds_the_issue_run_when_it_is_configured() -> None:
    total = evaluate([START, TOKEN_BOUND], cap=64, token_budget=64)
    assert total.tokens_per_step == 63.5
    assert total.token_budget_ratio == pytest.approx(63.5 / 64)
    assert total.limits.binding == "token_budget"
    assert total.limits.at_bound == ("token_budget",)
    assert total.limits.ratio("requests") == 3 / 64
    assert total.limits.ratio("kv_cache") == 0.02
    assert total.diagnosis.state == "token_budget_bound"
    assert total.diagnosis.reason.startswith(
        "running 3 of cap 64 while 21 wait, engine steps carry 64 tokens of the 64-token "
        "budget (99%), and the KV cache has room (2% used): the per-step token budget limits"
    )
    assert "A higher --max-num-seqs will not help" in total.diagnosis.reason


def test_without_the_budget_it_is_not_guessed_and_the_reason_says_what_was_read() -> None:
    total = evaluate([START, TOKEN_BOUND], cap=64)
    assert total.tokens_per_step == 63.5 and total.token_budget_ratio is None
    assert total.diagnosis.state == "batch_limited"
    assert total.limits.binding == "unexplained"
    assert (
        "Looked at: the request cap, the KV cache (2% used, no preemptions), tokens per step "
        "(64), but not against a token budget: set `max_num_batched_tokens`"
    ) in total.diagnosis.reason
    (reading,) = [r for r in total.limits.readings if r.limit == "token_budget"]
    assert (reading.ratio, reading.exposed) == (None, False)
    assert "not configured for this target" in reading.reading


def test_the_kv_bound_and_cap_bound_cases_keep_their_states() -> None:
    kv_bound = vllm_032(
        running=5, waiting=30, kv=0.97, steps=2_000, step_tokens=20_000, preemptions=60
    )
    total = evaluate([START, kv_bound], cap=64, token_budget=64)
    assert total.diagnosis.state == "memory_bound"
    assert total.limits.binding == "kv_cache"
    # Steps at the token budget too (60 of 64), but memory binds: its advice leads.
    full_steps = vllm_032(
        running=9,
        waiting=20,
        kv=0.95,
        steps=2_000,
        step_tokens=120_000,
        preemptions=60,
        finished=300,
        lengths=(300, 120_000, 7_200),
    )
    total = evaluate([START, full_steps, full_steps], cap=16, token_budget=64)
    assert (total.diagnosis.state, total.limits.binding) == ("memory_bound", "kv_cache")
    assert total.limits.at_bound == ("kv_cache", "token_budget")
    assert not total.advice.summary.startswith("token-budget-bound")
    assert total.advice.item("token_budget_for_cap").text.startswith("--max-num-batched-tokens")
    at_cap = vllm_032(running=8, waiting=32, kv=0.01, steps=2_000, step_tokens=16_000)
    total = evaluate([START, at_cap], cap=8, token_budget=2048)
    assert total.diagnosis.state == "healthy"
    assert total.limits.binding == "requests"
    assert total.limits.ratio("token_budget") == 8 / 2048
    # At the cap and at the token budget: both bind, the request cap first, and the reason
    # says a higher cap alone will not help.
    total = evaluate([START, at_cap], cap=8, token_budget=8)
    assert total.diagnosis.state == "healthy"
    assert total.limits.at_bound == ("requests", "token_budget")
    assert "steps also run at the token budget (8 of 8 tokens)" in total.diagnosis.reason


def test_deferred_requests_and_refusals_are_named() -> None:
    stuck = vllm_032(running=2, waiting=6, kv=0.05, steps=10, step_tokens=20, deferred=6)
    total = evaluate([START, stuck, stuck, stuck], cap=8)
    assert total.waiting_deferred == 6
    assert total.diagnosis.state == "stalled"
    assert "6 of them are deferred" in total.diagnosis.reason
    assert total.limits.binding == "deferred"
    assert total.limits.ratio("deferred") == 1.0
    refused = vllm_032(running=0, waiting=0, kv=0, steps=0, step_tokens=0, rejected=30)
    total = evaluate([START, refused], cap=8)
    assert total.rejections_per_second == 3.0
    assert total.diagnosis.state == "idle"
    assert total.diagnosis.reason.endswith(
        "; 3.00 requests/s were refused at admission by a queue limit (vLLM: "
        "--max-num-queued-reqs, --max-num-queued-tokens; a batcher: its queue or budget): "
        "lost work that no latency histogram shows"
    )


def test_the_live_fixtures_sum_prompt_and_generated_tokens_into_iteration_tokens() -> None:
    # What iteration_tokens counts in 0.32: whole computed prompts plus generated tokens.
    after = fixture_text("vllm-0.32.0-cpu-after.txt")
    (series,) = read_series(after)
    value = {
        name: float(re.search(re.escape(name + SERIES) + r" (\S+)", after).group(1))
        for name in ("vllm:prompt_tokens_total", "vllm:generation_tokens_total")
    }
    assert series.step_tokens.sum == 15_152 == sum(value.values())
    assert series.step_tokens.count == 1_684
    total = evaluate([IDLE, LOAD], cap=8)
    assert total.tokens_per_step == pytest.approx(2652 / 171)
    assert (total.waiting_deferred, total.rejections_per_second) == (0.0, 0.0)


@pytest.mark.parametrize(
    "fixture", ["vllm-0.10.0-excerpt.txt", "sglang-0.4-docs.txt", "tgi-3.x-a.txt"]
)
def test_a_payload_without_the_new_families_reads_as_before(fixture: str) -> None:
    text = fixture_text(fixture)
    (series,) = read_series(text)
    assert (series.step_tokens, series.waiting_deferred, series.rejections_total) == (None,) * 3
    with_budget = evaluate([text, text], cap=8, token_budget=64)
    without = evaluate([text, text], cap=8)
    assert with_budget.diagnosis == without.diagnosis
    assert with_budget.tokens_per_step is None and with_budget.token_budget_ratio is None


# ----------------------------------------------------------------- the rules, pure


@pytest.mark.parametrize(
    ("inputs", "binding", "at_bound"),
    [
        (LimitInputs(running=0, waiting=0, cap=8), None, ()),
        (
            LimitInputs(running=0, waiting=0, cap=8, kv_usage=0.0, preemptions_per_second=0),
            None,
            (),
        ),
        # A preemption means a request ran: clean-clone run 25's KV-bound sweep read 0
        # running, 0 waiting and 0% KV at every scrape of a step that preempted 177
        # requests a second (and finished 4 a second): the KV cache binds, not nothing.
        (
            LimitInputs(running=0, waiting=0, cap=8, kv_usage=0.0, preemptions_per_second=177),
            "kv_cache",
            ("kv_cache",),
        ),
        (LimitInputs(running=3, waiting=0, cap=8), "arrivals", ()),
        (LimitInputs(running=8, waiting=0, cap=8), "requests", ("requests",)),
        (LimitInputs(running=3, waiting=9, cap=8, kv_usage=0.95), "kv_cache", ("kv_cache",)),
        (
            LimitInputs(running=8, waiting=9, cap=8, kv_usage=0.5, preemptions_per_second=2),
            "kv_cache",
            ("kv_cache", "requests"),
        ),
        (
            LimitInputs(running=3, waiting=9, cap=64, tokens_per_step=60, token_budget=64),
            "token_budget",
            ("token_budget",),
        ),
        (
            LimitInputs(running=8, waiting=9, cap=8, tokens_per_step=60, token_budget=64),
            "requests",
            ("requests", "token_budget"),
        ),
        (LimitInputs(running=3, waiting=9, cap=8, kv_usage=0.1), "unexplained", ()),
        (LimitInputs(running=3, waiting=9, waiting_deferred=5), "deferred", ("deferred",)),
        (LimitInputs(running=3, waiting=9, waiting_deferred=4), "unexplained", ()),
        (
            LimitInputs(running=3, waiting=0, fired_batches=True, trigger_shares={"timeout": 1}),
            "arrivals",
            ("max_wait",),
        ),
        (
            LimitInputs(
                running=3,
                waiting=5,
                fired_batches=True,
                trigger_shares={"timeout": 0.2, "budget": 0.8},
            ),
            "latency_budget",
            ("latency_budget",),
        ),
        (
            LimitInputs(
                running=8, waiting=5, cap=8, fired_batches=True, trigger_shares={"full": 0.5}
            ),
            "requests",
            ("requests",),
        ),
    ],
)
def test_the_binding_limit_first_match(inputs, binding, at_bound) -> None:
    result = limits(inputs)
    assert (result.binding, result.at_bound) == (binding, at_bound)
    assert [r.limit for r in result.readings] == list(LIMITS)


# A diagnosis state that names a limit, and the limit it names.
NAMED = {
    "memory_bound": {"kv_cache"},
    "token_budget_bound": {"token_budget"},
    "healthy": {"requests", "batch_tokens"},
    "underloaded": {"arrivals"},
    "work_too_slow": {"arrivals"},
    "preempting": {"kv_cache"},
    "batch_limited": {"unexplained", "deferred", "max_wait", "latency_budget"},
}
maybe = st.one_of(st.none(), st.floats(0, 200, allow_nan=False))


@settings(max_examples=400, deadline=None)
@given(
    running=st.floats(0, 80),
    waiting=st.floats(0, 50),
    cap=st.one_of(st.none(), st.sampled_from([8.0, 64.0])),
    kv=st.one_of(st.none(), st.floats(0, 1)),
    preemptions=st.one_of(st.none(), st.sampled_from([0.0, 1.5])),
    tokens_per_step=maybe,
    token_budget=st.one_of(st.none(), st.sampled_from([64.0, 2048.0])),
    deferred=st.one_of(st.none(), st.floats(0, 50)),
    batch_tokens=st.one_of(st.none(), st.floats(0, 20_000)),
    token_cap=st.one_of(st.none(), st.just(16_000.0)),
    fired=st.booleans(),
    shares=st.dictionaries(st.sampled_from(["full", "timeout", "budget"]), st.floats(0, 1)),
    utilization=st.one_of(st.none(), st.floats(1.01, 5)),
)
def test_a_state_that_names_a_limit_agrees_with_the_binding_limit(
    running,
    waiting,
    cap,
    kv,
    preemptions,
    tokens_per_step,
    token_budget,
    deferred,
    batch_tokens,
    token_cap,
    fired,
    shares,
    utilization,
) -> None:
    # A batcher (fired batches) publishes no KV cache, preemptions or token figures.
    if fired:
        kv = preemptions = tokens_per_step = deferred = batch_tokens = None
    settings_ = SignalSettings(token_budget=token_budget)
    state = diagnose(
        DiagnosisInputs(
            running=running,
            waiting=waiting,
            cap=cap,
            kv_usage=kv,
            preemptions_per_second=preemptions,
            budget_saturated=False,
            budget_utilization=utilization,
            tokens_per_step=tokens_per_step,
            waiting_deferred=deferred,
            fired_batches=fired,
            batch_tokens=batch_tokens,
            token_cap=token_cap,
        ),
        settings_,
    ).state
    binding = limits(
        LimitInputs(
            running=running,
            waiting=waiting,
            cap=cap,
            kv_usage=kv,
            preemptions_per_second=preemptions,
            tokens_per_step=tokens_per_step,
            token_budget=token_budget,
            waiting_deferred=deferred,
            batch_tokens=batch_tokens,
            token_cap=token_cap,
            fired_batches=fired,
            trigger_shares=shares if fired else {},
        )
    ).binding
    if state == "idle":
        assert binding is None
    elif state in NAMED:
        assert binding in NAMED[state], (state, binding)


# ----------------------------------------------------------------- where a user sees it


def test_the_breakdown_is_exported_on_metrics() -> None:
    signals = evaluate([START, TOKEN_BOUND], cap=64, token_budget=64)
    target = TargetSignals("vllm", "u", 10.0, True, None, (), signals)
    text = render_metrics([target]).decode()
    assert 'batchscope_limit_ratio{limit="token_budget",target="vllm"} 0.9921875\n' in text
    assert 'batchscope_limit_ratio{limit="requests",target="vllm"} 0.046875\n' in text
    assert 'batchscope_binding_limit{limit="token_budget",target="vllm"} 1.0\n' in text
    binding = re.findall(r'batchscope_binding_limit\{limit="(\w+)",target="vllm"\} 1.0', text)
    assert binding == ["token_budget"]
    assert 'batchscope_tokens_per_step{target="vllm"} 63.5\n' in text
    assert 'batchscope_token_budget{target="vllm"} 64.0\n' in text
    assert 'batchscope_diagnosis{state="token_budget_bound",target="vllm"} 1.0\n' in text


def test_the_token_budget_is_configured_by_flag_yaml_and_file_sd(tmp_path) -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--target", "http://a:1/metrics", "--max-num-batched-tokens", "64"])
    (target,) = settings_from_args(args).targets
    assert target.max_num_batched_tokens == 64.0
    settings_ = settings_from_args(args)
    assert signal_settings(target, settings_).token_budget == 64.0
    path = tmp_path / "c.yaml"
    path.write_text(
        "targets:\n  - name: v\n    url: http://a:1/metrics\n    max_num_batched_tokens: 2048\n"
    )
    assert load_config(path).targets[0].max_num_batched_tokens == 2048.0
    path.write_text(
        "targets:\n  - name: v\n    url: http://a:1/metrics\n    max_num_batched_tokens: 0\n"
    )
    with pytest.raises(ConfigError, match="max_num_batched_tokens"):
        load_config(path)
    sd = tmp_path / "sd.json"
    sd.write_text('[{"targets": ["a:1"], "labels": {"max_num_batched_tokens": "512"}}]')
    assert load_file_sd(sd)[0].max_num_batched_tokens == 512.0


def test_an_inhouse_batcher_names_the_trigger_that_fired_its_batches() -> None:
    registry = CollectorRegistry()
    m = BatcherMetrics(
        "b", max_batch_size=32, max_wait_seconds=0.01, latency_budget_seconds=0.1, registry=registry
    )
    before = generate_latest(registry).decode()
    m.set_queue_depth(0)
    for _ in range(9):
        m.observe_batch(4, "timeout", 0.002)
    m.observe_batch(32, "full", 0.01)
    light = generate_latest(registry).decode()
    total = evaluate([before, light])
    assert total.limits.ratio("max_wait") == 0.9
    assert total.limits.binding == "arrivals"  # batches fire on the timeout: few arrive
    assert total.diagnosis.state == "underloaded"
    m.set_queue_depth(40)
    for _ in range(30):
        m.observe_batch(12, "budget", 0.05)
    heavy = generate_latest(registry).decode()
    total = evaluate([light, heavy])
    assert (total.limits.ratio("latency_budget"), total.limits.binding) == (1.0, "latency_budget")


def test_the_token_budget_advice_names_the_budget_that_carries_the_cap() -> None:
    total = evaluate([START, TOKEN_BOUND, TOKEN_BOUND], cap=64, token_budget=64)
    needed = total.advice.item("tokens_per_step_for_cap")
    # 64 decodes, and 64 / 24 requests finishing each step to replace, 400 tokens each
    assert needed.value == pytest.approx(64 * (1 + 400 / 24))
    advised = total.advice.item("token_budget_for_cap")
    assert advised.value == 1152  # 1,130.7 rounded up to a multiple of 64
    assert advised.inputs["step_seconds"] == 20 / 2_000
    assert total.advice.summary == advised.text
    assert advised.text.startswith(
        "token-budget-bound: raising max-num-seqs will not help; --max-num-batched-tokens "
        "1152 (1,131 rounded up to a multiple of 64) would carry the cap, at up to 18.1x the "
        "step time (steps come every 10.0 ms today)"
    )
    # Requests wait below the cap for the token budget, not for memory: no KV verdict.
    assert total.advice.item("kv_cache_fill") is None
    assert total.advice.item("raise_cap_helps") is None
    stated = total.advice.item("kv_max_concurrency_stated")
    assert stated.value == 2048.0
    # With a budget that already carries the mix: no change advised, the need is stated.
    roomy = evaluate([START, TOKEN_BOUND, TOKEN_BOUND], cap=64, token_budget=2048)
    assert roomy.advice.item("token_budget_for_cap") is None
    assert roomy.advice.item("tokens_per_step_for_cap").value == pytest.approx(1130.67, abs=0.01)


def test_trigger_shares_count_through_a_restart_of_the_batcher() -> None:
    # 10 timeouts, then the batcher restarts (its counters begin again) and fires 30 by
    # its budget: 10 and 30 of 40, not the 20 a first-to-last difference would make of it.
    counts = [{"timeout": 5.0}, {"timeout": 15.0}, {"budget": 10.0}, {"budget": 30.0}]
    assert trigger_shares(counts) == {"timeout": 0.25, "budget": 0.75}
    assert trigger_shares([{"full": 3.0}, {"full": 3.0}]) == {}
