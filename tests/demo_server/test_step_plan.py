"""The scheduler's step decisions (`plan_step`) without torch: preemption and admission
by vLLM's rules, with every number worked by hand."""

from __future__ import annotations

import subprocess
import sys

import pytest

from batchscope.demo_server.generation.step_plan import Row, StepLimits, Waiting, plan_step

LIMITS = StepLimits(max_num_seqs=4, kv_cache_tokens=100)


@pytest.mark.integration
def test_torch_is_not_needed_to_plan_a_step() -> None:
    probe = "import sys, batchscope.demo_server.generation.step_plan; print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"


def test_requests_are_admitted_in_order_while_slots_and_cache_allow() -> None:
    # 2 running rows hold 30 + 20 positions and write one more each: 52 of 100 used.
    rows = [Row("a", 1, 30, 30), Row("b", 2, 20, 20)]
    waiting = [Waiting("c", 20), Waiting("d", 20), Waiting("e", 5)]
    plan = plan_step(rows, waiting, LIMITS)
    # c: 52 + 20 = 72 fits, d: 92 fits; a, b, c and d fill the 4 slots, e waits.
    assert plan == plan_step(rows, iter(waiting), LIMITS)  # any iterable, read in order
    assert plan.preempt == () and plan.admit == ("c", "d") and plan.requests_wait


def test_the_first_request_that_does_not_fit_stops_admission() -> None:
    rows = [Row("a", 1, 60, 60)]
    # 61 used; b needs 40 (101 > 100): it waits, and e (5) does not overtake it.
    plan = plan_step(rows, [Waiting("b", 40), Waiting("e", 5)], LIMITS)
    assert plan.admit == () and plan.requests_wait


def test_the_last_admitted_is_preempted_until_the_running_rows_fit() -> None:
    # 3 rows hold 40 + 35 + 24 = 99 and need 3 more: 102 > 100. The last admitted (c,
    # admission 3) goes; 75 + 2 = 77 fits, and c (its 24 tokens) comes back first in line,
    # where it fits again: 77 + 24 = 101 > 100, so it waits, ahead of d.
    rows = [Row("a", 1, 40, 40), Row("b", 2, 35, 35), Row("c", 3, 24, 24)]
    plan = plan_step(rows, [Waiting("d", 1)], LIMITS)
    assert plan.preempt == ("c",)
    assert plan.admit == () and plan.requests_wait


def test_preemption_goes_newest_first_and_stops_at_one_row() -> None:
    # Admission order b(5), a(7), c(9): c then a go; b alone always stays.
    rows = [Row("a", 7, 50, 50), Row("b", 5, 60, 60), Row("c", 9, 45, 45)]
    plan = plan_step(rows, [], StepLimits(max_num_seqs=4, kv_cache_tokens=50))
    assert plan.preempt == ("c", "a")
    assert plan.admit == () and plan.requests_wait


def test_finished_rows_hold_their_slots_but_write_nothing() -> None:
    # A finished row keeps its slot until the step frees it (its cache is freed when it
    # finishes: 0 positions). A static group forms only once the old one has left.
    rows = [Row("a", 1, 30, 30), Row("b", 2, 0, 30, active=False)]
    static = StepLimits(max_num_seqs=4, kv_cache_tokens=100, static=True)
    assert plan_step(rows, [Waiting("c", 5)], static).admit == ()
    assert plan_step([], [Waiting("c", 5), Waiting("d", 5)], static).admit == ("c", "d")
    # Continuous: 31 used (a's 30 and its next position; b writes nothing): 69 more fit.
    assert plan_step(rows, [Waiting("c", 69)], LIMITS).admit == ("c",)
    assert plan_step(rows, [Waiting("c", 70)], LIMITS).admit == ()
    # Slots: a and b hold two of the four.
    three = [Waiting("c", 1), Waiting("d", 1), Waiting("e", 1)]
    assert plan_step(rows, three, LIMITS).admit == ("c", "d")


# ----------------------------------------------------------------- the per-step token budget

BUDGET = StepLimits(max_num_seqs=4, kv_cache_tokens=1000, token_budget=16)


def test_decodes_take_one_token_each_then_prefills_their_chunks_oldest_first() -> None:
    # a decodes (1 token); b needs 21 more tokens to produce its first (20 of context and
    # the token), c 6: 15 left after a, b (older) takes all 15, c gets none; nothing is
    # admitted.
    rows = [
        Row("a", 1, 30, 31),
        Row("c", 3, 10, 16, pending_prefill=6),
        Row("b", 2, 40, 41, pending_prefill=21),
    ]
    plan = plan_step(rows, [Waiting("d", 5)], BUDGET)
    assert plan.chunks == (("b", 15), ("c", 0))
    assert plan.admit == () and plan.requests_wait and plan.stopped_by == "token_budget"


def test_requests_are_admitted_while_a_token_of_the_budget_is_left() -> None:
    # 2 decodes leave 14: d takes its 5 (context 4 and its first token), e takes the other
    # 9 of its 40 (a chunk), and f waits for the budget though a slot is free.
    rows = [Row("a", 1, 30, 31), Row("b", 2, 30, 31)]
    roomy = StepLimits(max_num_seqs=8, kv_cache_tokens=1000, token_budget=16)
    plan = plan_step(rows, [Waiting("d", 5), Waiting("e", 40), Waiting("f", 3)], roomy)
    assert plan.admit == ("d", "e")
    assert plan.chunks == (("d", 5), ("e", 9))
    assert plan.stopped_by == "token_budget"


def test_a_static_group_is_admitted_whole_and_its_prefills_chunked() -> None:
    static = StepLimits(max_num_seqs=4, kv_cache_tokens=1000, static=True, token_budget=16)
    waiting = [Waiting(f"w{i}", 10) for i in range(5)]
    plan = plan_step([], waiting, static)
    assert plan.admit == ("w0", "w1", "w2", "w3")
    assert plan.chunks == (("w0", 10), ("w1", 6), ("w2", 0), ("w3", 0))
    assert plan.stopped_by == "requests"


def test_without_a_budget_no_chunks_and_the_stop_names_slots_or_memory() -> None:
    full = [Row(str(i), i, 10, 10) for i in range(4)]
    plan = plan_step(full, [Waiting("x", 5)], LIMITS)
    assert (plan.chunks, plan.stopped_by) == ((), "requests")
    plan = plan_step([Row("a", 1, 60, 60)], [Waiting("b", 40)], LIMITS)
    assert plan.stopped_by == "kv_cache"
    plan = plan_step([Row("a", 1, 60, 60)], [Waiting("b", 4)], LIMITS)
    assert (plan.admit, plan.requests_wait, plan.stopped_by) == (("b",), False, None)
