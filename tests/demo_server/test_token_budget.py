"""Chunked prefill under a per-step token budget, and three scenarios on sim:h200 whose
truth (the limit that bound each step) the exporter's binding limit is held to."""

from __future__ import annotations

import re

import httpx
import pytest
import torch

from batchscope.demo_server.cli import build_parser
from batchscope.demo_server.devices import Device
from batchscope.demo_server.generation.decoder import TinyDecoder
from batchscope.demo_server.generation.listeners import StepRecord
from batchscope.demo_server.generation.scheduler import Scheduler, SchedulerConfig
from batchscope.demo_server.http.app import ServerConfig
from batchscope.exporter.core.signals import SignalSettings
from tests.support.demo_http import serve
from tests.support.demo_scenarios import Scenario, run
from tests.support.evaluation import evaluate_target


class Steps:
    def __init__(self) -> None:
        self.records: list[StepRecord] = []

    def on_step(self, step: StepRecord) -> None:
        self.records.append(step)

    def on_finished(self, result) -> None:
        """Not needed."""


@pytest.mark.integration
def test_a_long_prompt_prefills_in_chunks_within_the_budget() -> None:
    steps = Steps()
    config = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=16)
    scheduler = Scheduler(
        TinyDecoder(), Device("cpu", __import__("torch").device("cpu")), config, listeners=[steps]
    )
    handle = scheduler.submit(list(range(5, 45)), 3, ignore_eos=True)  # 40 prompt tokens
    while scheduler.step_here():
        pass
    result = handle.future.result()
    assert result.output_tokens == 3
    # Context 39 tokens: 16, 16, then the last 7 with the first token; two more decodes.
    assert [(s.rows, s.prefill_tokens, s.generated) for s in steps.records] == [
        (0, 16, 0),
        (0, 16, 0),
        (1, 7, 1),
        (1, 0, 1),
        (1, 0, 1),
    ]
    assert [s.scheduled_tokens for s in steps.records] == [16, 16, 8, 1, 1]
    # vLLM credits the whole prompt to the step its prefill finished in.
    assert [s.prompt_tokens_finished for s in steps.records] == [0, 0, 40, 0, 0]
    assert [s.bound_by for s in steps.records] == ["token_budget"] * 2 + ["arrivals"] * 3
    stats = scheduler.stats()
    assert stats.prompt_tokens_computed == 40 and stats.scheduled_tokens == 42
    assert stats.steps_bound_by == {"token_budget": 2, "arrivals": 3}


@pytest.mark.integration
@pytest.mark.parametrize("prompt", [17, 33])
def test_a_context_that_fills_its_chunks_exactly_still_produces_its_first_token(
    prompt: int,
) -> None:
    # A 17-token prompt under a 16-token budget: its 16-token context takes the whole
    # first step, and its first token needs the second.
    steps = Steps()
    config = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=16)
    scheduler = Scheduler(
        TinyDecoder(), Device("cpu", torch.device("cpu")), config, listeners=[steps]
    )
    handle = scheduler.submit(list(range(5, 5 + prompt)), 2, ignore_eos=True)
    for _ in range(10):
        scheduler.step_here()
    assert handle.future.done() and handle.future.result().output_tokens == 2
    chunks = prompt // 16
    assert [s.generated for s in steps.records] == [0] * chunks + [1, 1]


@pytest.mark.integration
def test_a_static_group_under_a_budget_runs_together() -> None:
    steps = Steps()
    config = SchedulerConfig(batching="static", max_num_seqs=4, max_num_batched_tokens=16)
    scheduler = Scheduler(
        TinyDecoder(), Device("cpu", torch.device("cpu")), config, listeners=[steps]
    )
    handles = [scheduler.submit(list(range(5, 15)), 2, ignore_eos=True) for _ in range(4)]
    while scheduler.step_here():
        pass
    assert all(h.future.result().output_tokens == 2 for h in handles)
    # 4 x 10 tokens under a 16-token budget, the group admitted at once: w0 whole and 6 of
    # w1; then w0's decode, the rest of w1, all of w2 and 1 of w3; then w3's last 9.
    assert [s.generated for s in steps.records] == [1, 3, 3, 1]
    assert [s.prefill_tokens for s in steps.records] == [9 + 6, 3 + 9 + 1, 8, 0]


def test_a_budget_below_the_cap_is_refused() -> None:
    with pytest.raises(ValueError, match="must be at least max_num_seqs"):
        SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=4)


# ------------------------------------------------ scenarios: the exporter against the truth

SECONDS, WINDOW = 4.0, 2.5
SCENARIOS = {
    # 32 clients of short prompts against 8 slots: the cap.
    "cap": (Scenario(SchedulerConfig(max_num_seqs=8), 32, 32, 64, SECONDS, 0.25), {"cap": 8}),
    # 48 clients against a 2,048-token cache: preemptions, the KV cache.
    "kv_cache": (
        Scenario(
            SchedulerConfig(max_num_seqs=32, kv_cache_tokens=2048), 48, 64, 128, SECONDS, 0.25
        ),
        {"cap": 32},
    ),
    # 24 clients of 400-token prompts against a 64-token step budget: the token budget.
    "token_budget": (
        Scenario(
            SchedulerConfig(max_num_seqs=32, max_num_batched_tokens=64), 24, 400, 16, SECONDS, 0.25
        ),
        {"cap": 32, "token_budget": 64},
    ),
}
TRUTH = {"cap": "requests", "kv_cache": "kv_cache", "token_budget": "token_budget"}


def exporter_reading(scenario: Scenario, configured: dict):
    """The exporter's total over the scenario's last WINDOW seconds, and the truth's
    majority over the same scrapes."""
    result = run(scenario)
    window = [s for s in result.snapshots if s.t >= scenario.seconds - WINDOW]
    signals, _ = evaluate_target(
        "demo", "u", window, SignalSettings(**configured), {}, window[-1].t
    )
    return signals.total, result.truth_majority(window[0].t)


@pytest.mark.integration
@pytest.mark.parametrize("name", list(SCENARIOS))
def test_the_binding_limit_agrees_with_the_truth(name: str) -> None:
    scenario, configured = SCENARIOS[name]
    total, truth = exporter_reading(scenario, configured)
    assert truth == TRUTH[name]
    assert total.limits.binding == truth, (total.diagnosis, total.limits)


@pytest.mark.integration
def test_the_advised_token_budget_moves_the_binding_limit_off_it() -> None:
    scenario, configured = SCENARIOS["token_budget"]
    total, _ = exporter_reading(scenario, configured)
    assert total.diagnosis.state == "token_budget_bound"
    advised = total.advice.item("token_budget_for_cap")
    assert advised.value == 832  # 32 x (1 + 400 / 16), a multiple of 64
    budget = int(advised.value)
    config = SchedulerConfig(max_num_seqs=32, max_num_batched_tokens=budget)
    restarted = Scenario(config, 24, 400, 16, SECONDS, 0.25)
    after, truth = exporter_reading(restarted, {**configured, "token_budget": budget})
    assert truth != "token_budget" and after.limits.binding == truth
    assert after.diagnosis.state != "token_budget_bound"


@pytest.mark.integration
def test_the_demo_server_takes_the_budget_and_exposes_the_truth() -> None:
    args = build_parser().parse_args(["--max-num-batched-tokens", "64", "--max-num-seqs", "8"])
    assert args.max_num_batched_tokens == 64
    config = ServerConfig(device="cpu", max_num_seqs=8, max_num_batched_tokens=64)
    with serve(config) as url:
        body = {"prompt": "x" * 150, "max_tokens": 2, "ignore_eos": True}
        done = httpx.post(f"{url}/v1/completions", json=body, timeout=60)
        assert done.status_code == 200, done.text
        text = httpx.get(f"{url}/metrics", timeout=10).text
        # A cap past the budget would leave a decode row without its token: refused.
        refused = httpx.post(f"{url}/admin/config", json={"max_num_seqs": 100}, timeout=10)
        assert refused.status_code == 400, refused.text
        assert "must be at most max_num_batched_tokens (64)" in refused.json()["error"]["message"]
        assert (
            httpx.get(f"{url}/admin/config", timeout=10).json()["generation"]["max_num_seqs"] == 8
        )
    assert (
        'batchscope_demo_max_num_batched_tokens{engine="0",model_name="batchscope-demo"} 64.0'
        in text
    )
    steps = {
        limit: float(value)
        for limit, value in re.findall(
            r'batchscope_demo_binding_steps_total\{[^}]*limit="(\w+)"[^}]*\} (\S+)', text
        )
    }
    # A 150-byte prompt is 151 tokens (a start token first): its 150-token context over
    # 64, 64, then 22 with the first token; one decode more.
    assert steps["token_budget"] == 2 and steps["arrivals"] == 2
    assert (
        'vllm:num_requests_waiting_by_reason{engine="0",model_name="batchscope-demo",reason="deferred"} 0.0'
        in text
    )
    (credited,) = re.findall(r"vllm:iteration_tokens_total_sum\{[^}]*\} (\S+)", text)
    assert float(credited) == 151 + 2  # the whole prompt and the two generated tokens
