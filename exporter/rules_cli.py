"""`batchscope-rules`: the per-target cap, budgets and SLO as Prometheus recording rules."""

from __future__ import annotations

import argparse
import sys

import yaml

from batchscope.exporter.alerts.fleet_rules import UnsupportedTarget, fleet_rule_groups
from batchscope.exporter.config.file_sd import expand_file_sd
from batchscope.exporter.config.fleet_file import load_config, load_file_sd
from batchscope.exporter.config.settings import ConfigError

EPILOG = """examples:
  batchscope-rules --config fleet.yaml > /etc/prometheus/rules/batchscope-targets.yml
  promtool check rules /etc/prometheus/rules/batchscope-targets.yml

Load the output beside grafana/prometheus/vllm-rules.yml. Prometheus must scrape each
vLLM with a `target` label equal to the target's name in fleet.yaml
(grafana/prometheus/prometheus.yml shows how)."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="batchscope-rules",
        description="Write each target's cap (--max-num-seqs), token and latency budgets and "
        "SLO objective (with the latency histogram's bucket edges around the budget), and the "
        "replica count's bounds (min_replicas, max_replicas, models:), from the "
        "exporter's config file as Prometheus recording rules.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--config",
        required=True,
        metavar="FLEET_YAML",
        help="the exporter's config file (targets: and file_sd:)",
    )
    parser.add_argument("--output", metavar="PATH", help="write here instead of stdout")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        settings = load_config(args.config)
        targets = list(settings.targets)
        for path in expand_file_sd(settings.file_sd):
            targets.extend(load_file_sd(path))
        text = yaml.safe_dump(fleet_rule_groups(targets, settings), sort_keys=False)
    except (ConfigError, UnsupportedTarget) as err:
        parser.exit(2, f"batchscope-rules: error: {err}\n")
    if args.output:
        with open(args.output, "w", encoding="utf-8") as out:
            out.write(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
