"""The batchscope dashboards, built with Grafana's typed builders (grafana-foundation-sdk).

Fleet overview and vLLM batching come in two fillings from one definition: from the
exporter's `batchscope_*` series, or from the recording rules over vLLM's raw series
(`grafana/prometheus/vllm-rules.yml`), for a fleet that outgrows one exporter. Latency
quantiles and the output-length heatmap read vLLM's histograms in both. The in-house
batcher dashboard reads the batcher's own series and the exporter's.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from batchscope.grafana.boards.common import EXPORTER, RULES
from batchscope.grafana.boards.fleet_overview import fleet_overview
from batchscope.grafana.boards.inhouse_batcher import inhouse_batcher
from batchscope.grafana.boards.vllm_batching import vllm_batching

DASHBOARDS: dict[str, Callable[[Mapping], dict]] = {
    "fleet-overview": lambda config: fleet_overview(EXPORTER, config),
    "fleet-overview-rules": lambda config: fleet_overview(RULES, config),
    "vllm-batching": lambda config: vllm_batching(EXPORTER, config),
    "vllm-batching-rules": lambda config: vllm_batching(RULES, config),
    "inhouse-batcher": inhouse_batcher,
}
