"""`make bench` smoke test: the in-process benchmarks run and report checked comparisons.

Each is run as `scripts/bench.py --quick --only NAME --json FILE`, and the numbers it
writes are asserted: every comparison checked (identical output), every timing positive,
each ratio the ratio of its medians. Timings on a shared machine say nothing in a test,
so never a speed. The markdown is only checked to render.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.paths import REPO

ROOT = REPO


def quick_run(benchmark: str, folder: Path) -> tuple[str, dict]:
    """The report and the numbers `scripts/bench.py --quick --only BENCHMARK` writes (it
    must exit 0)."""
    report, numbers = folder / "benchmarks.md", folder / "benchmarks.json"
    done = subprocess.run(
        [
            sys.executable,
            "scripts/bench.py",
            "--quick",
            "--only",
            benchmark,
            "--output",
            str(report),
            "--json",
            str(numbers),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    written = json.loads(numbers.read_text(encoding="utf-8"))
    assert list(written) == [benchmark]
    return report.read_text(encoding="utf-8"), written[benchmark]


def assert_checked(variants: list[dict], repetitions: int) -> None:
    """Every variant gave identical output on both sides, was timed `repetitions` times,
    and its positive ratio is the ratio of its positive medians."""
    for variant in variants:
        assert variant["identical"] is True, variant
        assert variant["repetitions"] == repetitions > 0, variant
        fast, reference = variant["fast_median_seconds"], variant["reference_median_seconds"]
        assert fast > 0 and reference > 0, variant
        assert variant["ratio"] == pytest.approx(reference / fast) and variant["ratio"] > 0


def assert_five_variants(numbers: dict, text: str, repetitions: int) -> None:
    """Variants (a) to (e), each checked; the report has a row for each."""
    names = [variant["variant"] for variant in numbers["variants"]]
    assert [name[:3] for name in names] == ["(a)", "(b)", "(c)", "(d)", "(e)"]
    assert_checked(numbers["variants"], repetitions)
    assert numbers["identical"] is True
    rows = [line for line in text.splitlines() if line.startswith("| (")]
    assert [row.split(" | ")[0] for row in rows] == [f"| {name}" for name in names]


def test_quick_parser_bench_reports_identical_samples_and_ratios(tmp_path: Path) -> None:
    text, numbers = quick_run("parser", tmp_path)
    payload = numbers["payload"]
    assert payload["samples"] > payload["selected"] > 0 and payload["families"] > 0
    assert_five_variants(numbers, text, payload["repetitions"])
    assert "Identical samples in every variant: True." in text
    assert "Command: `.venv/bin/python scripts/bench.py --quick --only parser" in text


def test_quick_render_bench_reports_identical_bytes_and_ratios(tmp_path: Path) -> None:
    text, numbers = quick_run("render", tmp_path)
    assert numbers["targets"] == 100 and numbers["repetitions"] > 0
    metrics, served_json = numbers["metrics"], numbers["json"]
    assert metrics["identical"] is True and served_json["identical"] is True
    # /metrics: served, previous, prometheus_client; JSON: served, plain definition
    assert list(metrics["renderers"]) == ["new", "previous", "prometheus_client"]
    assert list(served_json["renderers"]) == ["new", "previous"]
    for body in (metrics, served_json):
        assert body["bytes"] > 0
        new = body["renderers"]["new"]
        assert new["ratio"] == 1.0
        for row in body["renderers"].values():
            assert row["median_cpu_seconds"] > 0
            expected = row["median_cpu_seconds"] / new["median_cpu_seconds"]
            assert row["ratio"] == pytest.approx(expected)
    assert metrics["samples"] > numbers["targets"]
    assert len(numbers["gzip"]) == 3
    assert all(0 < row["bytes"] < metrics["bytes"] for row in numbers["gzip"].values())
    # the markdown renders
    assert "## /metrics render (100 targets)" in text
    assert "Identical bytes from all three in every repetition: True." in text
    assert "Identical bytes in every repetition: True." in text  # the JSON body


def test_quick_dashboard_bench_reports_the_live_page_time(tmp_path: Path) -> None:
    text, numbers = quick_run("dashboard", tmp_path)
    assert (numbers["targets"], numbers["points"], numbers["runs"]) == (10, 720, 2)
    assert len(numbers["run_ms"]) == 2
    assert 0 < numbers["min_ms"] <= numbers["median_ms"] <= numbers["max_ms"]
    assert (numbers["min_ms"], numbers["max_ms"]) == (
        min(numbers["run_ms"]),
        max(numbers["run_ms"]),
    )
    # the markdown renders
    assert "for 10 targets with 720 history points each" in text
    assert "| runs | 2 (after one warm-up run) |" in text
    # the fleet: its size at --quick, a refresh's time and bytes for each run
    fleet = numbers["fleet"]
    assert (fleet["targets"], fleet["shown_points"], fleet["runs"]) == (100, 720, 2)
    assert len(fleet["run_ms"]) == len(fleet["browser_bytes"]) == 2
    assert all(ms > 0 for ms in fleet["run_ms"]) and all(b > 0 for b in fleet["browser_bytes"])
    reads = fleet["exporter_bytes"]
    # the page reads each target's summary row, far smaller than the full signals body
    assert 0 < reads["summary"] < reads["full signals (not read)"]
    assert (fleet["target_ms"], fleet["target_bytes"]) == (1000.0, 2_000_000)
    assert "### The Live page at 100 targets" in text


def test_quick_shortcuts_bench_measures_each_shortcut_with_and_without(tmp_path: Path) -> None:
    text, numbers = quick_run("shortcuts", tmp_path)
    shortcuts = numbers["shortcuts"]
    assert list(shortcuts) == [
        "plans",
        "id_caches",
        "history_rows",
        "writer",
        "http_client",
        "gc_policy",
        "tick_batching",
        "c_pass",
    ]
    for key, row in shortcuts.items():
        assert row["identical"] is True, key
        assert len(row["with_seconds"]) == len(row["without_seconds"]) > 0, key
        assert all(s > 0 for s in row["with_seconds"] + row["without_seconds"]), key
        expected = row["without_median_seconds"] / row["with_median_seconds"]
        assert row["ratio"] == pytest.approx(expected), key
        pays = row["saving_of_applied"] >= 0.05 and row["saving_of_fleet"] >= 0.01
        assert row["pays"] is pays, key
    assert numbers["fleet_cpu_per_interval"] > 0
    # with plans, the fleet's reads never reach the id-keyed series keys
    assert shortcuts["id_caches"]["extra"]["series_keys_calls_planned"] == 0
    assert shortcuts["id_caches"]["extra"]["series_keys_calls_unplanned"] > 0
    blocks = numbers["fleet_blocks"]
    assert [b["mode"] for b in blocks] == ["all", "gc_policy", "tick_batching"]
    assert all(b["up"] == numbers["targets"] for b in blocks)
    # the markdown renders: a row per shortcut
    assert f"## Each shortcut, with and without ({numbers['targets']} targets)" in text
    assert len([line for line in text.splitlines() if line.startswith("| (")]) == 8


def test_make_bench_exits_1_when_a_benchmark_misses_its_claim(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    import bench
    import bench_schedule

    missed = {"met": {"on_schedule": True, "gaps": False, "backed_off": True}}
    monkeypatch.setattr(bench_schedule, "run", lambda quick: None)
    monkeypatch.setattr(bench_schedule, "results", lambda run_result: missed)
    monkeypatch.setattr(bench_schedule, "markdown", lambda results: "## Schedule\n")
    report = tmp_path / "benchmarks.md"
    assert bench.main(["--only", "schedule", "--output", str(report)]) == 1
    missed["met"]["gaps"] = True
    assert bench.main(["--only", "schedule", "--output", str(report)]) == 0
    assert "## Schedule" in report.read_text(encoding="utf-8")


def test_quick_slo_bench_reports_the_history_bound_and_equal_signals(tmp_path: Path) -> None:
    report, numbers = quick_run("slo", tmp_path)
    memory = numbers["memory"]
    assert 0 < memory["most_checkpoints"] <= memory["bound"] == 192
    assert memory["bytes"] > 0
    assert_checked([numbers["ingest"]], 20)
    assert "## SLO: what an objective costs" in report


def test_quick_history_bench_reports_bytes_per_point_within_its_bounds(tmp_path: Path) -> None:
    report = tmp_path / "history.md"
    done = subprocess.run(
        [sys.executable, "scripts/bench_history.py", "--quick", "--output", str(report)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 0, done.stderr
    text = report.read_text(encoding="utf-8")
    per_point = int(re.search(r"\| per point \| (\d+) B \|", text).group(1))
    before = int(re.search(r"\| per point, rows kept as a deque of tuples .*? \| (\d+) B", text)[1])
    # packed and compressed, the reason's words once per change: several times smaller
    assert 0 < per_point < 200 and before > 3 * per_point
    assert "| history, 100 targets |" in text and "| yes |" in text


def test_one_benchmark_alone_never_writes_over_the_whole_benchmarks_document(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # `--only fleet` once replaced docs/benchmarks.md with its one section.
    monkeypatch.syspath_prepend(str(REPO / "scripts"))
    import bench

    assert bench.report_path(None) == REPO / "docs/benchmarks.md"
    assert bench.report_path("fleet") == REPO / "build/benchmarks-fleet.md"
