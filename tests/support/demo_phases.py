"""What each of `make demo`'s phases must show, checked on the exporter's signals and on
the state chip of the Live page: the phase's name, made visible.

- light: both services underloaded;
- heavy: the LLM running at its cap (at least 7 of 8) with requests waiting, and the
  embeddings batcher in batches of 8 or more with its latency within its budget;
- long answers: the LLM memory-bound or preempting, the KV cache the binding limit, and
  static batching would waste at least a quarter of its slots on these lengths;
- overload: the LLM's latency budget saturated, its banner on the page.

Each check returns what it found unmet, with the numbers it read: an empty list is a
phase that shows its name. The demo's own names (its targets, its phases, the line a load
generator that stopped early prints) come from `scripts/demo.py`.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from dataclasses import dataclass

from batchscope.dashboard.states import look
from tests.support.paths import REPO


def _demo_script():
    """scripts/demo.py as a module (a script, not in the package)."""
    name = "batchscope_demo_script"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / "demo.py")
        assert spec is not None and spec.loader is not None
        sys.modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[name])
    return sys.modules[name]


DEMO = _demo_script()
LLM = DEMO.LLM_TARGET
EMBEDDINGS = DEMO.EMBEDDINGS_TARGET
LOAD_STOPPED = DEMO.LOAD_STOPPED
PHASE_NAMES = tuple(phase.name for phase in DEMO.PHASES)

# Heavy: the LLM at or near its cap of 8, the embeddings in batches of at least a quarter
# of their max of 32.
AT_CAP = 7 / 8
LARGE_BATCH = 8
# Long answers: static batching would use at most this share of its slots.
STATIC_WASTE_SHOWN = 0.75
BANNER = "Budget saturated: "

Targets = dict[str, dict]


def _total(targets: Targets, name: str) -> dict:
    return (targets.get(name) or {}).get("total") or {}


def _state(total: dict) -> str:
    return (total.get("diagnosis") or {}).get("state", "")


def _number(value: float | None, spec: str = ".2f") -> str:
    return "-" if value is None else format(value, spec)


def _in_state(targets: Targets, name: str, states: tuple[str, ...]) -> list[str]:
    state = _state(_total(targets, name))
    return [] if state in states else [f"{name} reads {state or 'nothing'}, not {'/'.join(states)}"]


def light(targets: Targets) -> list[str]:
    return _in_state(targets, LLM, ("underloaded",)) + _in_state(
        targets, EMBEDDINGS, ("underloaded",)
    )


def heavy(targets: Targets) -> list[str]:
    llm, embeddings = _total(targets, LLM), _total(targets, EMBEDDINGS)
    unmet = []
    if not ((llm.get("running_vs_cap") or 0) >= AT_CAP and (llm.get("waiting") or 0) >= 1):
        unmet.append(
            f"{LLM} runs {_number(llm.get('running'), '.0f')} of {_number(llm.get('cap'), '.0f')} "
            f"with {_number(llm.get('waiting'), '.0f')} waiting, not at its cap with a queue"
        )
    batch, used = embeddings.get("mean_batch_size"), embeddings.get("budget_utilization")
    if not ((batch or 0) >= LARGE_BATCH and used is not None and used <= 1):
        unmet.append(
            f"{EMBEDDINGS} batches average {_number(batch, '.1f')} at {_number(used)} of its "
            f"budget, not {LARGE_BATCH} or more within it"
        )
    return unmet


def long_answers(targets: Targets) -> list[str]:
    llm = _total(targets, LLM)
    unmet = _in_state(targets, LLM, ("memory_bound", "preempting"))
    binding = (llm.get("limits") or {}).get("binding")
    if binding != "kv_cache":
        unmet.append(f"{LLM}'s binding limit is {binding}, not kv_cache")
    static = (llm.get("static_utilization") or {}).get("estimate")
    if static is None or static > STATIC_WASTE_SHOWN:
        unmet.append(
            f"static batching would use {_number(static)} of {LLM}'s slots, not at most "
            f"{STATIC_WASTE_SHOWN:g}"
        )
    return unmet


def overload(targets: Targets) -> list[str]:
    llm = _total(targets, LLM)
    if llm.get("budget_saturated") and _state(llm) == "budget_saturated":
        return []
    return [
        f"{LLM} reads {_state(llm)} at {_number(llm.get('budget_utilization'))} of its "
        "budget, not saturated"
    ]


@dataclass(frozen=True)
class Shows:
    """What a phase must show: `check` on the exporter's targets (by name), the states the
    LLM's chip may read on the page, and whether the saturation banner must be there."""

    check: Callable[[Targets], list[str]]
    chip_states: tuple[str, ...]
    banner: bool = False

    def chip_words(self) -> tuple[str, ...]:
        return tuple(look(state).words for state in self.chip_states)

    def page_unmet(self, chip: str, text: str) -> list[str]:
        """What the page shows against what it must: the LLM's chip, and the banner."""
        unmet = []
        if chip not in self.chip_words():
            unmet.append(f"the page's chip reads {chip!r}, not {' or '.join(self.chip_words())}")
        if self.banner and f"{BANNER}{LLM}" not in text:
            unmet.append(f"no '{BANNER}{LLM}' banner on the page")
        return unmet


SHOWS = {
    "light": Shows(light, ("underloaded",)),
    "heavy": Shows(heavy, ("healthy",)),
    "long answers": Shows(long_answers, ("memory_bound", "preempting")),
    "overload": Shows(overload, ("budget_saturated",), banner=True),
}
assert tuple(SHOWS) == PHASE_NAMES, "every phase of scripts/demo.py says what it shows"
