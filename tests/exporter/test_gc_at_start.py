"""The collector as the exporter sets it once started (`cli.tune_collector`)."""

from __future__ import annotations

import gc
import weakref

from batchscope.exporter.cli import tune_collector


class Node:
    pass


def _unreachable_cycle() -> weakref.ref:
    a, b = Node(), Node()
    a.other, b.other = b, a
    return weakref.ref(a)


def test_start_up_is_frozen_and_a_young_collection_waits_for_50_000_containers() -> None:
    thresholds = gc.get_threshold()
    try:
        tune_collector()
        assert gc.get_freeze_count() > 1000  # the modules loaded so far
        young = gc.get_stats()[0]["collections"]
        cycle = _unreachable_cycle()
        kept = [[i] for i in range(45_000)]
        assert gc.get_stats()[0]["collections"] == young  # CPython's default: 64 of them
        assert cycle() is not None
        kept += [[i] for i in range(10_000)]
        assert gc.get_stats()[0]["collections"] == young + 1
        assert cycle() is None  # a cycle is still freed, by the automatic collection
        del kept
    finally:
        gc.unfreeze()
        gc.set_threshold(*thresholds)
