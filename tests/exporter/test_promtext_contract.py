"""The parser's contract with the text format: one test per rule, each naming its source.

Sources: FORMAT is the exposition format's specification
(https://prometheus.io/docs/instrumenting/exposition_formats/, "Text format details"),
PROMPARSE is Prometheus's parser (prometheus/prometheus model/textparse/promparse.go),
OPENMETRICS is the OpenMetrics specification (histogram and summary sample rules),
DATA_MODEL is https://prometheus.io/docs/concepts/data_model/ (names and labels).

Every refusal is checked in the full parse and in the selective parse (the exporter's),
and both must give the same line number and reason.
"""

from __future__ import annotations

import re

import pytest

from batchscope.exporter.config.settings import Settings, Target
from batchscope.exporter.engines import read_series
from batchscope.exporter.ingest import promtext
from batchscope.exporter.scrape.fetch import ScrapeResult
from batchscope.exporter.scrape.loop import Exporter


def _refused(text: str, families: list[str], line: int, reason: str) -> None:
    """`text` is refused with `reason` at `line` by the full parse and the selective one."""
    for path_families in (None, families):
        with pytest.raises(promtext.ParseError, match=re.escape(reason)) as err:
            promtext.parse(text, path_families)
        assert err.value.line_number == line


def _read(text: str, families: list[str]) -> list[tuple]:
    """What both paths read: the full parse filtered, and the selective one."""
    wanted = promtext.wanted_names(families)
    full = [tuple(s) for s in promtext.parse(text) if s.name in wanted]
    assert [tuple(s) for s in promtext.parse(text, families)] == full
    return full


# ---------------------------------------------------------------- read


def test_quoted_metric_name_inside_the_braces_is_read_by_its_name() -> None:
    # PROMPARSE parseLVals: a quoted string followed by `,` or `}` is the metric name.
    text = (
        '# HELP "name.with.dots" A name that needs quotes.\n'
        '# TYPE "name.with.dots" gauge\n'
        '{"name.with.dots",a="v"} 1\n'
        '{"name.with.dots"} 2\n'
        'other{a="x"} 3\n'
    )
    assert _read(text, ["name.with.dots"]) == [
        ("name.with.dots", {"a": "v"}, 1.0, None),
        ("name.with.dots", {}, 2.0, None),
    ]


def test_quoted_label_name_is_read_unquoted() -> None:
    # PROMPARSE parseLVals: "a label name, and it might be quoted"; FORMAT: UTF-8 names.
    text = 'metric{"my.label"="v",plain="w"} 1\nmetric{"é \\"q\\""="x"} 2\n'
    assert _read(text, ["metric"]) == [
        ("metric", {"my.label": "v", "plain": "w"}, 1.0, None),
        ("metric", {'é "q"': "x"}, 2.0, None),
    ]


def test_quoted_names_of_a_histogram_are_matched_by_its_family() -> None:
    # PROMPARSE: the quoted name is the sample's name, suffixes included.
    text = (
        '# TYPE "lat.seconds" histogram\n'
        '{"lat.seconds_bucket",le="1"} 2\n'
        '{"lat.seconds_bucket",le="+Inf"} 3\n'
        '{"lat.seconds_count"} 3\n'
    )
    assert [s[0] for s in _read(text, ["lat.seconds"])] == [
        "lat.seconds_bucket",
        "lat.seconds_bucket",
        "lat.seconds_count",
    ]


def test_payload_without_a_final_newline_is_read_deliberately() -> None:
    # FORMAT: "The last line must end with a line feed character." Read anyway: a
    # payload cut before its newline loses nothing a signal needs.
    assert _read("# TYPE m gauge\nm 1", ["m"]) == [("m", {}, 1.0, None)]


def test_other_comments_are_skipped_whatever_they_hold() -> None:
    # FORMAT: a `#` line whose first token is not HELP or TYPE is ignored.
    assert _read("# HELPER m m m\n#TYPE m nonsense\nm 1\n", ["m"]) == [("m", {}, 1.0, None)]


def test_integer_timestamp_is_read_as_seconds() -> None:
    # FORMAT: "an int64 (milliseconds since epoch)"; PROMPARSE: strconv.ParseInt.
    (sample,) = promtext.parse("m 1 1700000000123\n")
    assert sample.timestamp == pytest.approx(1_700_000_000.123)


# ---------------------------------------------------------------- refuse


HISTOGRAM = '# TYPE h histogram\nh_bucket{le="1"} 2\nh_bucket{le="+Inf"} 3\nh_sum 4\nh_count 3\n'


def test_negative_histogram_bucket_is_refused_on_both_paths() -> None:
    # OPENMETRICS: a histogram's buckets are counters, never negative.
    bad = HISTOGRAM.replace('h_bucket{le="1"} 2', 'h_bucket{le="1"} -2')
    _refused(bad, ["h"], 2, "a histogram's h_bucket cannot be negative")


def test_negative_histogram_count_is_refused_on_both_paths() -> None:
    # OPENMETRICS: a histogram's _count is a counter, never negative.
    bad = HISTOGRAM.replace("h_count 3", "h_count -3")
    _refused(bad, ["h"], 5, "a histogram's h_count cannot be negative")


def test_negative_sum_and_untyped_count_are_read() -> None:
    # OPENMETRICS: a histogram's _sum may be negative (negative observations); without
    # a TYPE line `h_count` is an untyped sample like any other.
    text = HISTOGRAM.replace("h_sum 4", "h_sum -4")
    assert _read(text, ["h"])[2] == ("h_sum", {}, -4.0, None)
    assert _read("h_count -3\n", ["h"]) == [("h_count", {}, -3.0, None)]


def test_le_that_is_not_a_number_is_refused() -> None:
    # FORMAT: a bucket's `le` is its upper bound, a float (Go's ParseFloat in Prometheus).
    bad = HISTOGRAM.replace('le="1"', 'le="bla"')
    _refused(bad, ["h"], 2, "le='bla' is not a number")


def test_quantile_that_is_not_a_number_is_refused() -> None:
    # FORMAT: a summary's `quantile` label is a float (0 <= phi <= 1).
    text = '# TYPE s summary\ns{quantile="0.5"} 1\ns{quantile="bla"} 2\ns_sum 3\ns_count 2\n'
    _refused(text, ["s"], 3, "quantile='bla' is not a number")


def test_duplicate_label_name_is_refused() -> None:
    # DATA_MODEL: a label set maps each name to one value (Prometheus's scrape refuses
    # a series with a duplicate label name).
    _refused('m{a="1",b="2",a="3"} 1\n', ["m"], 1, "label 'a' given twice")


def test_quoted_metric_name_outside_the_braces_is_refused() -> None:
    # FORMAT (Prometheus 3 text format): a name that needs quotes is written inside the
    # braces, `{"name.with.dots"}`; a line that starts with a quote is no sample. (Found by
    # the fuzzer: `"\\vllm:x_bucket{...} 1` was read as a sample named `"\\vllm:x_bucket`.)
    for text in ('"m" 1\n', '"\\m"{a="1"} 1\n'):
        with pytest.raises(promtext.ParseError, match="a quoted metric name outside the braces"):
            promtext.parse("m 2\n" + text)
    assert [tuple(s) for s in promtext.parse('{"m"} 1\n')] == [("m", {}, 1.0, None)]


def test_name_label_is_refused() -> None:
    # DATA_MODEL: names starting with `__` are reserved; the metric name is not a label.
    _refused('m{__name__="other"} 1\n', ["m"], 1, "a __name__ label")


def test_second_help_line_is_refused() -> None:
    # FORMAT: "Only one HELP line may exist for any given metric name."
    _refused("# HELP m one\n# HELP m two\nm 1\n", ["m"], 2, "a second HELP line for 'm'")


def test_second_type_line_is_refused() -> None:
    # FORMAT: "Only one TYPE line may exist for a given metric name."
    _refused("# TYPE m gauge\nm 1\n# TYPE m gauge\n", ["m"], 3, "a second TYPE line for 'm'")


def test_type_line_after_its_samples_is_refused() -> None:
    # FORMAT: "The TYPE line for a metric name must appear before the first sample is
    # reported for that metric name."
    text = 'h_bucket{le="+Inf"} 1\nh_count 1\n# TYPE h histogram\n'
    _refused(text, ["h"], 3, "TYPE line for 'h' after its sample 'h_bucket'")


def test_unknown_type_is_refused() -> None:
    # FORMAT: the type is one of counter, gauge, histogram, summary, untyped;
    # PROMPARSE: `invalid metric type`.
    _refused("# TYPE m gauges\nm 1\n", ["m"], 1, "unknown type 'gauges'")


def test_invalid_escape_in_a_label_value_is_refused() -> None:
    # FORMAT: a label value escapes `\`, `"` and line feed as `\\`, `\"` and `\n`;
    # nothing else is an escape (Prometheus keeps other escapes literally; we refuse a
    # value whose meaning is not defined rather than guess it).
    _refused('m{path="C:\\temp"} 1\n', ["m"], 1, "invalid escape '\\\\t'")


def test_fractional_timestamp_is_refused() -> None:
    # FORMAT: the timestamp is an int64 of milliseconds; PROMPARSE: strconv.ParseInt
    # refuses `1.5`. Read as milliseconds it would put the sample at another time.
    _refused("m 1 1700000000123.5\n", ["m"], 1, "is not a whole number of milliseconds")


def test_a_rule_refusal_is_the_scrapes_unreadable_state() -> None:
    # The refusal reaches the target as one scrape's unreadable payload, with its line.
    target = Target("t", "http://h/metrics", engine="vllm")
    exporter = Exporter(Settings(targets=(target,)))
    text = "# TYPE vllm:num_requests_running gauge\n" + VLLM_LINES
    text += "# TYPE vllm:num_requests_running gauge\n"
    signals = exporter.evaluate(exporter.states["t"], ScrapeResult(text, None, 0.01), 1000.0)
    assert not signals.up and signals.total.diagnosis.state == "down"
    assert signals.error.startswith("unreadable payload: line 4: a second TYPE line")
    assert signals.errors_total == {"parse": 1}


VLLM_LINES = (
    'vllm:num_requests_running{model_name="m",engine="0"} 5\n'
    'vllm:num_requests_waiting{model_name="m",engine="0"} 2\n'
)


# ---------------------------------------------------------------- end to end


def _quoted(text: str) -> str:
    """`text` with every vLLM metric name and every `model_name` label name quoted."""
    text = re.sub(r"^# (HELP|TYPE) (vllm:\S+)", r'# \1 "\2"', text, flags=re.M)
    text = re.sub(r"^(vllm:[^\s{]+)\{", r'{"\1",', text, flags=re.M)
    text = re.sub(r"^(vllm:[^\s{]+) ", r'{"\1"} ', text, flags=re.M)
    return text.replace("model_name=", '"model_name"=')


def test_quoted_payload_is_read_end_to_end_into_the_same_signals(vllm_load: str) -> None:
    quoted = _quoted(vllm_load)
    assert '{"vllm:num_requests_running",engine="0","model_name"="/tmp/tinyllama"}' in quoted
    assert read_series(quoted, "vllm") == read_series(vllm_load, "vllm")
    results = []
    for text in (vllm_load, quoted):
        target = Target("t", "http://h/metrics", engine="vllm", cap=8)
        exporter = Exporter(Settings(targets=(target,)))
        signals = exporter.evaluate(exporter.states["t"], ScrapeResult(text, None, 0.01), 10.0)
        assert signals.up and signals.error is None
        results.append(signals.total)
    plain, read_quoted = results
    assert read_quoted.running == plain.running == 8.0
    assert read_quoted.waiting == plain.waiting == 32.0
    assert read_quoted.diagnosis == plain.diagnosis
