"""The JSON bodies: the same document, byte for byte, as the API's plain definition
(dataclasses.asdict and a walk replacing NaN), on real and randomised signals."""

from __future__ import annotations

import json
import math

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from batchscope.exporter.config.settings import Settings
from batchscope.exporter.core.evaluate import TargetSignals
from batchscope.exporter.serve import api_json as api
from tests.support.reference_json import (
    reference_advice_json,
    reference_encode,
    reference_series_json,
)
from tests.support.signals_data import target_signals


def test_nan_and_infinities_anywhere_in_a_body_become_null() -> None:
    body = {"a": [1.5, math.nan, (math.inf, 2)], "b": {"c": -math.inf, "d": "NaN"}, "e": 0.25}
    assert json.loads(api.encode(body)) == {
        "a": [1.5, None, [None, 2]],
        "b": {"c": None, "d": "NaN"},
        "e": 0.25,
    }
    assert api.encode({"x": [1.0, {"y": 2}]}) == b'{"x": [1.0, {"y": 2}]}'


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(target_signals(), max_size=3))
def test_signals_and_advice_bodies_are_the_plain_definitions_byte_for_byte(
    targets: list[TargetSignals],
) -> None:
    for series in (s for t in targets for s in (*t.series, t.total)):
        expected = reference_encode({"series": reference_series_json(series)})
        assert api.encode({"series": api.series_json(series)}) == expected
        expected = reference_encode({"advice": reference_advice_json(series.advice)})
        assert api.encode({"advice": api.advice_json(series)}) == expected
    body = api.signals_response(12.5, targets, api.evaluation_json(Settings(targets=())))
    assert api.encode(body) == reference_encode(body)
    assert json.loads(api.encode(body))["targets"] == [
        json.loads(reference_encode(api.target_json(t))) for t in targets
    ]
