"""The replica count holds on a fleet of demo servers: a smaller truth table than
`make bench`'s (scripts/bench_replicas.py), one setting, two rates, k-1 and k.

Cap-bound demo servers (16 slots, 64-token answers, a 12 s budget) on the simulated
H200 at 40x its step cost, so that three of them keep its pace on a loaded 2-core
machine. At 1.45x what one instance finishes a second (4.3 requests/s, as it runs the
simulated device), the exporter watching one instance recommends k (2 where the count is
right): that run is k-1, saturated, and the same rate at k instances stays within the
budget. At 2.5x what that first instance finished, the exporter watching two instances
(k-1 again where the count is right) recommends 3, and 3 stay within the budget. At the
headroom this budget leaves (about 0.94 of what a replica finishes), the rates sit 13%
or more from the counts' edges (the window's Poisson spread is about 6%); at k-1 the
load is 1.25x to 1.45x what the instances finish, at k at most 0.83x. k+1 is in
`make bench`'s table. About 6 minutes: four runs.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.replica_truth import Timing, cap_bound, truth_row

pytestmark = [pytest.mark.integration, pytest.mark.timeout(2400)]

SLOWDOWN = 40.0
TIMING = Timing(window_seconds=30.0, hold_seconds=8.0, run_seconds=60.0)
NOMINAL = 4.3  # requests/s one instance finishes at this slowdown, overloaded


def test_the_count_read_at_k_minus_1_replicas_holds_there_and_at_k(tmp_path: Path) -> None:
    setting = cap_bound(SLOWDOWN)
    one = NOMINAL
    for multiple, expected in ((1.45, 2), (2.5, 3)):
        # Watched at k-1 replicas where the count is right: that run is the table's k-1.
        row = truth_row(
            setting, round(multiple * one, 2), TIMING, tmp_path, watch=expected - 1, around=(-1, 0)
        )
        claims = row.holds()
        described = {
            n: (r.p99_seconds, r.saturated, r.desired, r.overruns, r.reasons[-1:])
            for n, r in row.runs.items()
        }
        assert all(claims.values()), (multiple, claims, described)
        assert row.recommended == expected and row.limit == "requests", described
        # The count reads the demand the generator offered, within Poisson's spread.
        watched = row.runs[expected - 1]
        assert watched.demand == pytest.approx(row.rate, rel=0.2)
        if expected - 1 == 1:
            # One instance overloaded finishes what the simulated device serves.
            one = watched.throughput
            assert one == pytest.approx(NOMINAL, rel=0.25), described
