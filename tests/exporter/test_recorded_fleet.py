"""Every body the exporter serves over a recorded fleet is the one recorded, byte for byte
(tests/support/recorded_fleet.py): a change meant only to make the exporter faster changes
none of /metrics, the JSON API and the history, at any step."""

from __future__ import annotations

import json

from tests.support.recorded_fleet import BODIES, REFERENCE, STEPS, digests


def test_every_body_at_every_step_of_a_recorded_fleet_is_the_recorded_one() -> None:
    recorded = json.loads(REFERENCE.read_text(encoding="utf-8"))["steps"]
    found = digests()
    assert len(found) == len(recorded) == STEPS
    differing = [
        (step, name)
        for step, (now, then) in enumerate(zip(found, recorded, strict=True))
        for name in BODIES
        if now.get(name) != then.get(name)
    ]
    assert differing == []
