"""`make bench` smoke tests: each benchmark's `--quick` run through the runner.

Each runs as `scripts/bench.py --quick --only NAME --output FILE --json FILE` and its
results are asserted: the report's shape, the numbers' sanity (positive, consistent with
each other, each ratio the ratio of its figures), and every validity check holding. A
quick run is small and the machine shared: whether a gate is met is not asserted, only
that the exit code says so.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.paths import REPO

pytestmark = pytest.mark.integration

sys.path.insert(0, str(REPO / "scripts"))
import bench_fleet  # noqa: E402
import benchmark  # noqa: E402


def quick_run(name: str, folder: Path, *extra: str, timeout: float = 600) -> tuple[str, dict]:
    """The section and results of `scripts/bench.py --quick --only NAME`; its exit code is
    1 exactly when a gate or a check is missed, and every check holds."""
    report, numbers = folder / "benchmarks.md", folder / "results.json"
    done = subprocess.run(
        [sys.executable, "scripts/bench.py", "--quick", "--only", name]
        + ["--output", str(report), "--json", str(numbers), *extra],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    results = json.loads(numbers.read_text(encoding="utf-8"))
    assert list(results) == [name], done.stderr
    found = results[name]
    assert found is not None, done.stderr
    assert done.returncode == (1 if benchmark.missed(found) else 0), done.stderr
    assert all(found.get("checks", {}).values()), found["checks"]
    text = report.read_text(encoding="utf-8")
    assert text.count(f"<!-- bench:{name} -->") == 1 and f"<!-- /bench:{name} -->" in text
    assert f"Command: `.venv/bin/python scripts/bench.py --only {name} --quick" in text
    for gate in found["gates"]:
        assert f"| {gate} |" in text
    return text, found


def test_quick_fleet_runs_each_kind_in_turn_and_gates_cpu_latency_and_memory(
    tmp_path: Path,
) -> None:
    text, r = quick_run("fleet", tmp_path, "--soak-minutes", "0.3")
    assert r["targets"] == 100 and r["soak_minutes"] == 0.3
    assert [run["kind"] for run in r["runs"]] == list(bench_fleet.KINDS)
    for run in r["runs"]:
        assert run["cpu_seconds"] > 0 and run["seconds"] >= r["measure_seconds"]
        assert run["up_at_end"] == 100 and 0 < run["rss_bytes"][-1] < 4 * 2**30
        # The exporters' /metrics is fetched once a second; Prometheus is not probed.
        probed = run["kind"] != bench_fleet.PROMETHEUS
        assert (len(run["latencies"]) > 0) is probed
        assert len(run["latencies"]) <= r["measure_seconds"] + 1
    cores = r["cores_median"]
    assert r["cpu_ratio"] == pytest.approx(cores["exporter"] / cores["prometheus"])
    assert r["gates"]["exporter CPU / Prometheus CPU"]["value"] == r["cpu_ratio"]
    assert r["without"]["uvloop"] == pytest.approx(cores["asyncio event loop"] / cores["exporter"])
    metrics = r["metrics_ms"]
    assert 0 < metrics["p50"] <= metrics["p99"] <= metrics["max"]
    deployed = [run for run in r["runs"] if run["kind"] == "exporter"] + [r["soak"]]
    assert metrics["answers"] == sum(len(run["latencies"]) for run in deployed)
    soak = r["soak"]
    assert soak["rss_mib"] == pytest.approx(soak["rss_bytes"][-1] / 2**20)
    assert r["gates"]["exporter memory after the 0.3-minute soak"]["value"] == soak["rss_mib"]
    assert "| tick batching |" in text and "| uvloop (asyncio's event loop) |" in text


def test_quick_fastpaths_holds_each_to_its_plain_definition(tmp_path: Path) -> None:
    text, r = quick_run("fastpaths", tmp_path)
    writer, history = r["writer"], r["history"]
    assert writer["targets"] == 100 and writer["samples"] > writer["targets"]
    assert writer["bytes"] > 0 and len(writer["seconds"]["render_metrics"]) == 3
    medians = {name: statistics.median(s) for name, s in writer["seconds"].items()}
    assert writer["ratio"] == pytest.approx(medians["generate_latest"] / medians["render_metrics"])
    assert all(m > 0 for m in medians.values())
    assert (history["targets"], history["points"]) == (100, 120)
    assert 0 < history["packed_bytes"] < history["plain_bytes"]
    assert history["ratio"] == pytest.approx(history["plain_bytes"] / history["packed_bytes"])
    # a point dict and its series list each, the served history a few objects a target
    assert history["plain_objects"] >= 2 * 100 * 120 > 10 * history["packed_objects"]
    assert "| /metrics writer:" in text and "| history: bytes a point |" in text


def test_quick_batching_predicts_from_the_trace_and_measures_both_modes(tmp_path: Path) -> None:
    _, r = quick_run("batching", tmp_path)
    assert r["trace"]["requests"] == 64
    assert [(row["device"], row["slots"]) for row in r["rows"]] == [
        ("cpu", 8),
        ("cpu", 32),
        ("sim:h200", 8),
        ("sim:h200", 32),
    ]
    for row in r["rows"]:
        assert row["predicted_gain"] == pytest.approx(1 / row["static_utilization"])
        tokens = row["tokens_per_s"]
        assert row["measured_gain"] == pytest.approx(tokens["continuous"] / tokens["static"])
        assert row["share"] == pytest.approx(row["measured_gain"] / row["predicted_gain"])
        # static groups never refill: more steps than continuous batching on the same trace
        assert row["steps"]["static"] > row["steps"]["continuous"] > 0
        assert 0 < row["continuous_slot_utilization"] <= 1
    assert len(r["gates"]) == 4


def test_quick_advice_reads_three_kv_phases_and_two_batcher_runs(tmp_path: Path) -> None:
    text, r = quick_run("advice", tmp_path)
    assert [(p["cap"], p["name"]) for p in r["kv"]] == [
        (16, "small cache, cap C"),
        (32, "cap raised past it"),
        (16, "advised KV tokens, cap C"),
    ]
    small = r["kv"][0]
    assert small["tokens_per_step"] > 0 and small["running"]
    assert 0 < small["advice"]["sustainable_concurrency"] < 16
    assert r["kv"][2]["kv_cache_tokens"] == pytest.approx(
        small["advice"]["kv_tokens_for_cap"], abs=1
    )
    assert [b["name"] for b in r["batcher"]] == ["as configured", "advised pair"]
    assert len(r["gates"]) == 4 and all(g["value"] is not None for g in r["gates"].values())
    assert "| phase | cap | KV tokens |" in text


def test_quick_dashboard_times_the_live_page_at_both_sizes(tmp_path: Path) -> None:
    _, r = quick_run("dashboard", tmp_path)
    assert (r["targets"], r["points"], r["runs"]) == (10, 720, 2)
    assert 0 < r["min_ms"] <= r["median_ms"] <= r["max_ms"]
    assert (r["min_ms"], r["max_ms"]) == (min(r["run_ms"]), max(r["run_ms"]))
    fleet = r["fleet"]
    assert (fleet["targets"], fleet["shown_points"], fleet["runs"]) == (100, 720, 2)
    assert len(fleet["run_ms"]) == len(fleet["browser_bytes"]) == 2
    assert all(b > 0 for b in fleet["browser_bytes"])
    reads = fleet["exporter_bytes"]
    # the page reads each target's summary row, far smaller than the full signals body
    assert 0 < reads["summary"] < reads["full signals (not read)"]
    assert r["gates"]["Live page, 10 targets: median time"]["value"] == r["median_ms"]
