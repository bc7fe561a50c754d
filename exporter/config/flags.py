"""The exporter's command line: its configuration flags, and Settings from them.

One `--target` with its flags, or `--config FILE` with the settings flags overriding
the file's values. Every check is the configuration's (`exporter.config.settings`), so a value
is refused with the same words whether it came from a flag or a file.
"""

from __future__ import annotations

import argparse
from dataclasses import fields

from exporter.config.settings import (
    DEFAULT_TIMEOUT_SECONDS,
    SETTINGS_FLAGS,
    ConfigError,
    Settings,
    Target,
    load_config,
    settings_from_values,
    target_from_values,
)
from exporter.engines import engine_choices, latency_kinds

# Flags that describe the single --target, by Target field.
_TARGET_FLAGS = {
    "url": "--target",
    "name": "--name",
    "engine": "--engine",
    "cap": "--cap",
    "token_cap": "--token-cap",
    "max_num_batched_tokens": "--max-num-batched-tokens",
    "budget_seconds": "--budget-seconds",
    "quantile": "--quantile",
    "histogram": "--histogram",
}


def _dest(flag: str) -> str:
    return flag.removeprefix("--").replace("-", "_")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the exporter's configuration flags; every default is None ("not given").

    Help texts show the effective defaults, which `settings_from_args` applies.
    """
    target = {f.name: f.default for f in fields(Target)}
    setting = {f.name: f.default for f in fields(Settings)}
    group = parser.add_argument_group("target (one server; use --config for a fleet)")
    group.add_argument(
        "--target",
        metavar="URL",
        help="metrics URL, e.g. http://127.0.0.1:8000/metrics (no path: /metrics)",
    )
    group.add_argument(
        "--name", help="name in metrics and dashboards (default: the URL's host:port)"
    )
    group.add_argument(
        "--engine",
        choices=engine_choices(),
        help=f"server kind (default: {target['engine']}, detected from metric names)",
    )
    group.add_argument(
        "--cap",
        type=float,
        metavar="N",
        help="max concurrent sequences (vLLM --max-num-seqs); "
        "without it running/cap is not reported",
    )
    group.add_argument(
        "--token-cap",
        type=float,
        metavar="N",
        help="token budget of the running batch (TGI --max-batch-total-tokens): "
        "a token cap, reported beside the request cap",
    )
    group.add_argument(
        "--max-num-batched-tokens",
        type=float,
        metavar="N",
        help="tokens one engine step may carry (vLLM --max-num-batched-tokens, which vLLM "
        "does not expose); without it the token budget is not judged",
    )
    group.add_argument(
        "--budget-seconds",
        type=float,
        metavar="S",
        help="latency budget; without it budget utilisation is not reported",
    )
    group.add_argument(
        "--quantile",
        type=float,
        metavar="Q",
        help=f"latency quantile compared with the budget (default: {target['quantile']})",
    )
    group.add_argument(
        "--histogram",
        choices=latency_kinds(),
        help=f"latency histogram the quantile is taken from (default: {target['histogram']})",
    )
    group = parser.add_argument_group("fleet and exporter")
    group.add_argument(
        "--config",
        metavar="FILE",
        help="YAML file with targets:, file_sd: and the settings below; "
        "flags given beside it override its values",
    )
    group.add_argument(
        "--listen",
        metavar="HOST:PORT",
        help=f"address to serve on (default: {setting['listen']}; ':PORT' also binds 127.0.0.1)",
    )
    group.add_argument(
        "--interval",
        type=float,
        metavar="S",
        help=f"seconds between scrapes (default: {setting['interval_seconds']:g})",
    )
    group.add_argument(
        "--window-seconds",
        type=float,
        metavar="S",
        help=f"window for rates and quantiles (default: {setting['window_seconds']:g})",
    )
    group.add_argument(
        "--saturation-threshold",
        type=float,
        metavar="U",
        help="budget utilisation counted as saturated "
        f"(default: {setting['saturation_threshold']:g})",
    )
    group.add_argument(
        "--hold-seconds",
        type=float,
        metavar="S",
        help="how long saturation must last before it is reported "
        f"(default: {setting['hold_seconds']:g})",
    )
    group.add_argument(
        "--timeout-seconds",
        type=float,
        metavar="S",
        help=f"scrape timeout (default: {DEFAULT_TIMEOUT_SECONDS:g}, whatever the interval: a "
        "slow scrape delays the target's next one, scrapes never overlap)",
    )
    group.add_argument(
        "--max-response-bytes",
        type=int,
        metavar="N",
        help=f"largest /metrics body accepted (default: {setting['max_response_bytes']})",
    )
    group.add_argument(
        "--sample-limit",
        type=int,
        metavar="N",
        help="most samples of the engine's metrics one payload may hold, else the target "
        f"is down, as Prometheus's sample_limit (default: {setting['sample_limit']})",
    )
    group.add_argument(
        "--shard",
        metavar="K/N",
        help="monitor only the targets whose name hashes to K modulo N (Prometheus's "
        "hashmod): N exporters with 0/N .. N-1/N share one fleet file",
    )
    group = parser.add_argument_group(
        "the exporter's own endpoints (off by default; advised beyond 127.0.0.1)"
    )
    group.add_argument(
        "--web-token-env",
        metavar="NAME",
        help="environment variable holding a bearer token every request but /health must carry",
    )
    group.add_argument(
        "--web-token-file", metavar="PATH", help="file holding that token (instead of the env)"
    )
    group.add_argument("--tls-cert-file", metavar="PATH", help="serve HTTPS with this cert (PEM)")
    group.add_argument("--tls-key-file", metavar="PATH", help="and this private key (PEM)")
    group = parser.add_argument_group("history and alerts")
    group.add_argument(
        "--history-points",
        type=int,
        metavar="N",
        help="evaluations kept per target for /api/v1/history "
        f"(default: {setting['history_points']})",
    )
    group.add_argument(
        "--alertmanager-url",
        metavar="URL",
        help="post sustained saturation, memory-bound, stalled and target-down alerts to "
        "this Alertmanager (its base URL, e.g. http://127.0.0.1:9093), without Prometheus",
    )


def settings_from_args(args: argparse.Namespace) -> Settings:
    """Settings from parsed flags: `--config FILE` plus overriding flags, or one --target.

    Target flags (--target, --name, --engine, --cap, ...) cannot be combined with
    --config, where targets are set in the file. Raises ConfigError, naming the flag.
    """
    target_given = {
        key: (getattr(args, _dest(flag), None), flag)
        for key, flag in _TARGET_FLAGS.items()
        if getattr(args, _dest(flag), None) is not None
    }
    settings_given = {
        key: (getattr(args, _dest(flag), None), flag)
        for key, flag in SETTINGS_FLAGS.items()
        if getattr(args, _dest(flag), None) is not None
    }
    config = getattr(args, "config", None)
    if config is not None:
        if target_given:
            key, (_, flag) = next(iter(target_given.items()))
            raise ConfigError(
                f"{flag}: cannot be combined with --config; set {key} on each target in {config}"
            )
        return load_config(config, {key: value for key, (value, _) in settings_given.items()})
    if "url" not in target_given:
        if target_given:
            _, flag = next(iter(target_given.values()))
            raise ConfigError(f"{flag}: describes --target URL, which is missing")
        raise ConfigError("no target: give --target URL or --config FILE")
    target = target_from_values(target_given)
    return settings_from_values(settings_given, (target,), ())
