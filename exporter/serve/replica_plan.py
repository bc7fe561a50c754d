"""The replica count's state between rounds: each model's held count, and each target's
models as last read. After every round the app hands it the targets' latest signals and
the time (`step`); the math is `exporter.core.replicas`'."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from batchscope.exporter.config.settings import Settings, Target
from batchscope.exporter.core.evaluate import TargetSignals
from batchscope.exporter.core.replicas import (
    HeldCount,
    ModelReplicas,
    ReplicaBounds,
    ReplicaSettings,
    plan_round,
    seen_models,
)
from batchscope.exporter.scrape.loop import stale_seconds


def replica_settings(settings: Settings) -> ReplicaSettings:
    """How counts are made and held, from the exporter's settings: the bounds (per model
    from `models:`), the saturation hold up, the scale-down window, the staleness."""
    default = ReplicaBounds(settings.min_replicas, settings.max_replicas)
    return ReplicaSettings(
        default=default,
        bounds={
            model: ReplicaBounds(
                default.min_replicas if low is None else low,
                default.max_replicas if high is None else high,
            )
            for model, low, high in settings.models
        },
        scale_up_seconds=settings.hold_seconds,
        scale_down_seconds=settings.scale_down_seconds,
        stale_seconds=stale_seconds(settings),
    )


class ReplicaPlanner:
    """Each model's replica count, stepped once a round."""

    def __init__(self, settings: Settings) -> None:
        self.settings = replica_settings(settings)
        self.latest: tuple[ModelReplicas, ...] = ()
        self._held: dict[str, HeldCount] = {}
        self._seen: dict[str, tuple[tuple[str, Mapping[str, str]], ...]] = {}

    def step(
        self, targets: Sequence[TargetSignals], monitored: Iterable[Target], now: float
    ) -> tuple[ModelReplicas, ...]:
        """The counts after a round: `targets`' latest signals, `monitored` the targets
        configured now (their `model`), at `now`."""
        configured = {t.name: t.model for t in monitored}
        self._seen = {
            name: seen for name, seen in self._seen.items() if name in configured
        } | seen_models(targets, configured)
        self.latest = plan_round(targets, configured, self._seen, self._held, now, self.settings)
        self._held = {m.count.model: m.held for m in self.latest}
        return self.latest
