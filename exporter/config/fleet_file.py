"""The YAML fleet file and the targets of Prometheus file_sd files, read into Settings.

`load_config` reads the fleet file (`targets:`, `file_sd:`, `models:` and the settings),
`load_file_sd` one file_sd file, where a group's labels configure its targets. Pure
parsing: every problem is a ConfigError naming the file, the line and the key path.
The files are read by `line_numbered` (line numbers) and `file_sd` (target groups);
each value's check is `values`'.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from batchscope.exporter.config import values
from batchscope.exporter.config.file_sd import expand_file_sd, read_labels, read_target_groups
from batchscope.exporter.config.line_numbered import (
    DocumentError,
    Node,
    Sourced,
    child_path,
    location,
    mapping,
    read_document,
    sequence,
)
from batchscope.exporter.config.models import read_models
from batchscope.exporter.config.reserved_labels import RESERVED_LABELS
from batchscope.exporter.config.settings import (
    SETTINGS_FLAGS,
    SETTINGS_PARSERS,
    TARGET_PARSERS,
    Auth,
    ConfigError,
    Settings,
    Target,
    config_fields,
    parse_values,
    settings_from_values,
    target_from_parsed,
)

_AUTH_KEYS = ("type", "token_env", "token_file", "username", "password_env", "password_file")
# Keys that would put a secret into the file; they get a message saying what to use instead.
_SECRET_REFUSALS = dict.fromkeys(
    ("token", "password", "bearer_token", "credentials"),
    "secrets are not allowed in the configuration; use auth: with token_env or "
    "password_env (an environment variable's name) or token_file or password_file "
    "(a file's path)",
)
_TARGET_KEYS = (*TARGET_PARSERS, "auth", "labels")
_TOP_KEYS = ("targets", "file_sd", "models", *SETTINGS_PARSERS)


@contextmanager
def _as_config_error() -> Iterator[None]:
    """A file the reader cannot read, or of the wrong structure, is a configuration error."""
    try:
        yield
    except DocumentError as err:
        raise ConfigError(str(err)) from None


def _mapping(node: Node, source: str, path: str, allowed: Iterable[str]) -> dict[str, Node]:
    """The node's entries (see `line_numbered.mapping`); a key meant for a secret is refused."""
    return mapping(node, source, path, allowed, _SECRET_REFUSALS)


def _reject_reserved_labels(labels: Mapping[str, Sourced]) -> None:
    for name, (_, origin) in labels.items():
        if name in RESERVED_LABELS or name.startswith("__"):
            raise ConfigError(
                f"{origin}: the exporter sets this label itself; reserved are "
                f"{', '.join(RESERVED_LABELS)} and names starting with __"
            )


# ---------------------------------------------------------------- the YAML file


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
        kind = values.one_of(kind_node.value, ("bearer", "basic"))
    except values.Invalid as err:
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
        f"{secret}_env": values.env_name,
        f"{secret}_file": lambda value: _resolve(base, values.text(value)),
        "username": values.username,
    }
    raw = {
        key: (entries[key].value, location(source, entries[key].line, child_path(path, key)))
        for key in (*given, "username")
        if key in entries
    }
    if kind == "basic" and "username" not in raw:
        raise ConfigError(f"{location(source, node.line, path)}: type basic needs a username")
    return Auth(type=kind, **parse_values(raw, parsers))


def _yaml_target(node: Node, source: str, path: str, base: Path) -> Target:
    entries = _mapping(node, source, path, _TARGET_KEYS)
    if "url" not in entries:
        raise ConfigError(f"{location(source, node.line, path)}: missing required key 'url'")
    raw = {
        key: (value.value, location(source, value.line, child_path(path, key)))
        for key, value in entries.items()
        if key in TARGET_PARSERS
    }
    parsed = parse_values(raw, TARGET_PARSERS)
    if "auth" in entries:
        parsed["auth"] = _yaml_auth(entries["auth"], source, child_path(path, "auth"), base)
    if "labels" in entries:
        labels = read_labels(entries["labels"], source, child_path(path, "labels"))
        _reject_reserved_labels(labels)
        parsed["labels"] = tuple(sorted((name, value) for name, (value, _) in labels.items()))
    return target_from_parsed(parsed)


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
                file_sd.append(_resolve(base, values.text(item.value)))
            except values.Invalid as err:
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
        if key in SETTINGS_PARSERS
    }
    for key, value in overrides.items():
        if key not in SETTINGS_PARSERS:
            raise ValueError(
                f"unknown override {key!r}; expected one of {', '.join(SETTINGS_PARSERS)}"
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

_TARGET_CONFIG = config_fields(Target)
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
                    text = values.text(address.text)
                    hostname, port = values.split_host_port(text)
                    if not hostname or port == 0:
                        raise values.Invalid(
                            f"must be host:port with a port from 1 to 65535 (got {text!r})"
                        )
                    url = values.url(url_parts[0] + text + url_parts[1])
                except values.Invalid as err:
                    raise ConfigError(f"{origin}: {err}") from None
                target = target_from_parsed({"name": text, **parsed, "url": url})
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
    parsed = parse_values(raw, TARGET_PARSERS)
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
