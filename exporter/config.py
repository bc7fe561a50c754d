"""The exporter's configuration: command-line flags, a YAML fleet file, Prometheus file_sd.

Pure parsing and validation (it reads the files it is given, nothing else). Every
problem is a `ConfigError` whose text is a complete message for the user, naming the
file, the line, the key path and what is wrong: `fleet.yaml:7: targets[1].cap: must
be > 0 (got 0)`. Credentials are never part of the configuration: it names an
environment variable or a file, and `Auth.header()` reads them at scrape time.
"""

from __future__ import annotations

import argparse
import base64
import bisect
import difflib
import glob
import ipaddress
import json
import math
import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urlsplit, urlunsplit

import yaml
from yaml.constructor import SafeConstructor

from exporter.engines import engine_choices, latency_kinds
from exporter.labels import RESERVED_LABELS

DEFAULT_LISTEN_HOST = "127.0.0.1"
MAX_TIMEOUT_SECONDS = 10.0


class ConfigError(ValueError):
    """A configuration problem; `str()` is the whole user-facing message."""


@dataclass(frozen=True, repr=False)
class Auth:
    """Where a target's credentials live; they are read by `header()`, never stored.

    `type` is "bearer" (one of `token_env`, `token_file`) or "basic" (`username` and one
    of `password_env`, `password_file`).
    """

    type: str
    token_env: str | None = None
    token_file: str | None = None
    username: str | None = None
    password_env: str | None = None
    password_file: str | None = None

    def header(self) -> str:
        """The Authorization header value, reading the environment or file now.

        Raises ConfigError naming the variable or file (never the secret) when it is
        unset, empty or unreadable. Reading at every scrape picks up rotated secrets.
        """
        if self.type == "bearer":
            return "Bearer " + _read_secret("token", self.token_env, self.token_file)
        password = _read_secret("password", self.password_env, self.password_file)
        pair = f"{self.username}:{password}".encode()
        return "Basic " + base64.b64encode(pair).decode("ascii")

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


@dataclass(frozen=True)
class Settings:
    """Everything the exporter runs with.

    `timeout_seconds` left as None becomes min(0.8 * interval_seconds, 10): a scrape ends
    before the next round is due, and a hung server never holds a round for long.
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

    def __post_init__(self) -> None:
        if self.timeout_seconds is None:
            object.__setattr__(self, "timeout_seconds", default_timeout(self.interval_seconds))

    def listen_host_port(self) -> tuple[str, int]:
        """The address to bind: host (IPv6 without brackets) and port."""
        try:
            host, port = _split_host_port(self.listen)
        except _Invalid as err:
            raise ConfigError(f"listen: {err}") from None
        return host or DEFAULT_LISTEN_HOST, port


def default_timeout(interval_seconds: float) -> float:
    """The scrape timeout used when none is configured: min(0.8 * interval, 10 s)."""
    return min(0.8 * interval_seconds, MAX_TIMEOUT_SECONDS)


# ---------------------------------------------------------------- secrets


def _read_secret(kind: str, env: str | None, path: str | None) -> str:
    if env is not None:
        value = os.environ.get(env, "").strip()
        if not value:
            raise ConfigError(f"auth: environment variable {env} (the {kind}) is not set or empty")
        where = f"environment variable {env}"
    else:
        try:
            value = Path(str(path)).read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as err:
            reason = err.strerror if isinstance(err, OSError) else "not UTF-8 text"
            raise ConfigError(f"auth: cannot read {kind} file {path}: {reason}") from None
        if not value:
            raise ConfigError(f"auth: {kind} file {path} is empty")
        where = f"{kind} file {path}"
    if "\n" in value or "\r" in value:
        # A line break would split the HTTP header; say so without showing the value.
        raise ConfigError(f"auth: the {kind} in {where} contains a line break")
    return value


# ---------------------------------------------------------------- value checks


class _Invalid(Exception):
    """A value failed its check; the caller says where the value came from."""


def _type_name(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return type(value).__name__


def _shown(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    return repr(value)


def _wrong_type(value: object, expected: str) -> _Invalid:
    got = "" if isinstance(value, list | dict) else f" (got {_shown(value)})"
    return _Invalid(f"must be {expected}, not {_type_name(value)}{got}")


def _number(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _wrong_type(value, "a number")
    try:
        number = float(value)
    except OverflowError:
        number = math.inf
    if not math.isfinite(number):
        raise _Invalid(f"must be a finite number (got {_shown(value)})")
    return number


def _positive(value: object) -> float:
    number = _number(value)
    if number <= 0:
        raise _Invalid(f"must be > 0 (got {_shown(value)})")
    return number


def _non_negative(value: object) -> float:
    number = _number(value)
    if number < 0:
        raise _Invalid(f"must be >= 0 (got {_shown(value)})")
    return number


def _quantile(value: object) -> float:
    number = _number(value)
    if not 0 < number < 1:
        raise _Invalid(f"must be between 0 and 1, both excluded (got {_shown(value)})")
    return number


def _threshold(value: object) -> float:
    number = _number(value)
    if not 0 < number <= 10:
        raise _Invalid(f"must be > 0 and <= 10 (got {_shown(value)})")
    return number


def _count(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _wrong_type(value, "a whole number")
    if value < 1:
        raise _Invalid(f"must be >= 1 (got {value})")
    return value


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
    """An http(s) URL with a host and no credentials; no path means /metrics."""
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
    return text if parts.path else urlunsplit(parts._replace(path="/metrics"))


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


# Environment variable names and Prometheus label names follow the same rule.
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _env_name(value: object) -> str:
    if not isinstance(value, str) or not _IDENTIFIER.fullmatch(value):
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
    "cap": _positive,
    "budget_seconds": _positive,
    "quantile": _quantile,
    "histogram": _histogram,
}
_NUMERIC_TARGET_FIELDS = ("cap", "budget_seconds", "quantile")

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
}

_AUTH_KEYS = ("type", "token_env", "token_file", "username", "password_env", "password_file")
# Keys that would put a secret into the file; they get a message saying what to use instead.
_SECRET_KEYS = ("token", "password", "bearer_token", "credentials")

# A value with where it came from: "fleet.yaml:7: targets[1].cap" or "--cap".
_Sourced = tuple[object, str]


def _parse(raw: Mapping[str, _Sourced], parsers: Mapping[str, Callable[[object], Any]]) -> dict:
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


def _settings(
    raw: Mapping[str, _Sourced], targets: tuple[Target, ...], file_sd: tuple[str, ...]
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
    timeout = settings.timeout_seconds
    if "timeout_seconds" in origins and timeout is not None and timeout > interval:
        raise ConfigError(
            f"{origins['timeout_seconds']}: must be <= interval_seconds ({interval:g}), "
            f"a scrape must end before the next round (got {timeout:g})"
        )
    return settings


# ---------------------------------------------------------------- located documents


@dataclass(frozen=True)
class _Node:
    """A parsed value and the line it starts on; lists and mappings hold _Nodes."""

    value: Any
    line: int
    key_lines: dict[str, int] = field(default_factory=dict)


def _at(source: str, line: int, path: str) -> str:
    return f"{source}:{line}: {path or '(top level)'}"


def _child(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _read_text(path: Path) -> str:
    try:
        # utf-8-sig: editors on Windows save a byte order mark.
        return path.read_text(encoding="utf-8-sig")
    except OSError as err:
        raise ConfigError(f"{path}: cannot read the file: {err.strerror}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not UTF-8 text") from None


def _read_tree(path: Path) -> _Node | None:
    """The file's document with line numbers; None when it holds none."""
    text = _read_text(path)
    if path.suffix.lower() == ".json":
        return _json_tree(text, str(path))
    return _yaml_tree(text, str(path))


def _yaml_tree(text: str, source: str) -> _Node | None:
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        return None if root is None else _from_yaml(root, SafeConstructor(), source, "")
    except yaml.MarkedYAMLError as err:
        # Only the short description: the YAML snippet could show a secret's line.
        mark = err.problem_mark or err.context_mark
        line = f":{mark.line + 1}" if mark else ""
        what = ", ".join(part for part in (err.context, err.problem) if part)
        raise ConfigError(f"{source}{line}: invalid YAML: {what}") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"{source}: invalid YAML: {err}") from None


def _from_yaml(node: yaml.Node, constructor: SafeConstructor, source: str, path: str) -> _Node:
    line = node.start_mark.line + 1
    if isinstance(node, yaml.SequenceNode):
        items = [
            _from_yaml(item, constructor, source, f"{path}[{i}]")
            for i, item in enumerate(node.value)
        ]
        return _Node(items, line)
    if not isinstance(node, yaml.MappingNode):
        return _Node(constructor.construct_object(node), line)
    first_lines: dict[str, int] = {}
    for key_node, _ in node.value:
        key_line = key_node.start_mark.line + 1
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue
        if not isinstance(key_node, yaml.ScalarNode) or key_node.tag != "tag:yaml.org,2002:str":
            raise ConfigError(f"{_at(source, key_line, path)}: keys must be strings")
        key = key_node.value
        if key in first_lines:
            raise ConfigError(
                f"{_at(source, key_line, _child(path, key))}: "
                f"duplicate key (first at line {first_lines[key]})"
            )
        first_lines[key] = key_line
    # `<<: *anchor` merges: keys written in this mapping win over merged ones.
    constructor.flatten_mapping(node)
    entries: dict[str, _Node] = {}
    key_lines: dict[str, int] = {}
    for key_node, value_node in node.value:
        key = key_node.value
        entries[key] = _from_yaml(value_node, constructor, source, _child(path, key))
        key_lines[key] = key_node.start_mark.line + 1
    return _Node(entries, line, key_lines)


def _json_tree(text: str, source: str) -> _Node:
    """JSON with line numbers; YAML parsers reject tab-indented or long-keyed JSON."""
    try:
        json.loads(text)
    except json.JSONDecodeError as err:
        raise ConfigError(f"{source}:{err.lineno}: invalid JSON: {err.msg}") from None
    newlines = [i for i, c in enumerate(text) if c == "\n"]
    decoder = json.JSONDecoder()

    def line_at(index: int) -> int:
        return bisect.bisect_left(newlines, index) + 1

    def skip(index: int) -> int:
        while text[index] in " \t\r\n":
            index += 1
        return index

    # The text is valid JSON (checked above), so this walk needs no error handling.
    def parse(index: int, path: str) -> tuple[_Node, int]:
        index = skip(index)
        line = line_at(index)
        opener = text[index]
        if opener not in "[{":
            value, end = decoder.raw_decode(text, index)
            return _Node(value, line), end
        closer = "]" if opener == "[" else "}"
        items: list[_Node] = []
        entries: dict[str, _Node] = {}
        key_lines: dict[str, int] = {}
        index = skip(index + 1)
        while text[index] != closer:
            if opener == "[":
                item, index = parse(index, f"{path}[{len(items)}]")
                items.append(item)
            else:
                key_line = line_at(index)
                key, index = json.decoder.scanstring(text, index + 1)
                if key in entries:
                    raise ConfigError(
                        f"{_at(source, key_line, _child(path, key))}: "
                        f"duplicate key (first at line {key_lines[key]})"
                    )
                entries[key], index = parse(skip(index) + 1, _child(path, key))
                key_lines[key] = key_line
            index = skip(index)
            if text[index] == ",":
                index = skip(index + 1)
        if opener == "[":
            return _Node(items, line), index + 1
        return _Node(entries, line, key_lines), index + 1

    return parse(0, "")[0]


def _mapping(node: _Node, source: str, path: str, allowed: Iterable[str]) -> dict[str, _Node]:
    """The node's entries; raises on a non-mapping or a key outside `allowed`."""
    if not isinstance(node.value, dict):
        raise ConfigError(f"{_at(source, node.line, path)}: {_wrong_type(node.value, 'a mapping')}")
    allowed = tuple(allowed)
    for key, line in node.key_lines.items():
        if key in allowed:
            continue
        where = _at(source, line, _child(path, key))
        if key in _SECRET_KEYS:
            raise ConfigError(
                f"{where}: secrets are not allowed in the configuration; use auth: with "
                "token_env or password_env (an environment variable's name) or "
                "token_file or password_file (a file's path)"
            )
        close = difflib.get_close_matches(key, allowed, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else f"; expected {', '.join(allowed)}"
        raise ConfigError(f"{where}: unknown key{hint}")
    return node.value


def _sequence(node: _Node, source: str, path: str, expected: str) -> list[_Node]:
    if not isinstance(node.value, list):
        raise ConfigError(f"{_at(source, node.line, path)}: {_wrong_type(node.value, expected)}")
    return node.value


def _labels(node: _Node, source: str, path: str) -> dict[str, _Sourced]:
    """Label name -> (value, origin); names as Prometheus allows, values strings."""
    labels: dict[str, _Sourced] = {}
    for name, value in _mapping(node, source, path, node.key_lines).items():
        origin = _at(source, value.line, _child(path, name))
        if not _IDENTIFIER.fullmatch(name):
            raise ConfigError(f"{origin}: label names are letters, digits and _, not a digit first")
        if not isinstance(value.value, str):
            raise ConfigError(f"{origin}: {_wrong_type(value.value, 'a string')}")
        labels[name] = (value.value, origin)
    return labels


def _reject_reserved_labels(labels: Mapping[str, _Sourced]) -> None:
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


def _yaml_auth(node: _Node, source: str, path: str, base: Path) -> Auth:
    entries = _mapping(node, source, path, _AUTH_KEYS)
    if "type" not in entries:
        raise ConfigError(f"{_at(source, node.line, path)}: missing key 'type' (bearer or basic)")
    kind_node = entries["type"]
    try:
        kind = _one_of(kind_node.value, ("bearer", "basic"))
    except _Invalid as err:
        raise ConfigError(f"{_at(source, kind_node.line, _child(path, 'type'))}: {err}") from None
    secret = "token" if kind == "bearer" else "password"
    used = ("type", f"{secret}_env", f"{secret}_file", *(("username",) if kind == "basic" else ()))
    for key, line in node.key_lines.items():
        if key not in used:
            raise ConfigError(f"{_at(source, line, _child(path, key))}: not used by type {kind}")
    given = [key for key in (f"{secret}_env", f"{secret}_file") if key in entries]
    if len(given) != 1:
        raise ConfigError(
            f"{_at(source, node.line, path)}: type {kind} needs exactly one of "
            f"{secret}_env or {secret}_file"
        )
    parsers: dict[str, Callable[[object], Any]] = {
        f"{secret}_env": _env_name,
        f"{secret}_file": lambda value: _resolve(base, _text(value)),
        "username": _username,
    }
    raw = {
        key: (entries[key].value, _at(source, entries[key].line, _child(path, key)))
        for key in (*given, "username")
        if key in entries
    }
    if kind == "basic" and "username" not in raw:
        raise ConfigError(f"{_at(source, node.line, path)}: type basic needs a username")
    return Auth(type=kind, **_parse(raw, parsers))


def _username(value: object) -> str:
    name = _name(value)
    if ":" in name:
        raise _Invalid(
            f"must not contain ':' (basic auth separates it from the password there) (got {name!r})"
        )
    return name


def _yaml_target(node: _Node, source: str, path: str, base: Path) -> Target:
    entries = _mapping(node, source, path, _TARGET_KEYS)
    if "url" not in entries:
        raise ConfigError(f"{_at(source, node.line, path)}: missing required key 'url'")
    raw = {
        key: (value.value, _at(source, value.line, _child(path, key)))
        for key, value in entries.items()
        if key in _TARGET_FIELDS
    }
    parsed = _parse(raw, _TARGET_FIELDS)
    if "auth" in entries:
        parsed["auth"] = _yaml_auth(entries["auth"], source, _child(path, "auth"), base)
    if "labels" in entries:
        labels = _labels(entries["labels"], source, _child(path, "labels"))
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
    source = str(path)
    root = _read_tree(path)
    if root is None:
        raise ConfigError(f"{source}:1: the file is empty; it needs targets: or file_sd:")
    entries = _mapping(root, source, "", _TOP_KEYS)
    base = path.parent
    named: dict[str, tuple[str, int]] = {}
    targets = []
    if "targets" in entries:
        items = _sequence(entries["targets"], source, "targets", "a list of targets")
        for i, item in enumerate(items):
            target = _yaml_target(item, source, f"targets[{i}]", base)
            _claim_name(named, target.name, source, item.line, f"targets[{i}]")
            targets.append(target)
    file_sd: list[str] = []
    if "file_sd" in entries:
        for i, item in enumerate(
            _sequence(entries["file_sd"], source, "file_sd", "a list of paths or globs")
        ):
            try:
                file_sd.append(_resolve(base, _text(item.value)))
            except _Invalid as err:
                raise ConfigError(f"{_at(source, item.line, f'file_sd[{i}]')}: {err}") from None
    if not targets and not file_sd:
        line = entries["targets"].line if "targets" in entries else root.line
        raise ConfigError(f"{source}:{line}: no targets: list some under targets: or file_sd:")
    for sd_path in expand_file_sd(file_sd):
        for target, line, item_path in _file_sd_targets(sd_path):
            _claim_name(named, target.name, str(sd_path), line, item_path)
    raw = {
        key: (value.value, _at(source, value.line, key))
        for key, value in entries.items()
        if key in _SETTINGS_FIELDS
    }
    for key, value in (overrides or {}).items():
        if key not in _SETTINGS_FIELDS:
            raise ValueError(
                f"unknown override {key!r}; expected one of {', '.join(_SETTINGS_FIELDS)}"
            )
        if value is not None:
            raw[key] = (value, _SETTINGS_FIELDS[key][1])
    return _settings(raw, tuple(targets), tuple(file_sd))


def _claim_name(
    named: dict[str, tuple[str, int]], name: str, source: str, line: int, path: str
) -> None:
    """Record where a target name is defined; raises naming both places if it is taken."""
    if name in named:
        first_source, first_line = named[name]
        shown = f"line {first_line}" if first_source == source else f"{first_source}:{first_line}"
        raise ConfigError(
            f"{_at(source, line, path)}: duplicate target name {name!r} (first at {shown})"
        )
    named[name] = (source, line)


# ---------------------------------------------------------------- Prometheus file_sd

_GLOB_CHARS = re.compile(r"[*?[]")
# Labels that configure a file_sd target instead of labelling it (besides the names).
_CONFIG_LABELS = ("engine", "cap", "budget_seconds", "quantile", "histogram")
_NAME_LABELS = ("batchscope_name", "name")


def expand_file_sd(patterns: Iterable[str]) -> list[Path]:
    """The files the file_sd entries name now: globs expanded (sorted), plain paths as is.

    A glob matching nothing yields nothing (files may appear later); a plain path is
    returned even if missing, so that loading it reports the problem.
    """
    paths: list[Path] = []
    for pattern in patterns:
        if _GLOB_CHARS.search(pattern):
            paths.extend(Path(p) for p in sorted(glob.glob(pattern)))
        else:
            paths.append(Path(pattern))
    return paths


def load_file_sd(path: str | Path) -> list[Target]:
    """The targets of one Prometheus file_sd file (JSON, or YAML by extension).

    The file is a list of `{"targets": ["host:port", ...], "labels": {...}}` groups.
    Each host:port becomes `http://host:port/metrics`; labels `__scheme__`,
    `__metrics_path__` and `__param_<name>` change the URL; `batchscope_name` or
    `name` names the target (else host:port); `engine`, `cap`, `budget_seconds`,
    `quantile`, `histogram` configure it; other `__` labels are dropped and the rest
    become `Target.labels`. Raises ConfigError for any problem, names unique within
    the file.
    """
    return [target for target, _, _ in _file_sd_targets(Path(path))]


def _file_sd_targets(path: Path) -> list[tuple[Target, int, str]]:
    """Each target with the line and key path that defined it."""
    source = str(path)
    root = _read_tree(path)
    if root is None:
        raise ConfigError(f"{source}:1: the file is empty; expected a list of target groups")
    found: list[tuple[Target, int, str]] = []
    named: dict[str, tuple[str, int]] = {}
    for i, group in enumerate(_sequence(root, source, "", "a list of target groups")):
        entries = _mapping(group, source, f"[{i}]", ("targets", "labels"))
        if "targets" not in entries:
            raise ConfigError(
                f"{_at(source, group.line, f'[{i}]')}: missing required key 'targets'"
            )
        labels = _labels(entries["labels"], source, f"[{i}].labels") if "labels" in entries else {}
        url_parts, parsed = _group_config(labels)
        hosts = _sequence(entries["targets"], source, f"[{i}].targets", "a list of host:port")
        for j, host in enumerate(hosts):
            item_path = f"[{i}].targets[{j}]"
            origin = _at(source, host.line, item_path)
            try:
                address = _text(host.value)
                hostname, port = _split_host_port(address)
                if not hostname or port == 0:
                    raise _Invalid(
                        f"must be host:port with a port from 1 to 65535 (got {address!r})"
                    )
                url = _url(url_parts[0] + address + url_parts[1])
            except _Invalid as err:
                raise ConfigError(f"{origin}: {err}") from None
            target = _target({"name": address, **parsed, "url": url})
            _claim_name(named, target.name, source, host.line, item_path)
            found.append((target, host.line, item_path))
    return found


def _group_config(labels: dict[str, _Sourced]) -> tuple[tuple[str, str], dict[str, Any]]:
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


def _label_number(sourced: _Sourced) -> object:
    """File_sd label values are strings: '256' is read as the number 256."""
    value, origin = sourced
    try:
        return float(str(value))
    except ValueError:
        raise ConfigError(f"{origin}: must be a number (got {value!r})") from None


# ---------------------------------------------------------------- the command line

# Flags that describe the single --target, by Target field.
_TARGET_FLAGS = {
    "url": "--target",
    "name": "--name",
    "engine": "--engine",
    "cap": "--cap",
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
        help=f"scrape timeout (default: min(0.8 x interval, {MAX_TIMEOUT_SECONDS:g}))",
    )
    group.add_argument(
        "--max-response-bytes",
        type=int,
        metavar="N",
        help=f"largest /metrics body accepted (default: {setting['max_response_bytes']})",
    )
    group.add_argument(
        "--history-points",
        type=int,
        metavar="N",
        help="evaluations kept per target for /api/v1/history "
        f"(default: {setting['history_points']})",
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
        for key, (_, flag) in _SETTINGS_FIELDS.items()
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
    target = _target(_parse(target_given, _TARGET_FIELDS))
    return _settings(settings_given, (target,), ())
