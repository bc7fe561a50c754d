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
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urlsplit, urlunsplit

from exporter.config.file_sd import expand_file_sd, read_labels, read_target_groups
from exporter.config.line_numbered import (
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
from exporter.config.reserved_labels import RESERVED_LABELS
from exporter.engines import engine_choices, latency_kinds

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


@dataclass(frozen=True)
class Target:
    """One server to scrape and how to judge its batching."""

    name: str
    url: str
    engine: str = "auto"
    cap: float | None = None
    budget_seconds: float | None = None
    quantile: float = 0.99
    histogram: str = "e2e"
    auth: Auth | None = None
    labels: tuple[tuple[str, str], ...] = ()
    # A token budget for the running batch (TGI's --max-batch-total-tokens), beside `cap`.
    token_cap: float | None = None
    # The tokens one engine step may carry (vLLM's --max-num-batched-tokens).
    max_num_batched_tokens: float | None = None


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
    listen: str = f"{DEFAULT_LISTEN_HOST}:9500"
    interval_seconds: float = 5.0
    window_seconds: float = 60.0
    saturation_threshold: float = 0.95
    hold_seconds: float = 60.0
    timeout_seconds: float | None = None
    max_response_bytes: int = 8 * 1024 * 1024
    history_points: int = 720
    # Where the exporter posts its own alerts (Alertmanager's base URL); None: it does not.
    alertmanager_url: str | None = None
    # Samples of the engine's families one payload may hold, as Prometheus's sample_limit.
    sample_limit: int = 50_000
    # The exporter's own endpoints: a bearer token every request but /health must carry
    # (where it lives, never the token), and TLS. Both off by default, on 127.0.0.1.
    web_token_env: str | None = None
    web_token_file: str | None = None
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    # "K/N": this exporter keeps the targets whose name hashes to K modulo N (`in_shard`).
    shard: str | None = None

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


# Parsers by key, shared by the YAML file, the command line and file_sd labels.
_TARGET_FIELDS: dict[str, Callable[[object], Any]] = {
    "name": _name,
    "url": _url,
    "engine": _engine,
    "cap": _cap,
    "token_cap": _positive,
    "max_num_batched_tokens": _positive,
    "budget_seconds": _positive,
    "quantile": _quantile,
    "histogram": _histogram,
}
_NUMERIC_TARGET_FIELDS = (
    "cap",
    "token_cap",
    "max_num_batched_tokens",
    "budget_seconds",
    "quantile",
)

# Settings keys: their parser and the flag that overrides them.
_SETTINGS_FIELDS: dict[str, tuple[Callable[[object], Any], str]] = {
    "listen": (_listen, "--listen"),
    "interval_seconds": (_positive, "--interval"),
    "window_seconds": (_positive, "--window-seconds"),
    "saturation_threshold": (_threshold, "--saturation-threshold"),
    "hold_seconds": (_non_negative, "--hold-seconds"),
    "timeout_seconds": (_positive, "--timeout-seconds"),
    "max_response_bytes": (_count, "--max-response-bytes"),
    "history_points": (_count, "--history-points"),
    "sample_limit": (_count, "--sample-limit"),
    "web_token_env": (_env_name, "--web-token-env"),
    "web_token_file": (_text, "--web-token-file"),
    "tls_cert_file": (_text, "--tls-cert-file"),
    "tls_key_file": (_text, "--tls-key-file"),
    "shard": (_shard, "--shard"),
    "alertmanager_url": (_http_url, "--alertmanager-url"),
}
SETTINGS_FLAGS = {key: flag for key, (_, flag) in _SETTINGS_FIELDS.items()}

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
    raw: Mapping[str, Sourced], targets: tuple[Target, ...], file_sd: tuple[str, ...]
) -> Settings:
    """Settings from sourced values, checked one by one and against each other."""
    parsed = _parse(raw, {key: parse for key, (parse, _) in _SETTINGS_FIELDS.items()})
    settings = Settings(targets=targets, file_sd=file_sd, **parsed)
    origins = {key: origin for key, (_, origin) in raw.items()}
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
_TOP_KEYS = ("targets", "file_sd", *_SETTINGS_FIELDS)


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
            raw[key] = (value, _SETTINGS_FIELDS[key][1])
    return settings_from_values(raw, tuple(targets), tuple(file_sd))


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
_CONFIG_LABELS = (
    "engine",
    "cap",
    "token_cap",
    "max_num_batched_tokens",
    "budget_seconds",
    "quantile",
    "histogram",
)
_NAME_LABELS = ("batchscope_name", "name")


def load_file_sd(path: str | Path) -> list[Target]:
    """The targets of one Prometheus file_sd file (JSON, or YAML by extension).

    The file is a list of `{"targets": ["host:port", ...], "labels": {...}}` groups.
    Each host:port becomes `http://host:port/metrics`; labels `__scheme__`,
    `__metrics_path__` and `__param_<name>` change the URL; `batchscope_name` or
    `name` names the target (else host:port); `engine`, `cap`, `token_cap`,
    `max_num_batched_tokens`, `budget_seconds`, `quantile`, `histogram` configure it; other `__` labels are dropped and the rest
    become `Target.labels`. Raises ConfigError for any problem, names unique within
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
    for key in _NUMERIC_TARGET_FIELDS:
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
