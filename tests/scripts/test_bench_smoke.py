"""`make bench` smoke test: the parser benchmark runs and reports a checked comparison.

Timings on a shared machine say nothing in a test, so only the report's shape and the
identical-samples check are asserted, never a speed.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from tests.support.paths import REPO

ROOT = REPO


def quick_report(benchmark: str, folder: Path) -> str:
    """The report `scripts/bench.py --quick --only BENCHMARK` writes (it must exit 0)."""
    report = folder / "benchmarks.md"
    done = subprocess.run(
        [
            sys.executable,
            "scripts/bench.py",
            "--quick",
            "--only",
            benchmark,
            "--output",
            str(report),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return report.read_text(encoding="utf-8")


def assert_five_checked_ratios(text: str) -> None:
    """Rows (a) to (e), each with a positive ratio and `yes` (identical output)."""
    rows = [line for line in text.splitlines() if line.startswith("| (")]
    assert [row[:5] for row in rows] == ["| (a)", "| (b)", "| (c)", "| (d)", "| (e)"]
    for row in rows:
        ratio = re.search(r"\| (\d+\.\d)x \| yes \|", row)
        assert ratio is not None, row
        assert float(ratio.group(1)) > 0


def test_quick_parser_bench_reports_identical_samples_and_ratios(tmp_path: Path) -> None:
    text = quick_report("parser", tmp_path)
    assert "Identical samples in every variant: True." in text
    assert_five_checked_ratios(text)
    assert "Command: `.venv/bin/python scripts/bench.py --quick --only parser" in text


def test_quick_render_bench_reports_identical_bytes_and_ratios(tmp_path: Path) -> None:
    text = quick_report("render", tmp_path)
    assert "## /metrics render (100 targets)" in text
    assert "Identical bytes from all three in every repetition: True." in text
    assert "Identical bytes in every repetition: True." in text  # the JSON body
    # /metrics: served, previous, prometheus_client; JSON: served, plain definition
    ratios = re.findall(r"\| ([\d.]+) \| (\d+\.\d\d)x \|", text)
    assert [float(ratio) for _, ratio in ratios][::3] == [1.0, 1.0] and len(ratios) == 5
    assert all(float(ms) > 0 for ms, _ in ratios)


def test_quick_dashboard_bench_reports_the_live_page_time(tmp_path: Path) -> None:
    text = quick_report("dashboard", tmp_path)
    assert "for 10 targets with 720 history points each" in text
    assert "| runs | 2 (after one warm-up run) |" in text
    assert re.search(r"\| median \(min - max\) \| \d+ ms \(\d+ - \d+ ms\) \|", text), text


def test_quick_ingest_bench_reports_identical_series_against_the_baseline(tmp_path: Path) -> None:
    text = quick_report("ingest", tmp_path)
    assert "Identical series in every variant: True." in text
    assert_five_checked_ratios(text)


def test_quick_evaluation_bench_reports_identical_signals_against_the_baseline(
    tmp_path: Path,
) -> None:
    text = quick_report("evaluation", tmp_path)
    assert "Identical in every variant: True." in text
    rows = [
        line for line in text.splitlines() if line.startswith("| one") or line.startswith("| two")
    ]
    assert len(rows) == 2
    for row in rows:
        assert "(13 scrapes in window)" in row
        ratio = re.search(r"\| (\d+\.\d)x \| yes \|", row)
        assert ratio is not None and float(ratio.group(1)) > 0, row
