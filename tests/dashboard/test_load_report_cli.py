"""`python -m batchscope.dashboard.load_report`: the HTML report of a result file written earlier."""

from __future__ import annotations

import html
import json
from pathlib import Path

import pytest

from batchscope.dashboard import load_report

ROOT = Path(__file__).resolve().parents[2]
# The real sweep that docs/reading-a-load-test.md reads (vLLM, KV-bound, 5 rates).
REAL_SWEEP = ROOT / "docs" / "bench" / "load-test-kv-bound.json"


def test_the_report_of_the_docs_real_sweep_holds_its_knee_charts_and_every_step(
    tmp_path: Path,
) -> None:
    out = tmp_path / "sweep.html"
    assert load_report.main([str(REAL_SWEEP), "--report", str(out)]) == 0
    doc = json.loads(REAL_SWEEP.read_text())
    report = out.read_text()
    (knee,) = doc["knees"]
    assert html.escape(knee["sentence"]) in report
    assert "knee at 64 req/s" in knee["sentence"]
    # Self-contained: plotly inlined, no script fetched, the two charts drawn.
    assert 'src="http' not in report and len(report) > 1_000_000
    assert report.count("Plotly.newPlot") == 2
    # The table: a row per step (5 rates), with the binding limit of each step.
    table = report[report.index("<table") :]
    assert table.count("<tr>") == len(doc["runs"]) == 5  # the header row is styled
    assert table.count("kv_cache") >= 2


def test_the_default_report_path_is_the_result_file_s_with_html(tmp_path: Path) -> None:
    result = tmp_path / "run.json"
    result.write_text(REAL_SWEEP.read_text())
    assert load_report.main([str(result)]) == 0
    assert (tmp_path / "run.html").stat().st_size > 1_000_000


@pytest.mark.parametrize(
    ("content", "said"),
    [(None, "No such file"), ("{not json", "not JSON"), ('{"runs": []}', "no run found")],
)
def test_a_file_that_cannot_be_read_is_refused_with_its_reason_and_nothing_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str | None, said: str
) -> None:
    result = tmp_path / "bad.json"
    if content is not None:
        result.write_text(content)
    assert load_report.main([str(result)]) == 2
    assert said in capsys.readouterr().err
    assert not (tmp_path / "bad.html").exists()
