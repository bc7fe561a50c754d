"""`--find-capacity` against a fine fixed sweep of the same server.

The demo server runs as a user runs it (`batchscope-demo-server`, its own process), one
sequence at a time on a simulated device twenty times slower than an H200: a request of
8 tokens takes about 150 ms of simulated time, so the server answers at most about 6.5
req/s; the test assumes no rate, the sweep measures it. A fine fixed sweep, 22 rates 8%
apart from 2 req/s to 10 req/s, measures the capacity as the highest rate that met the
SLO; `batchscope-loadgen --find-capacity` from the same start must land within 15% of
it, in fewer steps.

Why the numbers hold on a loaded machine: the simulated pace, not the CPU, sets the
capacity (the server's CPU time per request is about 15 ms, so a CPU starved to a
quarter of a core still computes each step well within the 19 ms the slowed device
takes); arrivals are constant (no Poisson bursts), so a step passes while the server
keeps up and fails once its queue outgrows the SLO. The SLO is long (1 s against a
request's 150 ms), so a scheduling stall of a starved CPU does not fail a step that
keeps up; the rate at which the queue reaches it (about 1.3x the capacity over a 3 s
step) is the same for both measurements, which share the step length, the SLO and the
server. The 15% holds the grid's 8% and the search's 5% precision with room for noise.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from batchscope.demo_server.loadgen import run as loadgen
from batchscope.demo_server.loadgen.capacity_search import meets_slo
from tests.support.demo_process import running_demo_server

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

SLO_MS = 1000.0
ATTAINMENT = 0.99
STEP_SECONDS = 3.0
START_RATE = 2.0
GRID = 1.08  # the fine sweep's rates, each 8% above the last, up to 10 req/s
GRID_STEPS = 22
PRECISION = 0.05
TOLERANCE = 0.15


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with running_demo_server(
        *("--device", "sim:h200", "--sim-slowdown", "20", "--max-num-seqs", "1"),
        *("--log-level", "warning"),
        log=tmp_path_factory.mktemp("demo") / "server.log",
    ) as (url, _):
        yield url


def run_loadgen(url: str, output: Path, *flags: str) -> dict:
    """One `batchscope-loadgen` run against `url` with the test's load; its result file."""
    code = loadgen.main(
        [
            *("--url", url, "--endpoint", "completions", "--arrivals", "constant"),
            *("--duration", f"{STEP_SECONDS:g}", "--max-tokens", "8", "--timeout", "60"),
            *("--slo-ms", f"{SLO_MS:g}", "--output", str(output), *flags),
        ]
    )
    assert code == 0
    return json.loads(output.read_text())


def test_find_capacity_lands_within_15_percent_of_a_fine_sweep_in_fewer_steps(
    server: str, tmp_path: Path
) -> None:
    started = time.monotonic()
    body = run_loadgen(
        server,
        tmp_path / "capacity.json",
        *("--rates", f"{START_RATE:g}", "--find-capacity"),
        *("--precision", f"{PRECISION:g}", "--max-steps", "12"),
    )
    searched_s = time.monotonic() - started
    found = body["capacity"]
    searched = [(run["rate"], meets_slo(run, ATTAINMENT)) for run in body["runs"]]
    started = time.monotonic()
    grid = ",".join(f"{START_RATE * GRID**i:.3f}" for i in range(GRID_STEPS))
    swept = [
        (run["rate"], meets_slo(run, ATTAINMENT))
        for run in run_loadgen(server, tmp_path / "sweep.json", "--rates", grid)["runs"]
    ]
    swept_s = time.monotonic() - started
    print(f"sweep ({swept_s:.0f} s): {swept}\nsearch ({searched_s:.0f} s): {searched} {found}")
    capacity = max((rate for rate, passed in swept if passed), default=None)
    assert capacity is not None and not swept[-1][1], swept  # the grid spans the knee
    assert found["rate"] is not None and found["converged"], searched
    assert abs(found["rate"] - capacity) <= TOLERANCE * capacity, (searched, swept)
    assert found["steps"] < len(swept)
