"""The exporter's garbage-collection policy (exporter/scrape/gc_policy.py), in a fresh process:
it changes the whole process's collector, which the test process must keep as it is."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from types import SimpleNamespace

import pytest

from batchscope.exporter.scrape import gc_policy
from tests.support.paths import REPO
from tests.support.virtual_time import loop_clock, run_virtual

ROOT = REPO

SCRIPT = """
import asyncio, gc, weakref
from batchscope.exporter.scrape import gc_policy

class Node:
    pass

def old_cycle():
    # A reference cycle that reaches the oldest generation before it becomes garbage.
    a, b = Node(), Node()
    a.other, b.other = b, a
    gc.collect(1)
    gc.collect(1)
    return weakref.ref(a)

before = gc_policy.configure()
print("thresholds", gc.get_threshold(), "replaced", before)
print("frozen at start", gc.get_freeze_count() > 1000)
cycle = old_cycle()
before = [generation["collections"] for generation in gc.get_stats()]
# Ten times what the policy's old young threshold (20,000) let through, kept alive.
churn = [[i] for i in range(200_000)]
print("no automatic collection", [g["collections"] for g in gc.get_stats()] == before)
del churn
print("alive without a full collection", cycle() is not None)

async def main():
    stop = asyncio.Event()
    task = asyncio.create_task(gc_policy.full_collections(stop, every=0.05))
    await asyncio.sleep(0.3)
    stop.set()
    await task

asyncio.run(main())
print("freed by the periodic full collection", cycle() is None)
"""


@pytest.mark.skipif(
    sys.version_info >= (3, 14), reason="3.14's collector is incremental: no generations to test"
)
def test_policy_makes_no_automatic_collection_and_its_full_ones_still_free_old_cycles():
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PYTHONPATH": str(ROOT), "PATH": ""},
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("thresholds (1000000000, 1000000000, 1000000000) replaced")
    assert lines[1:] == [
        "frozen at start True",
        "no automatic collection True",
        "alive without a full collection True",
        "freed by the periodic full collection True",
    ]


def test_a_full_collection_waits_for_the_next_metrics_answer_at_most_one_period(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def scenario() -> list[float]:
        clock = loop_clock()
        stop, answered = asyncio.Event(), asyncio.Event()
        times: list[float] = []
        monkeypatch.setattr(
            gc_policy, "gc", SimpleNamespace(collect=lambda: times.append(clock()) or 0)
        )
        task = asyncio.create_task(gc_policy.full_collections(stop, 300.0, answered))
        for at in (100.0, 250.0, 320.0, 700.0):  # /metrics answers
            await asyncio.sleep(at - clock())
            answered.set()
        await asyncio.sleep(1400.0 - clock())
        stop.set()
        await task
        return times

    after = gc_policy.AFTER_ANSWER_SECONDS
    # due at 300: the answer at 320; due at 620: the one at 700; due at 1000: none comes,
    # so at 1300, one period later
    assert run_virtual(scenario()) == pytest.approx([320 + after, 700 + after, 1300 + 2 * after])
