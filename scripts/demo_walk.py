"""Walk `make demo`'s four phases in Chromium and save the Live page's first screen in each.

Starts `scripts/demo.py` (at `--phase-scale`, 1 by default: the demo as documented, about
four minutes), opens the Live page at 1400x900 with the LLM selected, waits in each phase
until it shows its name (light underloaded, heavy the LLM at its cap with a queue, long
answers the KV cache binding, overload the budget saturated: tests/support/demo_phases.py)
and saves its first screen, no scroll (docs/img/live-<phase>.png by default: the
README's). Prints the state each phase's chip read, what a phase did not show, a load
generator that stopped before its phase ended, and what a reader must never see ("None",
a cut-off tile, "nothing to fix" beside a budget used above 100%, a fleet table wider
than the page); exit code 1 when any phase has one.

    .venv/bin/python scripts/demo_walk.py                 # the README's screenshots
    .venv/bin/python scripts/demo_walk.py --phase-scale 0.5 --output /tmp/walk
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests.support
from tests.support.demo_phases import PHASE_NAMES  # noqa: E402
from tests.support.demo_walk import PhaseView, walk  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def verdict(view: PhaseView) -> list[str]:
    """Everything wrong with one phase's view, in words (empty: nothing)."""
    return [*view.unmet, *view.problems, *(line.splitlines()[0] for line in view.stopped_load)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--phase-scale", type=float, default=1.0, help="scripts/demo.py's (default: 1)"
    )
    parser.add_argument(
        "--output", type=Path, default=ROOT / "docs" / "img", help="where the screenshots go"
    )
    parser.add_argument(
        "--full-pages",
        type=Path,
        metavar="DIR",
        help="also save each phase's whole page, its folded boxes open, in DIR",
    )
    args = parser.parse_args(argv)
    for folder in (args.output, args.full_pages):
        if folder is not None:
            folder.mkdir(parents=True, exist_ok=True)
    print(f"demo_walk: starting the demo at phase scale {args.phase_scale:g}", flush=True)
    started = time.monotonic()
    views = walk(args.phase_scale, args.output, len(PHASE_NAMES), args.full_pages)
    for view in views:
        wrong = verdict(view)
        print(
            f"{view.phase}: the chip reads {view.shown_state!r}, {view.headline!r} -> "
            f"{view.screenshot}: "
            + ("; ".join(wrong) if wrong else "shows its name, nothing wrong")
        )
    print(f"demo_walk: {time.monotonic() - started:.0f} s")
    return 1 if any(verdict(view) for view in views) else 0


if __name__ == "__main__":
    sys.exit(main())
