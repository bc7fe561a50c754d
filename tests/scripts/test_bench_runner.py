"""`make bench`'s runner and gates, without running a benchmark: a missed gate fails the
run, the page's other sections stay, and the fleet's gates read the right figures."""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import pytest

from tests.support.paths import REPO

sys.path.insert(0, str(REPO / "scripts"))
import bench  # noqa: E402
import bench_fleet  # noqa: E402
import benchmark  # noqa: E402


def test_a_gate_holds_only_on_its_side_of_the_bound_and_when_measured() -> None:
    assert benchmark.gate(1.25, 1.25, "x")["met"] is True
    assert benchmark.gate(1.26, 1.25, "x")["met"] is False
    assert benchmark.gate(89.9, 90.0, "%", at_most=False)["met"] is False
    assert benchmark.gate(None, 400.0, "MiB")["met"] is False
    assert benchmark.gate(float("nan"), 400.0, "MiB")["met"] is False
    results = {
        "gates": {"cpu": benchmark.gate(1.3, 1.25, "x"), "p99": benchmark.gate(5.0, 100, "ms")},
        "checks": {"same bytes": False, "all up": True},
    }
    assert benchmark.missed(results) == ["cpu", "same bytes"]


def test_the_nearest_rank_percentile() -> None:
    values = list(range(1, 201))  # 1..200
    assert benchmark.percentile(values, 0.99) == 198
    assert benchmark.percentile(values, 0.5) == 100
    assert benchmark.percentile([7.0], 0.99) == 7.0


def _fake(value: float) -> benchmark.Results:
    return {"gates": {"figure": benchmark.gate(value, 1.0, "x")}, "checks": {"valid": True}}


@pytest.mark.parametrize(("value", "code"), [(1.5, 1), (0.5, 0)])
def test_a_benchmark_exits_1_when_its_gate_is_missed(
    value: float, code: int, tmp_path: Path
) -> None:
    def run(args: argparse.Namespace) -> benchmark.Results:
        return _fake(args.value)

    def add(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--value", type=float)

    section = tmp_path / "section.md"
    argv = ["--value", str(value), "--output", str(section)]
    assert benchmark.main("fake", run, lambda r: "## Fake\n", add, argv) == code
    assert section.read_text() == "## Fake\n"


def _outcome(name: str, value: float) -> bench.Outcome:
    results = _fake(value)
    code = 1 if benchmark.missed(results) else 0
    return bench.Outcome(name, bench.marked(name, f"## {name} {value}\n"), results, code)


def test_make_bench_exits_1_when_a_benchmark_misses_a_gate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    figures = {b.name: 0.5 for b in bench.BENCHMARKS} | {"fleet": 1.5}
    monkeypatch.setattr(bench, "run_one", lambda b, quick, extra: _outcome(b.name, figures[b.name]))
    page = tmp_path / "benchmarks.md"
    page.write_text("# Benchmarks\n")
    monkeypatch.setattr(bench, "PAGE", page)
    assert bench.main([]) == 1
    figures["fleet"] = 0.9
    assert bench.main([]) == 0
    # Every section written, each once, the newest figures in it.
    text = page.read_text()
    assert [text.count(f"<!-- bench:{name} -->") for name in figures] == [1] * len(figures)
    assert "## fleet 0.9\n" in text and "## fleet 1.5" not in text


def test_one_benchmark_rewrites_its_own_section_of_the_page_and_nothing_else(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    page = tmp_path / "benchmarks.md"
    before = (
        "# Benchmarks\n\nIntro.\n\n"
        + bench.marked("fleet", "## Fleet\n\nto be measured\n")
        + "\n"
        + bench.marked("batching", "## Batching\n\n2.9x\n")
    )
    page.write_text(before)
    monkeypatch.setattr(bench, "PAGE", page)
    monkeypatch.setattr(bench, "run_one", lambda b, quick, extra: _outcome(b.name, 0.8))
    assert bench.main(["--only", "fleet"]) == 0
    assert page.read_text() == before.replace("## Fleet\n\nto be measured\n", "## fleet 0.8\n")


def test_a_quick_run_never_writes_the_page(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    page, quick = tmp_path / "benchmarks.md", tmp_path / "build" / "benchmarks.md"
    page.write_text("# Benchmarks\n")
    monkeypatch.setattr(bench, "PAGE", page)
    monkeypatch.setattr(bench, "QUICK_REPORT", quick)
    monkeypatch.setattr(bench, "run_one", lambda b, quick, extra: _outcome(b.name, 2.0))
    assert bench.main(["--quick", "--only", "batching"]) == 1
    assert page.read_text() == "# Benchmarks\n"
    assert "<!-- bench:batching -->" in quick.read_text()


def test_a_section_missing_from_the_page_is_added_at_its_end() -> None:
    page = "# Benchmarks\n\n" + bench.marked("fleet", "old\n")
    updated = bench.update_page(page, {"truth": bench.marked("truth", "new\n")})
    assert updated == page + "\n" + bench.marked("truth", "new\n")


def test_a_benchmark_s_own_flags_need_only() -> None:
    with pytest.raises(SystemExit):
        bench.main(["--soak-minutes", "1"])


def _run(kind: str, cores: float, latencies: list[float] = (), rss_mib: float = 300.0):
    run = bench_fleet.Run(kind, cpu_seconds=cores * 60, seconds=60.0, up_at_end=1000)
    run.latencies = list(latencies)
    run.rss_bytes = [int(rss_mib * 2**20)]
    return run


def test_the_fleet_gates_read_the_ratio_of_the_medians_the_p99_and_the_soak_s_memory() -> None:
    plan = bench_fleet.FULL
    cores = {
        bench_fleet.EXPORTER: [0.30, 0.20, 0.25],
        bench_fleet.PROMETHEUS: [0.21, 0.19, 0.20],
        bench_fleet.WITHOUT_TICK_BATCHING: [0.40, 0.40, 0.40],
        bench_fleet.ASYNCIO_LOOP: [0.275, 0.275, 0.275],
    }
    fast = [0.002] * 99
    runs = [_run(k, c, fast if k == bench_fleet.EXPORTER else ()) for k in cores for c in cores[k]]
    soak = _run(bench_fleet.EXPORTER, 0.25, [0.002] * 297 + [0.150] * 3, rss_mib=380.0)
    r = bench_fleet.results(plan, runs, soak, "Prometheus 2.42.0")
    gates = r["gates"]
    # median 0.25 against median 0.20
    assert gates["exporter CPU / Prometheus CPU"]["value"] == pytest.approx(1.25)
    assert gates["exporter CPU / Prometheus CPU"]["met"] is True
    # 597 answers of the deployed exporter, 3 slow: the 592nd fastest is the p99
    assert r["metrics_ms"]["answers"] == 597
    assert gates["/metrics p99"]["value"] == pytest.approx(2.0)
    assert r["metrics_ms"]["max"] == pytest.approx(150.0) and r["metrics_ms"]["over_bound"] == 3
    assert gates["exporter memory after the 60-minute soak"]["value"] == pytest.approx(380.0)
    assert r["without"] == {
        "tick batching": pytest.approx(1.6),
        "uvloop": pytest.approx(1.1),
    }
    assert benchmark.missed(r) == []

    slower = [
        _run(bench_fleet.EXPORTER, 0.26) if r.kind == bench_fleet.EXPORTER else r for r in runs
    ]
    assert statistics.median(c.cores for c in slower if c.kind == bench_fleet.EXPORTER) == 0.26
    heavy = _run(bench_fleet.EXPORTER, 0.25, [0.150] * 10, rss_mib=401.0)
    missed = benchmark.missed(bench_fleet.results(plan, slower, heavy, "Prometheus 2.42.0"))
    assert missed == [
        "exporter CPU / Prometheus CPU",
        "/metrics p99",
        "exporter memory after the 60-minute soak",
    ]
    # No soak: its memory is not measured, so its gate is missed, never passed.
    assert benchmark.missed(bench_fleet.results(plan, runs, None, "Prometheus 2.42.0")) == [
        "exporter memory after the 60-minute soak"
    ]


def test_at_most_six_benchmarks_each_a_script_with_its_section_on_the_page() -> None:
    assert len(bench.BENCHMARKS) <= 6
    page = (REPO / "docs/benchmarks.md").read_text(encoding="utf-8")
    assert len(page.splitlines()) < 250
    for b in bench.BENCHMARKS:
        assert (REPO / "scripts" / b.script).exists(), b.script
        assert page.count(f"<!-- bench:{b.name} -->\n") == 1, b.name
        assert page.count(f"<!-- /bench:{b.name} -->\n") == 1, b.name
        assert f"| `{b.name}` |" in page, b.name  # the page's index names it
