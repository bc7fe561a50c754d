"""`make demo`'s phases, without running the demo: what each phase must show, read from the
exporter's signals (`tests.support.demo_phases`), and a load generator that stops before
its phase ends, said in the demo's printout and kept with its phase by the walk."""

from __future__ import annotations

import sys

import pytest

from tests.support.demo_phases import DEMO, EMBEDDINGS, LLM, LOAD_STOPPED, SHOWS
from tests.support.demo_walk import stopped_loads


def target(state: str, **numbers) -> dict:
    """One target's body in /api/v1/signals, its total in `state` with these numbers."""
    return {"total": {"diagnosis": {"state": state, "reason": ""}, **numbers}}


def test_heavy_shows_only_with_the_llm_at_its_cap_with_a_queue_and_large_batches() -> None:
    at_cap = target("healthy", running=8.0, cap=8.0, running_vs_cap=1.0, waiting=3.0)
    batching = target("batch_limited", mean_batch_size=13.5, budget_utilization=0.74)
    assert SHOWS["heavy"].check({LLM: at_cap, EMBEDDINGS: batching}) == []

    below = target("healthy", running=6.0, cap=8.0, running_vs_cap=0.75, waiting=0.0)
    small = target("underloaded", mean_batch_size=2.0, budget_utilization=0.3)
    assert SHOWS["heavy"].check({LLM: below, EMBEDDINGS: small}) == [
        f"{LLM} runs 6 of 8 with 0 waiting, not at its cap with a queue",
        f"{EMBEDDINGS} batches average 2.0 at 0.30 of its budget, not 8 or more within it",
    ]
    late = target("over_budget", mean_batch_size=20.0, budget_utilization=1.4)
    assert SHOWS["heavy"].check({LLM: at_cap, EMBEDDINGS: late}) == [
        f"{EMBEDDINGS} batches average 20.0 at 1.40 of its budget, not 8 or more within it"
    ]


def test_long_answers_show_only_with_the_kv_cache_binding_and_static_waste() -> None:
    def llm(state: str, binding: str, static: float) -> dict:
        return target(state, limits={"binding": binding}, static_utilization={"estimate": static})

    assert SHOWS["long answers"].check({LLM: llm("memory_bound", "kv_cache", 0.56)}) == []
    assert SHOWS["long answers"].check({LLM: llm("preempting", "kv_cache", 0.6)}) == []
    assert SHOWS["long answers"].check({LLM: llm("healthy", "requests", 0.9)}) == [
        f"{LLM} reads healthy, not memory_bound/preempting",
        f"{LLM}'s binding limit is requests, not kv_cache",
        f"static batching would use 0.90 of {LLM}'s slots, not at most 0.75",
    ]


def test_light_and_overload_read_their_states_and_the_page_its_chip_and_banner() -> None:
    quiet = {LLM: target("underloaded"), EMBEDDINGS: target("underloaded")}
    assert SHOWS["light"].check(quiet) == []
    assert SHOWS["light"].check({**quiet, EMBEDDINGS: target("idle")}) == [
        f"{EMBEDDINGS} reads idle, not underloaded"
    ]
    saturated = target("budget_saturated", budget_saturated=True, budget_utilization=1.8)
    assert SHOWS["overload"].check({LLM: saturated}) == []
    assert SHOWS["overload"].check({LLM: target("preempting", budget_utilization=0.99)}) == [
        f"{LLM} reads preempting at 0.99 of its budget, not saturated"
    ]
    banner = f"Budget saturated: {LLM} for 31 s, 180% of its budget"
    assert SHOWS["overload"].page_unmet("budget saturated", banner) == []
    assert SHOWS["overload"].page_unmet("preempting", "no banner") == [
        "the page's chip reads 'preempting', not budget saturated",
        f"no 'Budget saturated: {LLM}' banner on the page",
    ]


def test_the_walk_keeps_each_stopped_load_with_its_phase() -> None:
    stopped = f"{LOAD_STOPPED}: the completions load of phase heavy exited after 9 s of 30 s"
    log = [
        "demo: dashboard ready at http://127.0.0.1:8501",
        "demo: phase light: 5 completions/s of 128 tokens, 0.5 embeddings/s (1 a request), 20 s",
        "  demo-llm | underloaded",
        "demo: phase heavy: 40 completions/s of 32 tokens, 60 embeddings/s, 30 s",
        stopped,
        "    rate 40/s: over-saturated",
        "demo: phase long answers: 6 completions/s of 768 tokens, 10 embeddings/s, 22.5 s",
    ]
    assert stopped_loads(log, 4) == [[], [stopped], [], []]


@pytest.mark.integration
def test_a_load_generator_that_exits_before_its_phase_ends_is_said_once(tmp_path, capsys) -> None:
    log = tmp_path / "02-heavy-completions.log"
    exits = "print('rate 40/s: over-saturated'); raise SystemExit(3)"
    load = DEMO.Load("completions", DEMO.spawn(log, sys.executable, "-c", exits), log)
    load.proc.wait(timeout=30)
    heavy = DEMO.PHASES[1]
    DEMO.report_stopped([load], heavy, ran=12.4, total=30)
    DEMO.report_stopped([load], heavy, ran=17.4, total=30)
    printed = capsys.readouterr().out.splitlines()
    assert printed == [
        f"{LOAD_STOPPED}: the completions load of phase heavy exited after 12 s of 30 s "
        f"(exit status 3), so the phase runs on without it; the end of {log}:",
        "    rate 40/s: over-saturated",
    ]


@pytest.mark.integration
def test_a_load_generator_still_running_is_not_said(tmp_path, capsys) -> None:
    log = tmp_path / "01-light-embeddings.log"
    proc = DEMO.spawn(log, sys.executable, "-c", "import time; time.sleep(30)")
    try:
        DEMO.report_stopped([DEMO.Load("embeddings", proc, log)], DEMO.PHASES[0], 5, 15)
        assert capsys.readouterr().out == ""
    finally:
        proc.kill()
        proc.wait()
