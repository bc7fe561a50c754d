"""The demo server's generation scheduler, in-process: slot arithmetic, preemption, EOS,
cancellation, the bounded queue, the request log, and the simulated device."""

from __future__ import annotations

import io
import json
import random
import subprocess
import sys
import threading
import time
from concurrent.futures import Future
from contextlib import redirect_stdout
from pathlib import Path

import pytest
import torch

from batchscope.demo_server.devices import (
    H200_DECODE_GRAPH_MS,
    h200_prefill_ms_per_token,
    interpolate_ms,
    select_device,
)
from batchscope.demo_server.generation.decoder import (
    BOS,
    EOS,
    KVCache,
    PrefillBatch,
    TinyDecoder,
    encode_prompt,
)
from batchscope.demo_server.generation.listeners import RequestLog, StepRecord
from batchscope.demo_server.generation.ragged import try_load
from batchscope.demo_server.generation.requests import CompletionResult, InvalidRequest
from batchscope.demo_server.generation.scheduler import Scheduler, SchedulerConfig
from batchscope.demo_server.queueing import QueueFull
from batchscope.exporter import static_util_cli
from batchscope.exporter.core.static_util import exact_static_utilization, static_utilization
from tests.support.paths import REPO

# The example of "Continuous Batching: Why Your GPU Waits for the Slowest Request":
# 67 of 128 slot-steps.
ARTICLE_TRACE = [3, 5, 8, 11, 4, 14, 6, 16]
PROMPT = encode_prompt("hello")


def make_scheduler(**config: object) -> Scheduler:
    return Scheduler(TinyDecoder(seed=0), select_device("cpu"), SchedulerConfig(**config), seed=0)


def run_trace(scheduler: Scheduler, lengths: list[int]) -> list[CompletionResult]:
    """Submit every request before the loop starts (all arrive at t=0), run them all."""
    handles = [scheduler.submit(PROMPT, n, ignore_eos=True) for n in lengths]
    scheduler.start()
    try:
        return [h.future.result(timeout=60) for h in handles]
    finally:
        scheduler.stop()


@pytest.mark.parametrize(
    ("lengths", "expected"), [(ARTICLE_TRACE, 0.5234375), ([1, 1, 2, 2, 3, 3, 4, 16], 0.25)]
)
@pytest.mark.integration
def test_static_slot_utilization_equals_the_articles_formula(
    lengths: list[int], expected: float
) -> None:
    scheduler = make_scheduler(batching="static", max_num_seqs=8)
    results = run_trace(scheduler, lengths)
    assert [r.output_tokens for r in results] == lengths
    stats = scheduler.stats()
    assert stats.steps == max(lengths)
    assert stats.useful_slot_steps == sum(lengths)
    assert stats.slot_utilization == expected == static_utilization(lengths)


@pytest.mark.integration
def test_static_groups_consecutive_requests_like_the_exact_formula() -> None:
    rng = random.Random(7)
    lengths = [rng.randint(1, 40) for _ in range(27)]  # three full groups and a partial one
    scheduler = make_scheduler(batching="static", max_num_seqs=8)
    run_trace(scheduler, lengths)
    stats = scheduler.stats()
    exact = exact_static_utilization(lengths, 8)
    assert stats.useful_slot_steps == exact.useful_slot_steps == sum(lengths)
    assert stats.slot_steps == exact.total_slot_steps
    assert stats.slot_utilization == exact.static_utilization
    assert stats.idle_slot_steps_while_waiting > 0  # finished requests held slots others wanted


@pytest.mark.integration
def test_stats_is_a_snapshot_that_later_steps_leave_alone() -> None:
    scheduler = make_scheduler(batching="continuous", max_num_seqs=2)
    first = scheduler.submit(PROMPT, 3, ignore_eos=True)
    assert scheduler.step_here() and scheduler.step_here()
    before = scheduler.stats()
    assert (before.steps, before.generation_tokens, before.running, before.waiting) == (2, 2, 1, 0)
    scheduler.submit(PROMPT, 2, ignore_eos=True)
    while scheduler.step_here():
        pass
    assert first.future.result(timeout=1).output_tokens == 3
    after = scheduler.stats()
    assert (after.steps, after.generation_tokens, after.finished) == (4, 5, 2)
    assert (before.steps, before.generation_tokens, before.finished) == (2, 2, 0)


@pytest.mark.integration
def test_continuous_keeps_every_slot_busy_while_requests_wait() -> None:
    rng = random.Random(3)
    lengths = [rng.randint(1, 40) for _ in range(40)]
    continuous = make_scheduler(batching="continuous", max_num_seqs=8)
    results = run_trace(continuous, lengths)
    assert [r.output_tokens for r in results] == lengths
    stats = continuous.stats()
    assert stats.idle_slot_steps_while_waiting == 0
    assert stats.useful_slot_steps == sum(lengths)
    # Full slots until the queue ran dry: at least sum/8 steps, and the tail no longer
    # than the longest request.
    assert sum(lengths) / 8 <= stats.steps < sum(lengths) / 8 + max(lengths)
    static = make_scheduler(batching="static", max_num_seqs=8)
    run_trace(static, lengths)
    assert static.stats().steps == exact_static_utilization(lengths, 8).total_slot_steps // 8
    assert stats.steps < static.stats().steps


@pytest.mark.integration
def test_full_kv_cache_preempts_and_every_request_still_completes() -> None:
    prompt_tokens = len(PROMPT)
    # Eight requests of 100 tokens need 8 * (6 + 100) tokens; the cache holds 200.
    scheduler = make_scheduler(batching="continuous", max_num_seqs=8, kv_cache_tokens=200)
    results = run_trace(scheduler, [100] * 8)
    stats = scheduler.stats()
    assert stats.preemptions > 0
    assert sum(r.preemptions for r in results) == stats.preemptions
    assert [r.output_tokens for r in results] == [100] * 8
    assert all(r.finish_reason == "length" for r in results)
    assert stats.generation_tokens == 800  # recompute re-reads, it does not re-generate
    assert stats.prompt_tokens_computed > 8 * (prompt_tokens + 1)  # ... but recomputes
    assert stats.kv_tokens_used == 0
    assert stats.idle_slot_steps_while_waiting > 0  # the cache, not the cap, limited the batch


@pytest.mark.integration
def test_ignore_eos_runs_exactly_max_tokens_and_eos_may_stop_early() -> None:
    scheduler = make_scheduler()
    with_eos = [scheduler.submit(PROMPT, 300) for _ in range(8)]
    ignoring = [scheduler.submit(PROMPT, 300, ignore_eos=True) for _ in range(8)]
    scheduler.start()
    try:
        stopped = [h.future.result(timeout=60) for h in with_eos]
        exact = [h.future.result(timeout=60) for h in ignoring]
    finally:
        scheduler.stop()
    assert [r.output_tokens for r in exact] == [300] * 8
    early = [r for r in stopped if r.finish_reason == "stop"]
    assert early, "seeded sampling draws EOS within 300 tokens for some request"
    for r in early:
        assert r.output[-1] == EOS
        assert r.output_tokens < 300
    assert all(r.output_tokens == 300 for r in stopped if r.finish_reason == "length")


@pytest.mark.integration
def test_cancel_frees_the_slot_for_the_next_request() -> None:
    # Stepped on this thread (no scheduler thread, no clock): the cancel lands after
    # exactly three steps of the long request, however fast the machine runs them.
    scheduler = make_scheduler(max_num_seqs=1)
    long = scheduler.submit(PROMPT, 1000, ignore_eos=True)
    queued = scheduler.submit(PROMPT, 5, ignore_eos=True)
    for _ in range(3):
        assert scheduler.step_here()
    assert scheduler.stats().running == 1 and scheduler.stats().waiting == 1
    scheduler.cancel(long.request_id)
    steps_after_cancel = 0
    while scheduler.step_here():
        steps_after_cancel += 1
        assert steps_after_cancel <= 10, "the queued request did not get the slot"
    cancelled = long.future.result(timeout=0)
    done = queued.future.result(timeout=0)
    assert cancelled.finish_reason == "abort"
    assert cancelled.output_tokens == 3
    assert done.output_tokens == 5
    # The cancel and the admission share a step: five steps make its five tokens, and a
    # sixth frees its slot.
    assert steps_after_cancel == 6
    assert scheduler.stats().running == 0


class LockProbe:
    """A scheduler listener, and a future callback, that note at each finished request
    whether another thread could take the scheduler's lock at that moment."""

    def __init__(self, **config: object) -> None:
        self.scheduler = Scheduler(
            TinyDecoder(seed=0),
            select_device("cpu"),
            SchedulerConfig(**config),
            seed=0,
            listeners=[self],
        )
        self.listener_saw_free: list[bool] = []
        self.callback_saw_free: list[bool] = []

    def lock_is_free(self) -> bool:
        taken: list[bool] = []

        def take() -> None:
            taken.append(self.scheduler._lock.acquire(blocking=False))
            if taken[0]:
                self.scheduler._lock.release()

        other = threading.Thread(target=take)
        other.start()
        other.join(10)
        return taken == [True]

    def on_step(self, step: StepRecord) -> None:
        """Steps are not probed."""

    def on_finished(self, result: CompletionResult) -> None:
        self.listener_saw_free.append(self.lock_is_free())

    def on_done(self, future: Future[CompletionResult]) -> None:
        self.callback_saw_free.append(self.lock_is_free())


@pytest.mark.integration
def test_a_cancelled_waiting_request_is_announced_with_the_lock_released() -> None:
    probe = LockProbe(max_num_seqs=1)
    scheduler = probe.scheduler
    scheduler.submit(PROMPT, 5, ignore_eos=True)
    waiting = scheduler.submit(PROMPT, 5, ignore_eos=True)
    waiting.future.add_done_callback(probe.on_done)
    assert scheduler.step_here()
    scheduler.cancel(waiting.request_id)
    assert scheduler.step_here()
    assert waiting.future.result(timeout=0).finish_reason == "abort"
    assert probe.listener_saw_free == [True]
    assert probe.callback_saw_free == [True]


@pytest.mark.integration
def test_requests_aborted_at_shutdown_are_announced_with_the_lock_released() -> None:
    probe = LockProbe(max_num_seqs=1)
    scheduler = probe.scheduler
    first_token = threading.Event()
    running = scheduler.submit(PROMPT, 1000, ignore_eos=True, on_token=lambda _: first_token.set())
    handles = [running, *(scheduler.submit(PROMPT, 5, ignore_eos=True) for _ in range(2))]
    for handle in handles:
        handle.future.add_done_callback(probe.on_done)
    scheduler.start()
    assert first_token.wait(30)
    scheduler.stop(drain=False, timeout=30)
    assert [h.future.result(timeout=0).finish_reason for h in handles] == ["abort"] * 3
    assert probe.listener_saw_free == [True] * 3
    assert probe.callback_saw_free == [True] * 3


@pytest.mark.integration
def test_full_queue_rejects_with_retry_after_and_holds_nothing_more() -> None:
    scheduler = make_scheduler(max_queue=3)
    for _ in range(3):
        scheduler.submit(PROMPT, 4)
    with pytest.raises(QueueFull) as error:
        scheduler.submit(PROMPT, 4)
    assert error.value.retry_after_seconds >= 1
    assert scheduler.stats().waiting == 3
    scheduler.stop(drain=False)


@pytest.mark.parametrize(
    ("prompt", "max_tokens", "kv", "param"),
    [
        ([], 4, 65536, "prompt"),
        (PROMPT * 200, 1, 65536, "prompt"),
        (PROMPT, 0, 65536, "max_tokens"),
        (PROMPT, 1024, 65536, "max_tokens"),
        (PROMPT, 100, 50, "max_tokens"),
    ],
)
@pytest.mark.integration
def test_impossible_request_is_refused_naming_the_field(
    prompt: list[int], max_tokens: int, kv: int, param: str
) -> None:
    scheduler = make_scheduler(kv_cache_tokens=kv)
    with pytest.raises(InvalidRequest) as error:
        scheduler.submit(prompt, max_tokens)
    assert error.value.param == param
    assert scheduler.stats().waiting == 0


@pytest.mark.integration
def test_max_num_seqs_changes_at_run_time() -> None:
    scheduler = make_scheduler(max_num_seqs=8)
    scheduler.configure(max_num_seqs=2)
    run_trace(scheduler, [10] * 8)
    stats = scheduler.stats()
    assert stats.max_num_seqs == 2
    assert stats.steps == 40  # 8 requests of 10 tokens, two at a time
    assert stats.slot_utilization == 1.0


@pytest.mark.integration
def test_request_log_is_read_by_batchscope_static_util(tmp_path: Path) -> None:
    path = tmp_path / "requests.jsonl"
    log = RequestLog(path)
    scheduler = Scheduler(
        TinyDecoder(seed=0),
        select_device("cpu"),
        SchedulerConfig(batching="static", max_num_seqs=8),
        listeners=[log],
    )
    run_trace(scheduler, ARTICLE_TRACE)
    log.close()
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert sorted(r["output_tokens"] for r in records) == sorted(ARTICLE_TRACE)
    for record in records:
        assert record["prompt_tokens"] == len(PROMPT)
        assert record["finish_reason"] == "length"
        assert 0 <= record["queue_time"] <= record["latency"]
    out = io.StringIO()
    with redirect_stdout(out):
        assert static_util_cli.main([str(path), "-b", "8", "--json"]) == 0
    assert json.loads(out.getvalue())["static_utilization"] == 0.5234375


def decoder(seed: int, attention: str) -> TinyDecoder:
    """The tiny decoder with ragged (the C kernel) or padded decode attention."""
    model = TinyDecoder(seed=seed).eval()
    if attention == "ragged":
        kernel, why = try_load()
        assert kernel is not None, why
        model.ragged = kernel
    return model


@pytest.mark.integration
@pytest.mark.parametrize("attention", ["ragged", "padded"])
def test_cached_decode_matches_recomputing_the_sequence(attention: str) -> None:
    """Prefill plus one decode step gives the logits that decoding every token does,
    including after a row's cache moved to another slot."""
    model = decoder(1, attention)
    tokens = encode_prompt("batching")
    with torch.inference_mode():
        stepwise = KVCache(model.config, 2, torch.device("cpu"))
        for position, token in enumerate(tokens):
            logits = model.decode(
                torch.tensor([0, token]), torch.tensor([0, position]), position + 1, stepwise
            )
        cached = KVCache(model.config, 2, torch.device("cpu"))
        model.prefill(torch.tensor(tokens[:-1]), 1, cached)
        cached.move(1, 0, len(tokens) - 1)
        last = len(tokens) - 1
        moved = model.decode(torch.tensor([tokens[-1]]), torch.tensor([last]), last + 1, cached)
    assert torch.allclose(logits[1], moved[0], atol=1e-5)


@pytest.mark.integration
@pytest.mark.parametrize("attention", ["ragged", "padded"])
def test_prefill_in_the_decode_forward_matches_prefilling_first(attention: str) -> None:
    """Contexts of different lengths prefilled in the decode step's own forward (padded to
    the longest, or one flat token batch when ragged) give the logits and cache that a
    separate prefill per context does."""
    model = decoder(2, attention)
    sequences = [encode_prompt("a longer running row"), encode_prompt("hi"), [BOS, 7]]
    sequences += [encode_prompt("another admitted request")]
    slots = [1, 2, 3]
    with torch.inference_mode():
        separate = KVCache(model.config, 4, torch.device("cpu"))
        fused = KVCache(model.config, 4, torch.device("cpu"))
        running = sequences[0]
        for cache in (separate, fused):  # row 0 runs already: its context is cached
            model.prefill(torch.tensor(running[:-1]), 0, cache)
        for slot in slots:
            model.prefill(torch.tensor(sequences[slot][:-1]), slot, separate)
        tokens = torch.tensor([s[-1] for s in sequences])
        positions = torch.tensor([len(s) - 1 for s in sequences])
        span = int(positions.max()) + 1
        expected = model.decode(tokens, positions, span, separate)
        batch = PrefillBatch.of([sequences[s][:-1] for s in slots], slots, torch.device("cpu"))
        assert batch.token_count == sum(len(sequences[s]) - 1 for s in slots)
        got = model.decode(tokens, positions, span, fused, prefill=batch)
    assert torch.allclose(got, expected, atol=1e-5)
    for layer in range(model.config.n_layers):
        for slot, sequence in enumerate(sequences):
            written = len(sequence)
            assert torch.allclose(
                fused.keys[layer][slot, :, :written],
                separate.keys[layer][slot, :, :written],
                atol=1e-5,
            )


@pytest.mark.integration
def test_ragged_and_padded_attention_give_the_same_logits_with_mixed_lengths() -> None:
    """Rows at very different positions, one step: the kernel reads each row's own length,
    padded attention masks to it; the logits agree."""
    ragged_model, padded_model = decoder(3, "ragged"), decoder(3, "padded")
    sequences = [encode_prompt("x" * n) for n in (1, 40, 7, 300)]
    logits = []
    with torch.inference_mode():
        for model in (ragged_model, padded_model):
            cache = KVCache(model.config, 4, torch.device("cpu"))
            for slot, sequence in enumerate(sequences):
                model.prefill(torch.tensor(sequence[:-1]), slot, cache)
            positions = torch.tensor([len(s) - 1 for s in sequences])
            tokens = torch.tensor([s[-1] for s in sequences])
            logits.append(model.decode(tokens, positions, int(positions.max()) + 1, cache))
    assert (logits[0] - logits[1]).abs().max().item() < 1e-4


@pytest.mark.integration
@pytest.mark.parametrize("batching", ["static", "continuous"])
def test_attention_lengths_static_rows_pad_to_the_group_continuous_rows_read_their_own(
    monkeypatch: pytest.MonkeyPatch, batching: str
) -> None:
    """A static group's finished row stays a padded row: it attends as far as the group's
    longest, so a group's steps cost what a padded batch's do. Continuous rows read their
    own length only."""
    seen: list[tuple[list[int], list[int]]] = []
    decode = TinyDecoder.decode

    def recording(self, tokens, positions, span, cache, prefill=None, lengths=None):
        seen.append((positions.tolist(), lengths.tolist()))
        return decode(self, tokens, positions, span, cache, prefill, lengths)

    monkeypatch.setattr(TinyDecoder, "decode", recording)
    scheduler = make_scheduler(batching=batching, max_num_seqs=2)
    assert scheduler.attention == "ragged"
    run_trace(scheduler, [2, 5])
    assert len(seen) == 5  # one group (static) or both rows from step 1 (continuous)
    for step, (positions, lengths) in enumerate(seen):
        own = [p + 1 for p in positions]
        if batching == "static" and step >= 2:  # the 2-token request has finished
            assert lengths == [max(own), max(own)]
            if step >= 3:  # its position stopped; it reads past it, as a padded row does
                assert lengths[0] > own[0]
        elif batching == "static":
            assert lengths == own
        else:
            assert lengths == own and len(lengths) == (2 if step < 2 else 1)


def test_simulated_prefill_tokens_cost_compute_not_a_decode_row() -> None:
    """A decode row on the anchor curve is mostly its KV-cache read (about 16 us each past
    64 rows); a prefill token is priced at the compute rate the anchor's encoder reached
    (about 296 TFLOP/s) times 2 FLOPs per decoder parameter: about 6.4 us."""
    assert h200_prefill_ms_per_token() == pytest.approx(0.00643, abs=5e-5)
    device = select_device("sim:h200")
    assert device.decode_step_ms(32, 0) == pytest.approx(1.4530, abs=1e-4)
    assert device.decode_step_ms(32, 1000) == pytest.approx(1.4530 + 6.43, abs=0.05)
    slope_per_row = (H200_DECODE_GRAPH_MS[-1][1] - H200_DECODE_GRAPH_MS[-2][1]) / 128
    assert 2 * device.prefill_ms_per_token < slope_per_row


def test_simulated_h200_paces_each_step_to_the_measured_curve() -> None:
    assert interpolate_ms(H200_DECODE_GRAPH_MS, 1) == pytest.approx(0.9355, abs=1e-4)
    assert interpolate_ms(H200_DECODE_GRAPH_MS, 32) == pytest.approx(1.4530, abs=1e-4)
    midpoint = (H200_DECODE_GRAPH_MS[1][1] + H200_DECODE_GRAPH_MS[2][1]) / 2
    assert interpolate_ms(H200_DECODE_GRAPH_MS, 20) == pytest.approx(midpoint)
    assert interpolate_ms(H200_DECODE_GRAPH_MS, 512) > interpolate_ms(H200_DECODE_GRAPH_MS, 256)
    device = select_device("sim:h200")
    assert device.simulated and device.describe()["simulated"] is True
    waits = []
    for _ in range(20):
        started = time.perf_counter()
        device.pace("decode", 32, started)
        waits.append(time.perf_counter() - started)
    assert min(waits) >= 1.453e-3
    device.pace("encoder", 1, started - 1.0)  # real compute took a second: an overrun
    assert device.overruns == {"decode": 0, "encoder": 1}
    assert not select_device("cpu").simulated


def test_a_slowed_simulated_device_costs_n_times_the_h200_in_decode_and_prefill() -> None:
    h200, slowed = select_device("sim:h200"), select_device("sim:h200", slowdown=10)
    assert slowed.decode_step_ms(1, 0) == pytest.approx(10 * h200.decode_step_ms(1, 0))
    assert slowed.decode_step_ms(32, 1000) == pytest.approx(10 * (1.4530 + 6.43), abs=0.5)
    assert slowed.simulated_ms("encoder", 8) == pytest.approx(10 * 2.0805, abs=1e-3)
    assert slowed.describe()["simulated_slowdown"] == 10
    assert "simulated_slowdown" not in select_device("cpu").describe()
    started = time.perf_counter()
    slowed.pace("decode", 1, started)
    assert time.perf_counter() - started >= 9.35e-3


@pytest.mark.parametrize(
    ("spec", "slowdown", "said"),
    [
        ("sim:h200", 0.5, "at least 1"),
        ("sim:h200", float("nan"), "at least 1"),
        ("cpu", 3, "simulated"),
    ],
)
def test_a_slowdown_below_one_or_off_a_simulated_device_is_refused(
    spec: str, slowdown: float, said: str
) -> None:
    with pytest.raises(ValueError, match=said):
        select_device(spec, slowdown)


@pytest.mark.integration
def test_longest_request_never_feeds_the_last_cache_position(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """CUDA graphs pad with, and capture over, position max_model_len - 1: no live request
    may write or read it."""
    fed: list[int] = []
    decode = TinyDecoder.decode

    def recording(self, tokens, positions, span, cache, prefill=None, lengths=None):
        fed.append(int(positions.max()))
        return decode(self, tokens, positions, span, cache, prefill, lengths)

    monkeypatch.setattr(TinyDecoder, "decode", recording)
    scheduler = make_scheduler()
    limit = scheduler.max_model_len
    (result,) = run_trace(scheduler, [limit - len(PROMPT)])
    assert result.output_tokens == limit - len(PROMPT)
    assert max(fed) == limit - 2


@pytest.mark.integration
def test_batching_bench_writes_its_report(tmp_path: Path) -> None:
    """A tiny run of scripts/bench_batching.py: one row per device, prediction from the trace.
    Speeds on a shared machine are not asserted."""
    report = tmp_path / "bench.md"
    done = subprocess.run(
        [
            sys.executable,
            "scripts/bench_batching.py",
            "--requests",
            "24",
            "--repeat",
            "1",
            "--slots",
            "8",
            "--devices",
            "cpu",
            "sim:h200",
            "--output",
            str(report),
            "--report-only",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    rows = [line for line in report.read_text().splitlines() if line.startswith("| cpu |")]
    rows += [line for line in report.read_text().splitlines() if line.startswith("| sim:h200 |")]
    assert len(rows) == 2
    for row in rows:
        cells = [c.strip() for c in row.split("|")]
        assert cells[2] == "8"
        assert float(cells[4].rstrip("x")) == pytest.approx(1 / float(cells[3]), abs=2e-3)


@pytest.mark.integration
def test_a_failing_token_consumer_ends_only_its_own_request() -> None:
    def broken(token: int) -> None:
        raise RuntimeError("event loop is closed")

    scheduler = make_scheduler()
    failing = scheduler.submit(PROMPT, 50, ignore_eos=True, on_token=broken)
    healthy = scheduler.submit(PROMPT, 50, ignore_eos=True, on_token=lambda token: None)
    scheduler.start()
    try:
        assert failing.future.result(timeout=30).finish_reason == "abort"
        assert healthy.future.result(timeout=30).output_tokens == 50
    finally:
        scheduler.stop()


class BrokenListener:
    """A listener whose every call raises, beside one that counts what it was told."""

    def on_step(self, step: StepRecord) -> None:
        raise RuntimeError("broken listener: on_step")

    def on_finished(self, result: CompletionResult) -> None:
        raise RuntimeError("broken listener: on_finished")


class CountingListener:
    def __init__(self) -> None:
        self.steps = 0
        self.finished = 0

    def on_step(self, step: StepRecord) -> None:
        self.steps += 1

    def on_finished(self, result: CompletionResult) -> None:
        self.finished += 1


@pytest.mark.integration
def test_a_listener_that_raises_leaves_no_request_unresolved_and_no_listener_untold() -> None:
    counting = CountingListener()
    scheduler = Scheduler(
        TinyDecoder(seed=0),
        select_device("cpu"),
        SchedulerConfig(max_num_seqs=4),
        seed=0,
        listeners=[BrokenListener(), counting],
    )
    # Three requests that finish in the same step: one announcement of three.
    handles = [scheduler.submit(PROMPT, 2, ignore_eos=True) for _ in range(3)]
    while scheduler.step_here():
        pass
    results = [h.future.result(timeout=0) for h in handles]
    assert [r.output_tokens for r in results] == [2, 2, 2]
    assert (counting.steps, counting.finished) == (2, 3)
