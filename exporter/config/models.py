"""The fleet file's `models:`: each model's bounds on the replica count.

    models:
      llama-3-8b: {min_replicas: 2, max_replicas: 12}
      embedder: {max_replicas: 4}

A key a model leaves out takes the setting for every model (`min_replicas`,
`max_replicas`). Pure parsing: a problem raises DocumentError naming the file, the line
and the key path.
"""

from __future__ import annotations

from batchscope.exporter.config import values
from batchscope.exporter.config.line_numbered import (
    DocumentError,
    Node,
    child_path,
    location,
    mapping,
    wrong_type,
)

# Each key's check: the flags' own, so a model's entry reads as the flag would.
MODEL_KEYS = {"min_replicas": values.min_replicas, "max_replicas": values.count}

ModelBounds = tuple[str, int | None, int | None]


def _whole(node: Node, source: str, path: str, key: str) -> int:
    try:
        return MODEL_KEYS[key](node.value)
    except values.Invalid as err:
        raise DocumentError(f"{location(source, node.line, path)}: {err}") from None


def read_models(node: Node, source: str) -> tuple[ModelBounds, ...]:
    """Each model's (name, min_replicas, max_replicas) under `models:`, in the file's order."""
    if not isinstance(node.value, dict):
        raise DocumentError(
            f"{location(source, node.line, 'models')}: "
            f"{wrong_type(node.value, 'a mapping of model names')}"
        )
    found = []
    for name, entry in node.value.items():
        path = child_path("models", str(name))
        keys = mapping(entry, source, path, tuple(MODEL_KEYS))
        given = {key: _whole(keys[key], source, child_path(path, key), key) for key in keys}
        low, high = given.get("min_replicas"), given.get("max_replicas")
        if low is not None and high is not None and high < low:
            where = location(source, keys["max_replicas"].line, child_path(path, "max_replicas"))
            raise DocumentError(f"{where}: must be >= min_replicas ({low}) (got {high})")
        found.append((str(name), low, high))
    return tuple(found)


def bounds_clash(low: int, high: int | None, models: tuple[ModelBounds, ...]) -> str | None:
    """Why a model's most replicas is below its fewest, its own or the fleet's (`low`,
    `high`) where it leaves a key out; None when none is."""
    for model, own_low, own_high in models:
        least = low if own_low is None else own_low
        most = high if own_high is None else own_high
        if most is not None and most < least:
            return (
                f"models.{model}: max_replicas {most} is below min_replicas {least} (a key "
                "a model leaves out takes the fleet's)"
            )
    return None
