"""The exporter's configuration: its model, the checks on every value, the YAML fleet file.

Pure parsing and validation (it reads the files it is given, nothing else). Every
problem is a `ConfigError` whose text is a complete message for the user, naming the
file, the line, the key path and what is wrong: `fleet.yaml:7: targets[1].cap: must
be > 0 (got 0)`. Credentials are never part of the configuration: it names an
environment variable or a file, and the scrape reads them (`scrape.authorization_header`).
The files are read by `located` (line numbers) and `file_sd` (target groups); the
command line is `flags`.
"""

from __future__ import annotations

import hashlib
import ipaddress
import math
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import KW_ONLY, MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urlsplit, urlunsplit

from batchscope.exporter.config.file_sd import expand_file_sd, read_labels, read_target_groups
from batchscope.exporter.config.line_numbered import (
    DocumentError,
    Node,
    Sourced,
    as_written,
    child_path,
    location,
    mapping,
    read_document,
    sequence,
    wrong_type,
)
from batchscope.exporter.config.models import NO_ZERO, bounds_clash, read_models
from batchscope.exporter.config.reserved_labels import RESERVED_LABELS
from batchscope.exporter.core.replicas import DEFAULT_SCALE_DOWN_SECONDS
from batchscope.exporter.core.signals import DEFAULT_HOLD_SECONDS, DEFAULT_INTERVAL_SECONDS
from batchscope.exporter.core.slo import DEFAULT_PERIOD_DAYS
from batchscope.exporter.engines import engine_choices, latency_kinds

DEFAULT_LISTEN_HOST = "127.0.0.1"
# A model server's /metrics slows down when it is overloaded (seconds, on a real vLLM:
# docs/benchmarks.md): the default timeout is Prometheus's own, whatever the interval.
DEFAULT_TIMEOUT_SECONDS = 10.0


class ConfigError(ValueError):
    """A configuration problem; `str()` is the whole user-facing message."""


@contextmanager
def _as_config_error() -> Iterator[None]:
    """A file the reader cannot read, or of the wrong structure, is a configuration error."""
    try:
        yield
    except DocumentError as err:
        raise ConfigError(str(err)) from None


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


# ---------------------------------------------------------------- value checks


class _Invalid(Exception):
    """A value failed its check; the caller says where the value came from."""


def _wrong_type(value: object, expected: str) -> _Invalid:
    return _Invalid(wrong_type(value, expected))


def _finite_number(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _wrong_type(value, "a number")
    try:
        number = float(value)
    except OverflowError:
        number = math.inf
    if not math.isfinite(number):
        raise _Invalid(f"must be a finite number (got {as_written(value)})")
    return number


def _positive(value: object) -> float:
    number = _finite_number(value)
    if number <= 0:
        raise _Invalid(f"must be > 0 (got {as_written(value)})")
    return number


def _cap(value: object) -> float:
    """A batch cap: a whole number of sequences, at least 1 (256 and 256.0 alike)."""
    number = _positive(value)
    if not number.is_integer():
        raise _Invalid(f"must be a whole number >= 1 (got {as_written(value)})")
    return number


def _non_negative(value: object) -> float:
    number = _finite_number(value)
    if number < 0:
        raise _Invalid(f"must be >= 0 (got {as_written(value)})")
    return number


def _quantile(value: object) -> float:
    number = _finite_number(value)
    if not 0 < number < 1:
        raise _Invalid(f"must be between 0 and 1, both excluded (got {as_written(value)})")
    return number


def _scale(value: object) -> float:
    number = _finite_number(value)
    if not 0 < number <= 1:
        raise _Invalid(f"must be > 0 and <= 1 (got {as_written(value)})")
    return number


def _threshold(value: object) -> float:
    number = _finite_number(value)
    if not 0 < number <= 10:
        raise _Invalid(f"must be > 0 and <= 10 (got {as_written(value)})")
    return number


def _count(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _wrong_type(value, "a whole number")
    if value < 1:
        raise _Invalid(f"must be >= 1 (got {value})")
    return value


def _min_replicas(value: object) -> int:
    """A count, whose 0 is refused saying why."""
    if isinstance(value, int) and not isinstance(value, bool) and value < 1:
        raise _Invalid(f"must be >= 1: {NO_ZERO} (got {value})")
    return _count(value)


def _shard(value: object) -> str:
    text = _text(value)
    index, slash, count = text.partition("/")
    if not (slash and index.isdigit() and count.isdigit() and int(index) < int(count)):
        raise _Invalid(f"must be K/N with 0 <= K < N, e.g. 0/4 (got {text!r})")
    return f"{int(index)}/{int(count)}"


def _text(value: object) -> str:
    if not isinstance(value, str):
        raise _wrong_type(value, "a string")
    if not value.strip():
        raise _Invalid("must not be empty")
    return value


def _name(value: object) -> str:
    name = _text(value)
    if any(not c.isprintable() for c in name):
        raise _Invalid(f"must be printable text without line breaks (got {name!r})")
    return name


def _one_of(value: object, options: tuple[str, ...]) -> str:
    text = _text(value)
    if text not in options:
        raise _Invalid(f"must be one of {', '.join(options)} (got {text!r})")
    return text


def _engine(value: object) -> str:
    return _one_of(value, engine_choices())


def _histogram(value: object) -> str:
    return _one_of(value, latency_kinds())


def _url(value: object) -> str:
    """A scrape URL: an http(s) URL with a host and no credentials; no path means /metrics."""
    text = _http_url(value)
    parts = urlsplit(text)
    return text if parts.path else urlunsplit(parts._replace(path="/metrics"))


def _http_url(value: object) -> str:
    """An http(s) URL with a host and no credentials, as given."""
    text = _text(value)
    # A URL with '@' may carry a password: it is never echoed back.
    got = "" if "@" in text else f" (got {text!r})"
    if any(c.isspace() for c in text):
        raise _Invalid(f"must not contain spaces{got}")
    try:
        parts = urlsplit(text)
        parts.port  # noqa: B018 - reading the port validates it
    except ValueError:
        raise _Invalid(f"is not a valid URL{got}") from None
    if "@" in parts.netloc:
        raise _Invalid(
            "must not contain credentials; use auth: with token_env/token_file "
            "or password_env/password_file"
        )
    if parts.scheme.lower() not in ("http", "https"):
        raise _Invalid(f"must be an http:// or https:// URL{got}")
    if not parts.hostname:
        raise _Invalid(f"has no host{got}")
    return text


def redacted_url(url: str) -> str:
    """The URL with every query value replaced: `__param_*` values may hold keys."""
    parts = urlsplit(url)
    if not parts.query:
        return url
    names = [pair.split("=", 1)[0] for pair in parts.query.split("&")]
    return urlunsplit(parts._replace(query="&".join(f"{n}=REDACTED" for n in names)))


def redact_url_in(text: str, url: str) -> str:
    """`text` (an error message) with the URL and its query shown as `redacted_url` does."""
    query = urlsplit(url).query
    if not query:
        return text
    redacted = redacted_url(url)
    return text.replace(url, redacted).replace(query, urlsplit(redacted).query)


def _split_host_port(text: str) -> tuple[str, int]:
    """HOST:PORT or [IPv6]:PORT, port 0-65535; an empty host is returned as ''."""
    if text.startswith("["):
        host, sep, port = text[1:].partition("]:")
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise _Invalid(f"has an invalid IPv6 address in brackets (got {text!r})") from None
    else:
        host, sep, port = text.rpartition(":")
        if ":" in host:
            raise _Invalid(f"needs brackets around an IPv6 address, e.g. [::1]:9500 (got {text!r})")
    if not sep or any(c.isspace() or c in "/@?#[]" for c in host):
        raise _Invalid(f"must be HOST:PORT, e.g. 127.0.0.1:9500 (got {text!r})")
    if not port.isdigit() or not 0 <= int(port) <= 65535:
        raise _Invalid(f"needs a port from 0 to 65535 (got {text!r})")
    return host, int(port)


def _listen(value: object) -> str:
    """HOST:PORT to bind; ':PORT' binds 127.0.0.1, not every interface."""
    host, port = _split_host_port(_text(value))
    host = host or DEFAULT_LISTEN_HOST
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _env_name(value: object) -> str:
    if not isinstance(value, str) or not _ENV_NAME.fullmatch(value):
        # Not echoed: a token pasted here by mistake must not reach a log.
        raise _Invalid(
            "must be the name of an environment variable (letters, digits, _), not the secret"
        )
    return value


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
        parse=_name,
        flag="--name",
        help="name in metrics and dashboards (default: the URL's host:port)",
        file_sd=False,
    )
    url: str = _configured(
        MISSING,
        parse=_url,
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
        parse=_engine,
        flag="--engine",
        choices=engine_choices,
        help="server kind (default: {default}, detected from metric names)",
    )
    cap: float | None = _configured(
        None,
        parse=_cap,
        flag="--cap",
        type=float,
        metavar="N",
        help="max concurrent sequences (vLLM --max-num-seqs); "
        "without it running/cap is not reported",
    )
    # A token budget for the running batch (TGI's --max-batch-total-tokens), beside `cap`.
    token_cap: float | None = _configured(
        None,
        parse=_positive,
        flag="--token-cap",
        type=float,
        metavar="N",
        help="token budget of the running batch (TGI --max-batch-total-tokens): "
        "a token cap, reported beside the request cap",
    )
    # The tokens one engine step may carry (vLLM's --max-num-batched-tokens).
    max_num_batched_tokens: float | None = _configured(
        None,
        parse=_positive,
        flag="--max-num-batched-tokens",
        type=float,
        metavar="N",
        help="tokens one engine step may carry (vLLM --max-num-batched-tokens, which vLLM "
        "does not expose); without it the token budget is not judged",
    )
    budget_seconds: float | None = _configured(
        None,
        parse=_positive,
        flag="--budget-seconds",
        type=float,
        metavar="S",
        help="latency budget; without it budget utilisation is not reported",
    )
    quantile: float = _configured(
        0.99,
        parse=_quantile,
        flag="--quantile",
        type=float,
        metavar="Q",
        help="latency quantile compared with the budget (default: {default})",
    )
    histogram: str = _configured(
        "e2e",
        parse=_histogram,
        flag="--histogram",
        choices=latency_kinds,
        help="latency histogram the quantile is taken from (default: {default})",
    )
    slo_objective: float | None = _configured(
        None,
        parse=_quantile,
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
        parse=_name,
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
        parse=_listen,
        flag="--listen",
        metavar="HOST:PORT",
        group=FLEET_GROUP,
        help="address to serve on (default: {default}; ':PORT' also binds 127.0.0.1)",
    )
    interval_seconds: float = _configured(
        DEFAULT_INTERVAL_SECONDS,
        parse=_positive,
        flag="--interval",
        type=float,
        metavar="S",
        group=FLEET_GROUP,
        help="seconds between scrapes (default: {default:g})",
    )
    window_seconds: float = _configured(
        60.0,
        parse=_positive,
        flag="--window-seconds",
        type=float,
        metavar="S",
        group=FLEET_GROUP,
        help="window for rates and quantiles (default: {default:g})",
    )
    saturation_threshold: float = _configured(
        0.95,
        parse=_threshold,
        flag="--saturation-threshold",
        type=float,
        metavar="U",
        group=FLEET_GROUP,
        help="budget utilisation counted as saturated (default: {default:g})",
    )
    hold_seconds: float = _configured(
        DEFAULT_HOLD_SECONDS,
        parse=_non_negative,
        flag="--hold-seconds",
        type=float,
        metavar="S",
        group=FLEET_GROUP,
        help="how long saturation must last before it is reported (default: {default:g})",
    )
    timeout_seconds: float | None = _configured(
        None,
        parse=_positive,
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
        parse=_count,
        flag="--max-response-bytes",
        type=int,
        metavar="N",
        group=FLEET_GROUP,
        help="largest /metrics body accepted (default: {default})",
    )
    history_points: int = _configured(
        720,
        parse=_count,
        flag="--history-points",
        type=int,
        metavar="N",
        group=HISTORY_GROUP,
        help="evaluations kept per target for /api/v1/history (default: {default})",
    )
    # Where the exporter posts its own alerts (Alertmanager's base URL); None: it does not.
    alertmanager_url: str | None = _configured(
        None,
        parse=_http_url,
        flag="--alertmanager-url",
        metavar="URL",
        group=HISTORY_GROUP,
        help="post sustained saturation, memory-bound, stalled, target-down and SLO burn "
        "alerts to this Alertmanager (its base URL, e.g. http://127.0.0.1:9093), without Prometheus",
    )
    slo_period_days: float = _configured(
        DEFAULT_PERIOD_DAYS,
        parse=_positive,
        flag="--slo-period-days",
        type=float,
        metavar="D",
        group=HISTORY_GROUP,
        help="compliance period of the targets' SLO objectives: the error budget is "
        "counted over it (default: {default:g} days)",
    )
    slo_window_scale: float = _configured(
        1.0,
        parse=_scale,
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
        parse=_count,
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
        parse=_env_name,
        flag="--web-token-env",
        metavar="NAME",
        group=ENDPOINTS_GROUP,
        help="environment variable holding a bearer token every request but /health must carry",
    )
    web_token_file: str | None = _configured(
        None,
        parse=_text,
        flag="--web-token-file",
        metavar="PATH",
        group=ENDPOINTS_GROUP,
        help="file holding that token (instead of the env)",
    )
    tls_cert_file: str | None = _configured(
        None,
        parse=_text,
        flag="--tls-cert-file",
        metavar="PATH",
        group=ENDPOINTS_GROUP,
        help="serve HTTPS with this cert (PEM)",
    )
    tls_key_file: str | None = _configured(
        None,
        parse=_text,
        flag="--tls-key-file",
        metavar="PATH",
        group=ENDPOINTS_GROUP,
        help="and this private key (PEM)",
    )
    # "K/N": this exporter keeps the targets whose name hashes to K modulo N (`in_shard`).
    shard: str | None = _configured(
        None,
        parse=_shard,
        flag="--shard",
        metavar="K/N",
        group=FLEET_GROUP,
        help="monitor only the targets whose name hashes to K modulo N (Prometheus's "
        "hashmod): N exporters with 0/N .. N-1/N share one fleet file",
    )

    min_replicas: int = _configured(
        1,
        parse=_min_replicas,
        flag="--min-replicas",
        type=int,
        metavar="N",
        group=REPLICAS_GROUP,
        help="fewest replicas recommended for a model, and the count while it is idle "
        "(default: {default}; per model: models: in the fleet file)",
    )
    max_replicas: int | None = _configured(
        None,
        parse=_count,
        flag="--max-replicas",
        type=int,
        metavar="N",
        group=REPLICAS_GROUP,
        help="most replicas recommended for a model (default: none; per model: models: in "
        "the fleet file)",
    )
    scale_down_seconds: float = _configured(
        DEFAULT_SCALE_DOWN_SECONDS,
        parse=_non_negative,
        flag="--scale-down-seconds",
        type=float,
        metavar="S",
        group=REPLICAS_GROUP,
        help="how long a lower replica count must hold before it is recommended (default: "
        "{default:g}; a higher one holds for --hold-seconds)",
    )
    # Per model (the fleet file's `models:`): (model, min_replicas, max_replicas), each
    # None where the model takes the setting above.
    models: tuple[tuple[str, int | None, int | None], ...] = ()

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
            host, port = _split_host_port(self.listen)
        except _Invalid as err:
            raise ConfigError(f"listen: {err}") from None
        return host or DEFAULT_LISTEN_HOST, port


_TARGET_CONFIG = config_fields(Target)
_SETTINGS_CONFIG = config_fields(Settings)
# Parsers by key, shared by the YAML file, the command line and file_sd labels.
_TARGET_FIELDS: dict[str, Callable[[object], Any]] = {
    key: spec.parse for key, spec in _TARGET_CONFIG.items()
}
_SETTINGS_FIELDS: dict[str, Callable[[object], Any]] = {
    key: spec.parse for key, spec in _SETTINGS_CONFIG.items()
}
TARGET_FLAGS = {key: spec.flag for key, spec in _TARGET_CONFIG.items()}
SETTINGS_FLAGS = {key: spec.flag for key, spec in _SETTINGS_CONFIG.items()}

_AUTH_KEYS = ("type", "token_env", "token_file", "username", "password_env", "password_file")
# Keys that would put a secret into the file; they get a message saying what to use instead.
_SECRET_REFUSALS = dict.fromkeys(
    ("token", "password", "bearer_token", "credentials"),
    "secrets are not allowed in the configuration; use auth: with token_env or "
    "password_env (an environment variable's name) or token_file or password_file "
    "(a file's path)",
)


def _parse(raw: Mapping[str, Sourced], parsers: Mapping[str, Callable[[object], Any]]) -> dict:
    parsed = {}
    for key, (value, origin) in raw.items():
        try:
            parsed[key] = parsers[key](value)
        except _Invalid as err:
            raise ConfigError(f"{origin}: {err}") from None
    return parsed


def _target(parsed: dict[str, Any]) -> Target:
    parsed.setdefault("name", urlsplit(parsed["url"]).netloc)
    return Target(**parsed)


def target_from_values(given: Mapping[str, Sourced]) -> Target:
    """A Target from sourced values by field (`url` required); ConfigError names the origin."""
    return _target(_parse(given, _TARGET_FIELDS))


def settings_from_values(
    raw: Mapping[str, Sourced],
    targets: tuple[Target, ...],
    file_sd: tuple[str, ...],
    models: tuple[tuple[str, int | None, int | None], ...] = (),
) -> Settings:
    """Settings from sourced values, checked one by one and against each other."""
    parsed = _parse(raw, _SETTINGS_FIELDS)
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


def _mapping(node: Node, source: str, path: str, allowed: Iterable[str]) -> dict[str, Node]:
    """The node's entries (see `located.mapping`); a key meant for a secret is refused."""
    return mapping(node, source, path, allowed, _SECRET_REFUSALS)


def _reject_reserved_labels(labels: Mapping[str, Sourced]) -> None:
    for name, (_, origin) in labels.items():
        if name in RESERVED_LABELS or name.startswith("__"):
            raise ConfigError(
                f"{origin}: the exporter sets this label itself; reserved are "
                f"{', '.join(RESERVED_LABELS)} and names starting with __"
            )


# ---------------------------------------------------------------- the YAML file

_TARGET_KEYS = (*_TARGET_FIELDS, "auth", "labels")
_TOP_KEYS = ("targets", "file_sd", "models", *_SETTINGS_FIELDS)


def _resolve(base: Path, path: str) -> str:
    return str(base / path)  # an absolute path replaces base


def _yaml_auth(node: Node, source: str, path: str, base: Path) -> Auth:
    entries = _mapping(node, source, path, _AUTH_KEYS)
    if "type" not in entries:
        raise ConfigError(
            f"{location(source, node.line, path)}: missing key 'type' (bearer or basic)"
        )
    kind_node = entries["type"]
    try:
        kind = _one_of(kind_node.value, ("bearer", "basic"))
    except _Invalid as err:
        raise ConfigError(
            f"{location(source, kind_node.line, child_path(path, 'type'))}: {err}"
        ) from None
    secret = "token" if kind == "bearer" else "password"
    used = ("type", f"{secret}_env", f"{secret}_file", *(("username",) if kind == "basic" else ()))
    for key, line in node.key_lines.items():
        if key not in used:
            raise ConfigError(
                f"{location(source, line, child_path(path, key))}: not used by type {kind}"
            )
    given = [key for key in (f"{secret}_env", f"{secret}_file") if key in entries]
    if len(given) != 1:
        raise ConfigError(
            f"{location(source, node.line, path)}: type {kind} needs exactly one of "
            f"{secret}_env or {secret}_file"
        )
    parsers: dict[str, Callable[[object], Any]] = {
        f"{secret}_env": _env_name,
        f"{secret}_file": lambda value: _resolve(base, _text(value)),
        "username": _username,
    }
    raw = {
        key: (entries[key].value, location(source, entries[key].line, child_path(path, key)))
        for key in (*given, "username")
        if key in entries
    }
    if kind == "basic" and "username" not in raw:
        raise ConfigError(f"{location(source, node.line, path)}: type basic needs a username")
    return Auth(type=kind, **_parse(raw, parsers))


def _username(value: object) -> str:
    name = _name(value)
    if ":" in name:
        raise _Invalid(
            f"must not contain ':' (basic auth separates it from the password there) (got {name!r})"
        )
    return name


def _yaml_target(node: Node, source: str, path: str, base: Path) -> Target:
    entries = _mapping(node, source, path, _TARGET_KEYS)
    if "url" not in entries:
        raise ConfigError(f"{location(source, node.line, path)}: missing required key 'url'")
    raw = {
        key: (value.value, location(source, value.line, child_path(path, key)))
        for key, value in entries.items()
        if key in _TARGET_FIELDS
    }
    parsed = _parse(raw, _TARGET_FIELDS)
    if "auth" in entries:
        parsed["auth"] = _yaml_auth(entries["auth"], source, child_path(path, "auth"), base)
    if "labels" in entries:
        labels = read_labels(entries["labels"], source, child_path(path, "labels"))
        _reject_reserved_labels(labels)
        parsed["labels"] = tuple(sorted((name, value) for name, (value, _) in labels.items()))
    return _target(parsed)


def load_config(path: str | Path, overrides: Mapping[str, object] | None = None) -> Settings:
    """Settings from a YAML fleet file, with `overrides` (by Settings field) winning.

    Overrides come from command-line flags: a None value means "not given". Relative
    file_sd and token/password file paths are taken from the config file's folder. The
    file_sd files that exist now are loaded too, so a broken one fails at start.
    Raises ConfigError for every problem, naming file, line and key.
    """
    path = Path(path)
    with _as_config_error():
        return _load_config(path, overrides or {})


def _load_config(path: Path, overrides: Mapping[str, object]) -> Settings:
    source = str(path)
    root = read_document(path)
    if root is None:
        raise ConfigError(f"{source}:1: the file is empty; it needs targets: or file_sd:")
    entries = _mapping(root, source, "", _TOP_KEYS)
    base = path.parent
    named: dict[str, tuple[str, int]] = {}
    targets = []
    if "targets" in entries:
        items = sequence(entries["targets"], source, "targets", "a list of targets")
        for i, item in enumerate(items):
            target = _yaml_target(item, source, f"targets[{i}]", base)
            _claim_name(named, target.name, source, item.line, f"targets[{i}]")
            targets.append(target)
    file_sd: list[str] = []
    if "file_sd" in entries:
        for i, item in enumerate(
            sequence(entries["file_sd"], source, "file_sd", "a list of paths or globs")
        ):
            try:
                file_sd.append(_resolve(base, _text(item.value)))
            except _Invalid as err:
                raise ConfigError(
                    f"{location(source, item.line, f'file_sd[{i}]')}: {err}"
                ) from None
    if not targets and not file_sd:
        line = entries["targets"].line if "targets" in entries else root.line
        raise ConfigError(f"{source}:{line}: no targets: list some under targets: or file_sd:")
    for sd_path in expand_file_sd(file_sd):
        for target, line, item_path in _file_sd_targets(sd_path):
            _claim_name(named, target.name, str(sd_path), line, item_path)
    raw = {
        key: (value.value, location(source, value.line, key))
        for key, value in entries.items()
        if key in _SETTINGS_FIELDS
    }
    for key, value in overrides.items():
        if key not in _SETTINGS_FIELDS:
            raise ValueError(
                f"unknown override {key!r}; expected one of {', '.join(_SETTINGS_FIELDS)}"
            )
        if value is not None:
            raw[key] = (value, SETTINGS_FLAGS[key])
    models = read_models(entries["models"], source) if "models" in entries else ()
    return settings_from_values(raw, tuple(targets), tuple(file_sd), models)


def _claim_name(
    named: dict[str, tuple[str, int]], name: str, source: str, line: int, path: str
) -> None:
    """Record where a target name is defined; raises naming both places if it is taken."""
    if name in named:
        first_source, first_line = named[name]
        shown = f"line {first_line}" if first_source == source else f"{first_source}:{first_line}"
        raise ConfigError(
            f"{location(source, line, path)}: duplicate target name {name!r} (first at {shown})"
        )
    named[name] = (source, line)


# ---------------------------------------------------------------- Prometheus file_sd targets

# Labels that configure a file_sd target instead of labelling it (besides the names).
_CONFIG_LABELS = tuple(key for key, spec in _TARGET_CONFIG.items() if spec.file_sd)
_NUMERIC_LABELS = tuple(key for key in _CONFIG_LABELS if _TARGET_CONFIG[key].type is float)
_NAME_LABELS = ("batchscope_name", "name")


def load_file_sd(path: str | Path) -> list[Target]:
    """The targets of one Prometheus file_sd file (JSON, or YAML by extension).

    The file is a list of `{"targets": ["host:port", ...], "labels": {...}}` groups.
    Each host:port becomes `http://host:port/metrics`; labels `__scheme__`,
    `__metrics_path__` and `__param_<name>` change the URL; `batchscope_name` or
    `name` names the target (else host:port); the target fields (`engine`, `cap`,
    `budget_seconds`, ... : `Target`'s with `ConfigField.file_sd`) configure it; other
    `__` labels are dropped and the rest become `Target.labels`. Raises ConfigError for any problem, names unique within
    the file.
    """
    return [target for target, _, _ in _file_sd_targets(Path(path))]


def _file_sd_targets(path: Path) -> list[tuple[Target, int, str]]:
    """Each target with the line and key path that defined it."""
    source = str(path)
    found: list[tuple[Target, int, str]] = []
    named: dict[str, tuple[str, int]] = {}
    with _as_config_error():
        for group in read_target_groups(path):
            url_parts, parsed = _group_config(group.labels)
            for address in group.addresses:
                origin = location(source, address.line, address.path)
                try:
                    text = _text(address.text)
                    hostname, port = _split_host_port(text)
                    if not hostname or port == 0:
                        raise _Invalid(
                            f"must be host:port with a port from 1 to 65535 (got {text!r})"
                        )
                    url = _url(url_parts[0] + text + url_parts[1])
                except _Invalid as err:
                    raise ConfigError(f"{origin}: {err}") from None
                target = _target({"name": text, **parsed, "url": url})
                _claim_name(named, target.name, source, address.line, address.path)
                found.append((target, address.line, address.path))
    return found


def _group_config(labels: dict[str, Sourced]) -> tuple[tuple[str, str], dict[str, Any]]:
    """From a group's labels: the URL around host:port, and the Target fields."""
    scheme, scheme_origin = labels.get("__scheme__", ("http", ""))
    if scheme not in ("http", "https"):
        raise ConfigError(f"{scheme_origin}: must be http or https (got {scheme!r})")
    metrics_path, path_origin = labels.get("__metrics_path__", ("/metrics", ""))
    if not metrics_path.startswith("/"):
        raise ConfigError(f"{path_origin}: must start with / (got {metrics_path!r})")
    params = [
        (name.removeprefix("__param_"), value)
        for name, (value, _) in labels.items()
        if name.startswith("__param_")
    ]
    query = f"?{urlencode(params)}" if params else ""
    raw = {key: labels[key] for key in _CONFIG_LABELS if key in labels}
    for key in _NUMERIC_LABELS:
        if key in raw:
            raw[key] = (_label_number(raw[key]), raw[key][1])
    names = [labels[key] for key in _NAME_LABELS if key in labels]
    if names:
        raw["name"] = names[0]
    parsed = _parse(raw, _TARGET_FIELDS)
    rest = {
        key: value
        for key, value in labels.items()
        if key not in (*_CONFIG_LABELS, *_NAME_LABELS) and not key.startswith("__")
    }
    _reject_reserved_labels(rest)
    parsed["labels"] = tuple(sorted((k, value) for k, (value, _) in rest.items()))
    return (f"{scheme}://", f"{metrics_path}{query}"), parsed


def _label_number(sourced: Sourced) -> object:
    """File_sd label values are strings: '256' is read as the number 256."""
    value, origin = sourced
    try:
        return float(str(value))
    except ValueError:
        raise ConfigError(f"{origin}: must be a number (got {value!r})") from None
