"""The parser against prometheus_client's on every real payload, and its edge cases."""

from __future__ import annotations

import math

import pytest
from prometheus_client.parser import text_string_to_metric_families

from batchscope.exporter.engines import ADAPTERS
from batchscope.exporter.ingest import promtext
from tests.support.paths import FIXTURES, fixture_text

PAYLOADS = sorted(p.name for p in FIXTURES.glob("*.txt"))


def _reference(text: str, families: set[str] | None = None) -> list[tuple]:
    """prometheus_client's samples as (name, labels, value, timestamp).

    prometheus_client renames the samples of a counter whose TYPE line lacks `_total`
    (Triton's `nv_inference_count`) to `..._total`; on the wire, and in our parser,
    they keep their name. That documented munge is undone here, nothing else.
    """
    out = []
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            name = s.name
            if (
                family.type == "counter"
                and name == family.name + "_total"
                and (f"\n{family.name}{{" in text or f"\n{family.name} " in text)
            ):
                name = family.name
            out.append((name, s.labels, s.value, s.timestamp))
    if families is not None:
        wanted = promtext.wanted_names(families)
        out = [s for s in out if s[0] in wanted]
    return out


def _ours(text: str, families=None) -> list[tuple]:
    return [(s.name, dict(s.labels), s.value, s.timestamp) for s in promtext.parse(text, families)]


def _same(a: list[tuple], b: list[tuple]) -> bool:
    def norm(rows):
        return [(n, lab, "NaN" if math.isnan(v) else float(v), t) for n, lab, v, t in rows]

    return norm(a) == norm(b)


@pytest.mark.parametrize("payload", PAYLOADS)
def test_all_samples_identical_to_prometheus_client(payload: str) -> None:
    text = fixture_text(payload)
    ours, theirs = _ours(text), _reference(text)
    assert len(ours) == len(theirs) > 0
    assert _same(ours, theirs)


@pytest.mark.parametrize("payload", PAYLOADS)
@pytest.mark.parametrize("engine", sorted(ADAPTERS))
def test_selective_read_equals_reference_filtered_to_the_same_families(
    payload: str, engine: str
) -> None:
    text = fixture_text(payload)
    families = set(ADAPTERS[engine].FAMILIES)
    assert _same(_ours(text, families), _reference(text, families))


def test_selective_read_of_vllm_load_payload_keeps_only_wanted_families(vllm_load: str) -> None:
    samples = promtext.parse(vllm_load, ["vllm:num_requests_running", "vllm:num_preemptions"])
    assert [(s.name, s.value) for s in samples] == [
        ("vllm:num_requests_running", 8.0),
        ("vllm:num_preemptions_total", 0.0),
        ("vllm:num_preemptions_created", 1.7959880848734555e09),
    ]


EDGE = r"""# HELP empty_family A family with HELP and TYPE and no samples.
# TYPE empty_family counter
# HELP esc Escapes in label values.
# TYPE esc gauge
esc{path="C:\\dir",quote="say \"hi\"",nl="a\nb",brace="}{,="} 1
special{kind="nan"} NaN
special{kind="pos"} +Inf
special{kind="neg"} -Inf
stamped{a="b"} 3.5 1700000000123
  indented 7
no_labels 1e-3
tabbed	5
spaced { a = "x" , b="y" , } 2
"""


def test_edge_cases_match_prometheus_client() -> None:
    assert _same(_ours(EDGE), _reference(EDGE))


def test_edge_case_values_are_decoded() -> None:
    by_name = {}
    for s in promtext.parse(EDGE):
        by_name.setdefault(s.name, []).append(s)
    esc = by_name["esc"][0]
    assert esc.labels == {"path": "C:\\dir", "quote": 'say "hi"', "nl": "a\nb", "brace": "}{,="}
    values = [s.value for s in by_name["special"]]
    assert math.isnan(values[0]) and values[1] == math.inf and values[2] == -math.inf
    assert by_name["stamped"][0].timestamp == pytest.approx(1_700_000_000.123)
    assert by_name["indented"][0].value == 7.0
    assert by_name["tabbed"][0].value == 5.0
    assert by_name["spaced"][0].labels == {"a": "x", "b": "y"}
    assert "empty_family" not in by_name


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ('bad{a="x" 1', "unclosed label set"),
        ("bad{a=x} 1", "malformed label"),
        ("bad 1 2 3", "expected a value"),
        ("bad one", "could not convert"),
        ("bad 1_000", "invalid number"),
    ],
)
def test_malformed_wanted_line_raises_with_its_line_number(line: str, reason: str) -> None:
    text = f"# TYPE good gauge\ngood 1\n{line}\n"
    with pytest.raises(promtext.ParseError, match=reason) as err:
        promtext.parse(text, ["bad"])
    assert err.value.line_number == 3


def test_malformed_line_of_an_unwanted_family_is_skipped() -> None:
    assert [s.value for s in promtext.parse("good 1\nbad{a=x} 1\n", ["good"])] == [1.0]


def test_html_error_page_yields_no_samples_of_wanted_families() -> None:
    page = "<html><body><h1>502 Bad Gateway</h1></body></html>\n"
    assert promtext.parse(page, ["vllm:num_requests_running"]) == []
