"""Walk `make demo`'s four phases in Chromium and save the Live page two thirds into each.

Starts `scripts/demo.py` (at `--phase-scale`, 1 by default: the demo as documented, about
four minutes), opens the Live page at 1400 px two thirds into each phase, and
saves a full-page screenshot per phase (docs/img/live-<phase>.png by default: the
README's). Reports what a reader of the page must never see: "None", a cut-off tile,
"nothing to fix" beside a budget used above 100%, a fleet table wider than the page; exit
code 1 when any view shows one.

    .venv/bin/python scripts/demo_walk.py                 # the README's screenshots
    .venv/bin/python scripts/demo_walk.py --phase-scale 0.5 --output /tmp/walk
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests.support
from demo import PHASES  # noqa: E402

from tests.support.demo_walk import walk  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--phase-scale", type=float, default=1.0, help="scripts/demo.py's (default: 1)"
    )
    parser.add_argument(
        "--output", type=Path, default=ROOT / "docs" / "img", help="where the screenshots go"
    )
    args = parser.parse_args(argv)
    args.output.mkdir(parents=True, exist_ok=True)
    print(f"demo_walk: starting the demo at phase scale {args.phase_scale:g}", flush=True)
    views = walk(args.phase_scale, args.output, len(PHASES))
    for view in views:
        verdict = "; ".join(view.problems) or "none of those problems"
        print(f"{view.phase}: {view.shown_state} -> {view.screenshot}: {verdict}")
    return 1 if any(view.problems for view in views) else 0


if __name__ == "__main__":
    sys.exit(main())
