"""The exporter's command line: its configuration flags, and Settings from them.

One `--target` with its flags, or `--config FILE` with the settings flags overriding
the file's values. Every check is the configuration's (`batchscope.exporter.config.values`,
declared per field in `settings`), so a value is refused with the same words whether it
came from a flag or a file.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable, Sequence

from batchscope.exporter.config.fleet_file import load_config
from batchscope.exporter.config.line_numbered import Sourced
from batchscope.exporter.config.settings import (
    ENDPOINTS_GROUP,
    FLEET_GROUP,
    HISTORY_GROUP,
    REPLICAS_GROUP,
    SETTINGS_FLAGS,
    TARGET_FLAGS,
    TARGET_GROUP,
    ConfigError,
    ConfigField,
    Settings,
    Target,
    config_fields,
    field_defaults,
    settings_from_values,
    target_from_values,
)


def _dest(flag: str) -> str:
    return flag.removeprefix("--").replace("-", "_")


def _add(group: argparse._ArgumentGroup, spec: ConfigField, default: object) -> None:
    """One field's flag, its help showing the default that applies when it is not given."""
    shown = spec.shown_default if spec.shown_default is not None else default
    group.add_argument(
        spec.flag,
        **({"type": spec.type} if spec.type is not None else {}),
        **({"choices": spec.choices()} if spec.choices is not None else {}),
        metavar=spec.metavar,
        help=spec.help.format(default=shown),
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the exporter's configuration flags, one per field of `Target` and `Settings`
    (`ConfigField`), in --help's groups, with --config first among the fleet's; every
    default is None ("not given"). Help texts show the effective defaults, which
    `settings_from_args` applies."""
    groups = {
        name: parser.add_argument_group(name)
        for name in (TARGET_GROUP, FLEET_GROUP, ENDPOINTS_GROUP, HISTORY_GROUP, REPLICAS_GROUP)
    }
    # --target first: it is the one a single-server run needs.
    add_target_arguments(groups[TARGET_GROUP], ("url", *(k for k in TARGET_FLAGS if k != "url")))
    groups[FLEET_GROUP].add_argument(
        "--config",
        metavar="FILE",
        help="YAML file with targets:, file_sd: and the settings below; "
        "flags given beside it override its values",
    )
    settings = config_fields(Settings)
    for name in (FLEET_GROUP, ENDPOINTS_GROUP, HISTORY_GROUP, REPLICAS_GROUP):
        for key, spec in settings.items():
            if spec.group == name:
                _add(groups[name], spec, field_defaults(Settings)[key])


def add_target_arguments(group: argparse._ArgumentGroup, keys: Sequence[str]) -> None:
    """The flags of the `Target` fields `keys`, as the exporter takes them (another tool
    judging a server the same way, batchscope-loadgen --watch, adds them too)."""
    targets = config_fields(Target)
    defaults = field_defaults(Target)
    for key in keys:
        _add(group, targets[key], defaults[key])


def target_flag_values(args: argparse.Namespace, keys: Iterable[str]) -> dict[str, Sourced]:
    """The `Target` fields among `keys` given on the command line, each with its flag as
    its origin (for `target_from_values`)."""
    given = {}
    for key in keys:
        flag = TARGET_FLAGS[key]
        value = getattr(args, _dest(flag), None)
        if value is not None:
            given[key] = (value, flag)
    return given


def settings_from_args(args: argparse.Namespace) -> Settings:
    """Settings from parsed flags: `--config FILE` plus overriding flags, or one --target.

    Target flags (--target, --name, --engine, --cap, ...) cannot be combined with
    --config, where targets are set in the file. Raises ConfigError, naming the flag.
    """
    target_given = target_flag_values(args, TARGET_FLAGS)
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
