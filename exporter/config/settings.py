"""The exporter's configuration model: Target and Settings, and how each field is given.

Each field of `Target` and `Settings` declares its check (`values`), its flag and its
help (`ConfigField`), so the YAML fleet file (`fleet_file`), the command line (`flags`)
and file_sd labels refuse a value with the same words. Every problem is a `ConfigError`
whose text is a complete message for the user, naming the file, the line, the key path
and what is wrong: `fleet.yaml:7: targets[1].cap: must be > 0 (got 0)`. Credentials are
never part of the configuration: it names an environment variable or a file, and the
scrape reads them (`scrape.authorization_header`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from dataclasses import KW_ONLY, MISSING, dataclass, field, fields
from typing import Any
from urllib.parse import urlsplit

from batchscope.exporter.config import values
from batchscope.exporter.config.line_numbered import Sourced
from batchscope.exporter.config.models import bounds_clash
from batchscope.exporter.config.values import DEFAULT_LISTEN_HOST
from batchscope.exporter.core.replicas import DEFAULT_SCALE_DOWN_SECONDS
from batchscope.exporter.core.signals import DEFAULT_HOLD_SECONDS, DEFAULT_INTERVAL_SECONDS
from batchscope.exporter.core.slo import DEFAULT_PERIOD_DAYS
from batchscope.exporter.engines import engine_choices, latency_kinds

# A model server's /metrics slows down when it is overloaded (seconds, on a real vLLM:
# docs/benchmarks.md): the default timeout is Prometheus's own, whatever the interval.
DEFAULT_TIMEOUT_SECONDS = 10.0


class ConfigError(ValueError):
    """A configuration problem; `str()` is the whole user-facing message."""


@dataclass(frozen=True, repr=False)
class Auth:
    """Where a target's credentials live; the scrape reads them (`scrape.authorization_header`).

    `type` is "bearer" (one of `token_env`, `token_file`) or "basic" (`username` and one
    of `password_env`, `password_file`).
    """

    type: str
    token_env: str | None = None
    token_file: str | None = None
    username: str | None = None
    password_env: str | None = None
    password_file: str | None = None

    def __repr__(self) -> str:
        # Only where the secret lives is shown; the secret itself is never held here.
        shown = ", ".join(
            f"{f.name}={getattr(self, f.name)!r}"
            for f in fields(self)
            if getattr(self, f.name) is not None
        )
        return f"Auth({shown})"


# ---------------------------------------------------------------- the fields

# Where a field's flag is listed in --help.
TARGET_GROUP = "target (one server; use --config for a fleet)"
FLEET_GROUP = "fleet and exporter"
ENDPOINTS_GROUP = "the exporter's own endpoints (off by default; advised beyond 127.0.0.1)"
HISTORY_GROUP = "history and alerts"
REPLICAS_GROUP = "replica count (per model)"


@dataclass(frozen=True)
class ConfigField:
    """How one field of `Target` or `Settings` is given: the check every source's value
    passes (YAML, a flag, a file_sd label), its flag and help, and its place in --help.

    `help` may name `{default}`, the field's default as --help shows it (`shown_default`
    where the field's own default is None and something else applies). `type` is
    argparse's for the flag (a number flag's value is a number before the check). A
    target field with `file_sd` is also a file_sd label that configures the target; the
    label's text is read as a number where `type` is a number.
    """

    parse: Callable[[object], Any]
    flag: str
    help: str
    metavar: str | None = None
    type: type | None = None
    choices: Callable[[], tuple[str, ...]] | None = None
    group: str = TARGET_GROUP
    file_sd: bool = True
    shown_default: object = None


def _configured(default: object, **spec: Any) -> Any:
    """A dataclass field with its `ConfigField` (`config_fields` reads it)."""
    return field(default=default, metadata={"config": ConfigField(**spec)})


def config_fields(cls: type) -> dict[str, ConfigField]:
    """The configurable fields of `Target` or `Settings` by name, in declaration order."""
    return {f.name: f.metadata["config"] for f in fields(cls) if "config" in f.metadata}


def field_defaults(cls: type) -> dict[str, object]:
    return {f.name: f.default for f in fields(cls)}


@dataclass(frozen=True)
class Target:
    """One server to scrape and how to judge its batching."""

    name: str = _configured(
        MISSING,
        parse=values.name,
        flag="--name",
        help="name in metrics and dashboards (default: the URL's host:port)",
        file_sd=False,
    )
    url: str = _configured(
        MISSING,
        parse=values.url,
        flag="--target",
        metavar="URL",
        help="metrics URL, e.g. http://127.0.0.1:8000/metrics (no path: /metrics)",
        file_sd=False,
    )
    # Every setting after the name and URL by keyword: a field added among them never
    # shifts the meaning of a positional argument.
    _: KW_ONLY
    engine: str = _configured(
        "auto",
        parse=values.engine,
        flag="--engine",
        choices=engine_choices,
        help="server kind (default: {default}, detected from metric names)",
    )
    cap: float | None = _configured(
        None,
        parse=values.cap,
        flag="--cap",
        type=float,
        metavar="N",
        help="max concurrent sequences (vLLM --max-num-seqs); "
        "without it running/cap is not reported",
    )
    # A token budget for the running batch (TGI's --max-batch-total-tokens), beside `cap`.
    token_cap: float | None = _configured(
        None,
        parse=values.positive,
        flag="--token-cap",
        type=float,
        metavar="N",
        help="token budget of the running batch (TGI --max-batch-total-tokens): "
        "a token cap, reported beside the request cap",
    )
    # The tokens one engine step may carry (vLLM's --max-num-batched-tokens).
    max_num_batched_tokens: float | None = _configured(
        None,
        parse=values.positive,
        flag="--max-num-batched-tokens",
        type=float,
        metavar="N",
        help="tokens one engine step may carry (vLLM --max-num-batched-tokens, which vLLM "
        "does not expose); without it the token budget is not judged",
    )
    budget_seconds: float | None = _configured(
        None,
        parse=values.positive,
        flag="--budget-seconds",
        type=float,
        metavar="S",
        help="latency budget; without it budget utilisation is not reported",
    )
    quantile: float = _configured(
        0.99,
        parse=values.quantile,
        flag="--quantile",
        type=float,
        metavar="Q",
        help="latency quantile compared with the budget (default: {default})",
    )
    histogram: str = _configured(
        "e2e",
        parse=values.histogram,
        flag="--histogram",
        choices=latency_kinds,
        help="latency histogram the quantile is taken from (default: {default})",
    )
    slo_objective: float | None = _configured(
        None,
        parse=values.quantile,
        flag="--slo-objective",
        type=float,
        metavar="SHARE",
        help="share of requests promised within the latency budget, e.g. 0.99: burn rates, "
        "error budget and the SLO burn alerts (default: none, no SLO)",
    )
    # The model it serves, where the engine's labels do not say (or say it differently):
    # the replica count groups targets by it.
    model: str | None = _configured(
        None,
        parse=values.name,
        flag="--model",
        metavar="NAME",
        help="the model this target serves, for the replica count (default: the engine's "
        "model_name label)",
    )
    auth: Auth | None = None
    labels: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Settings:
    """Everything the exporter runs with.

    `timeout_seconds` left as None becomes DEFAULT_TIMEOUT_SECONDS, whatever the interval:
    scrapes of one target never overlap, so a scrape slower than the interval only delays
    that target's next one, where a timeout would have made it a gap.
    `file_sd` holds paths or globs, already resolved against the config file's folder.
    """

    targets: tuple[Target, ...]
    file_sd: tuple[str, ...] = ()
    listen: str = _configured(
        f"{DEFAULT_LISTEN_HOST}:9500",
        parse=values.listen,
        flag="--listen",
        metavar="HOST:PORT",
        group=FLEET_GROUP,
        help="address to serve on (default: {default}; ':PORT' also binds 127.0.0.1)",
    )
    interval_seconds: float = _configured(
        DEFAULT_INTERVAL_SECONDS,
        parse=values.positive,
        flag="--interval",
        type=float,
        metavar="S",
        group=FLEET_GROUP,
        help="seconds between scrapes (default: {default:g})",
    )
    window_seconds: float = _configured(
        60.0,
        parse=values.positive,
        flag="--window-seconds",
        type=float,
        metavar="S",
        group=FLEET_GROUP,
        help="window for rates and quantiles (default: {default:g})",
    )
    saturation_threshold: float = _configured(
        0.95,
        parse=values.threshold,
        flag="--saturation-threshold",
        type=float,
        metavar="U",
        group=FLEET_GROUP,
        help="budget utilisation counted as saturated (default: {default:g})",
    )
    hold_seconds: float = _configured(
        DEFAULT_HOLD_SECONDS,
        parse=values.non_negative,
        flag="--hold-seconds",
        type=float,
        metavar="S",
        group=FLEET_GROUP,
        help="how long saturation must last before it is reported (default: {default:g})",
    )
    timeout_seconds: float | None = _configured(
        None,
        parse=values.positive,
        flag="--timeout-seconds",
        type=float,
        metavar="S",
        group=FLEET_GROUP,
        shown_default=DEFAULT_TIMEOUT_SECONDS,
        help="scrape timeout (default: {default:g}, whatever the interval: a "
        "slow scrape delays the target's next one, scrapes never overlap)",
    )
    max_response_bytes: int = _configured(
        8 * 1024 * 1024,
        parse=values.count,
        flag="--max-response-bytes",
        type=int,
        metavar="N",
        group=FLEET_GROUP,
        help="largest /metrics body accepted (default: {default})",
    )
    history_points: int = _configured(
        720,
        parse=values.count,
        flag="--history-points",
        type=int,
        metavar="N",
        group=HISTORY_GROUP,
        help="evaluations kept per target for /api/v1/history (default: {default})",
    )
    # Where the exporter posts its own alerts (Alertmanager's base URL); None: it does not.
    alertmanager_url: str | None = _configured(
        None,
        parse=values.http_url,
        flag="--alertmanager-url",
        metavar="URL",
        group=HISTORY_GROUP,
        help="post sustained saturation, memory-bound, stalled, target-down and SLO burn "
        "alerts to this Alertmanager (its base URL, e.g. http://127.0.0.1:9093), without Prometheus",
    )
    slo_period_days: float = _configured(
        DEFAULT_PERIOD_DAYS,
        parse=values.positive,
        flag="--slo-period-days",
        type=float,
        metavar="D",
        group=HISTORY_GROUP,
        help="compliance period of the targets' SLO objectives: the error budget is "
        "counted over it (default: {default:g} days)",
    )
    slo_window_scale: float = _configured(
        1.0,
        parse=values.scale,
        flag="--slo-window-scale",
        type=float,
        metavar="X",
        group=HISTORY_GROUP,
        help="multiply every SLO burn-rate window (1h/5m, 6h/30m, 3d/6h) by this, to try "
        "the burn alerts out in minutes, e.g. 0.01 (default: {default:g})",
    )
    # Samples of the engine's families one payload may hold, as Prometheus's sample_limit.
    sample_limit: int = _configured(
        50_000,
        parse=values.count,
        flag="--sample-limit",
        type=int,
        metavar="N",
        group=FLEET_GROUP,
        help="most samples of the engine's metrics one payload may hold, else the target "
        "is down, as Prometheus's sample_limit (default: {default})",
    )
    # The exporter's own endpoints: a bearer token every request but /health must carry
    # (where it lives, never the token), and TLS. Both off by default, on 127.0.0.1.
    web_token_env: str | None = _configured(
        None,
        parse=values.env_name,
        flag="--web-token-env",
        metavar="NAME",
        group=ENDPOINTS_GROUP,
        help="environment variable holding a bearer token every request but /health must carry",
    )
    web_token_file: str | None = _configured(
        None,
        parse=values.text,
        flag="--web-token-file",
        metavar="PATH",
        group=ENDPOINTS_GROUP,
        help="file holding that token (instead of the env)",
    )
    tls_cert_file: str | None = _configured(
        None,
        parse=values.text,
        flag="--tls-cert-file",
        metavar="PATH",
        group=ENDPOINTS_GROUP,
        help="serve HTTPS with this cert (PEM)",
    )
    tls_key_file: str | None = _configured(
        None,
        parse=values.text,
        flag="--tls-key-file",
        metavar="PATH",
        group=ENDPOINTS_GROUP,
        help="and this private key (PEM)",
    )
    # "K/N": this exporter keeps the targets whose name hashes to K modulo N (`in_shard`).
    shard: str | None = _configured(
        None,
        parse=values.shard,
        flag="--shard",
        metavar="K/N",
        group=FLEET_GROUP,
        help="monitor only the targets whose name hashes to K modulo N (Prometheus's "
        "hashmod): N exporters with 0/N .. N-1/N share one fleet file",
    )

    min_replicas: int = _configured(
        1,
        parse=values.min_replicas,
        flag="--min-replicas",
        type=int,
        metavar="N",
        group=REPLICAS_GROUP,
        help="fewest replicas recommended for a model, and the count while it is idle "
        "(default: {default}; per model: models: in the fleet file)",
    )
    max_replicas: int | None = _configured(
        None,
        parse=values.count,
        flag="--max-replicas",
        type=int,
        metavar="N",
        group=REPLICAS_GROUP,
        help="most replicas recommended for a model (default: none; per model: models: in "
        "the fleet file)",
    )
    scale_down_seconds: float = _configured(
        DEFAULT_SCALE_DOWN_SECONDS,
        parse=values.non_negative,
        flag="--scale-down-seconds",
        type=float,
        metavar="S",
        group=REPLICAS_GROUP,
        help="how long a lower replica count must hold before it is recommended (default: "
        "{default:g}; a higher one holds for --hold-seconds)",
    )
    replica_count: str = _configured(
        "auto",
        parse=values.replica_count,
        flag="--replica-count",
        choices=lambda: values.REPLICA_COUNTS,
        group=REPLICAS_GROUP,
        help="publish each model's replica count: off where this exporter sees part of a "
        "model's replicas (a sidecar, one pod; a shard), so N exporters never publish one "
        "model's count N times (default: {default}: on, off with --shard)",
    )
    # Per model (the fleet file's `models:`): (model, min_replicas, max_replicas), each
    # None where the model takes the setting above.
    models: tuple[tuple[str, int | None, int | None], ...] = ()

    @property
    def counts_replicas(self) -> bool:
        """Whether this exporter publishes replica counts (`replica_count`)."""
        if self.replica_count == "auto":
            return self.shard is None
        return self.replica_count == "on"

    def in_shard(self, name: str) -> bool:
        """Whether this exporter monitors the target `name`: always without a shard, else
        when md5(name)'s last 8 bytes modulo N are K, as Prometheus's hashmod computes."""
        if self.shard is None:
            return True
        index, count = (int(part) for part in self.shard.split("/"))
        digest = hashlib.md5(name.encode(), usedforsecurity=False).digest()
        return int.from_bytes(digest[8:], "big") % count == index

    def __post_init__(self) -> None:
        if self.timeout_seconds is None:
            object.__setattr__(self, "timeout_seconds", DEFAULT_TIMEOUT_SECONDS)

    def listen_host_port(self) -> tuple[str, int]:
        """The address to bind: host (IPv6 without brackets) and port."""
        try:
            host, port = values.split_host_port(self.listen)
        except values.Invalid as err:
            raise ConfigError(f"listen: {err}") from None
        return host or DEFAULT_LISTEN_HOST, port


_TARGET_CONFIG = config_fields(Target)
_SETTINGS_CONFIG = config_fields(Settings)
# Parsers by key, shared by the YAML file, the command line and file_sd labels.
TARGET_PARSERS: dict[str, Callable[[object], Any]] = {
    key: spec.parse for key, spec in _TARGET_CONFIG.items()
}
SETTINGS_PARSERS: dict[str, Callable[[object], Any]] = {
    key: spec.parse for key, spec in _SETTINGS_CONFIG.items()
}
TARGET_FLAGS = {key: spec.flag for key, spec in _TARGET_CONFIG.items()}
SETTINGS_FLAGS = {key: spec.flag for key, spec in _SETTINGS_CONFIG.items()}


def parse_values(
    raw: Mapping[str, Sourced], parsers: Mapping[str, Callable[[object], Any]]
) -> dict:
    """Each value checked by its key's parser; a failed check is a ConfigError naming the
    value's origin."""
    parsed = {}
    for key, (value, origin) in raw.items():
        try:
            parsed[key] = parsers[key](value)
        except values.Invalid as err:
            raise ConfigError(f"{origin}: {err}") from None
    return parsed


def target_from_parsed(parsed: dict[str, Any]) -> Target:
    """A Target from checked values by field; without a name it is the URL's host:port."""
    parsed.setdefault("name", urlsplit(parsed["url"]).netloc)
    return Target(**parsed)


def target_from_values(given: Mapping[str, Sourced]) -> Target:
    """A Target from sourced values by field (`url` required); ConfigError names the origin."""
    return target_from_parsed(parse_values(given, TARGET_PARSERS))


def settings_from_values(
    raw: Mapping[str, Sourced],
    targets: tuple[Target, ...],
    file_sd: tuple[str, ...],
    models: tuple[tuple[str, int | None, int | None], ...] = (),
) -> Settings:
    """Settings from sourced values, checked one by one and against each other."""
    parsed = parse_values(raw, SETTINGS_PARSERS)
    settings = Settings(targets=targets, file_sd=file_sd, models=models, **parsed)
    origins = {key: origin for key, (_, origin) in raw.items()}
    low, high = settings.min_replicas, settings.max_replicas
    if high is not None and high < low:
        given = "max_replicas" if "max_replicas" in origins else "min_replicas"
        raise ConfigError(f"{origins[given]}: max_replicas {high} is below min_replicas {low}")
    clash = bounds_clash(low, high, settings.models)
    if clash is not None:
        raise ConfigError(clash)
    interval = settings.interval_seconds
    if settings.window_seconds < interval:
        if "window_seconds" in origins:
            raise ConfigError(
                f"{origins['window_seconds']}: must be >= interval_seconds ({interval:g}), "
                f"a window holds at least one scrape (got {settings.window_seconds:g})"
            )
        raise ConfigError(
            f"{origins['interval_seconds']}: must be <= window_seconds "
            f"({settings.window_seconds:g}, the default) (got {interval:g})"
        )
    if settings.web_token_env is not None and settings.web_token_file is not None:
        raise ConfigError(
            f"{origins['web_token_file']}: give web_token_env or web_token_file, not both"
        )
    if (settings.tls_cert_file is None) != (settings.tls_key_file is None):
        given = "tls_cert_file" if settings.tls_cert_file is not None else "tls_key_file"
        raise ConfigError(f"{origins[given]}: TLS needs both tls_cert_file and tls_key_file")
    return settings
