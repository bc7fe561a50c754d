"""The exporter's garbage-collection policy (exporter/scrape/gc_policy.py), in a fresh process:
it changes the whole process's collector, which the test process must keep as it is."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.support.paths import REPO

ROOT = REPO

SCRIPT = """
import asyncio, gc, weakref
from exporter.scrape import gc_policy

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
young = gc.get_count()[0]
churn = [[i] for i in range(20 * gc_policy.YOUNG_THRESHOLD)]  # young and middle ones run
print("young collections ran", gc.get_count()[0] < young + len(churn))
del churn
print("alive after young and middle collections", cycle() is not None)

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
def test_policy_defers_full_collections_to_its_own_schedule_and_still_frees_old_cycles():
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
    assert lines[0].startswith("thresholds (20000, 20, 1000000000) replaced")
    assert lines[1:] == [
        "frozen at start True",
        "young collections ran True",
        "alive after young and middle collections True",
        "freed by the periodic full collection True",
    ]
