"""Configs written by earlier versions, read as the current schema reads them.

Keys removed or renamed since a run saved its config.yaml: the renamed ones still read (with a warning that
the old name goes), model.norm's old per-decoder keys become model.norm, and a removed key is accepted where
it changes nothing and refused, saying why, where it would. ``run_config_migrations``: the overrides a run's
config.yaml needs for what it could not say when it was written. Nothing here imports the schema: the loader
(``marius_py.config``, ``marius_py.config_loading``) applies what this module decides.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import yaml

from marius_py.errors import MariusInputError

# storage.negative_cache and its three policies were removed. An earlier run's config.yaml names them: off
# (0), it loads as before, whatever its policies said; on, it is refused, saying why and how to go on.
REMOVED_KEYS = ("storage.negative_cache", "storage.negative_cache_refresh", "storage.negative_cache_gradients",
                "storage.negative_cache_draws")
_REMOVED_WHY = ("storage.negative_cache was removed: measured on CoDEx-M and FB15k-237, it brought no ordering "
                "closer to in-memory accuracy (docs/design.md)")

# model.transe_norm and model.rotate_norm (each decoder its own) became model.norm. An earlier run's
# config.yaml holds both: the final decoder's own one becomes model.norm, unless model.norm is given at the
# same level or later (the command line is later than the file), with a warning that the names go.
OLD_NORM_KEYS = {"model.transe_norm": "transe", "model.rotate_norm": "rotate"}


# storage.comet_group_size and storage.comet_split also serve affine: renamed, the old names still read.
RENAMED_KEYS = {"storage.comet_group_size": "storage.group_size", "storage.comet_split": "storage.partition_split"}


def current_name(dotted: str, source) -> str:
    """The current name of a key (an old name warns that it goes)."""
    if dotted not in RENAMED_KEYS:
        return dotted
    warnings.warn(f"{source}: {dotted} is now {RENAMED_KEYS[dotted]}; the old name will be refused in a later "
                  "release", FutureWarning, stacklevel=4)
    return RENAMED_KEYS[dotted]


def check_removed(dotted: str, value, source, line: int | None = None) -> None:
    """Refuse a removed key that would turn the negative cache on."""
    if dotted != "storage.negative_cache":
        return
    try:
        off = float(value) == 0.0
    except (TypeError, ValueError):
        off = False
    if not off:
        raise MariusInputError(f"{dotted}={value!r}: {_REMOVED_WHY}", path=source, line=line,
                               expected=f"no {dotted}, or 0 (a run trained with it continues without it once its "
                                        f"config.yaml says {dotted}: 0.0)")


def without_old_norms(values: dict, level: int, source, found: dict) -> dict:
    """``values`` (a model section) without the old norm keys, which go to ``found`` as (level, value)."""
    for key in [k for k in values if f"model.{k}" in OLD_NORM_KEYS]:
        found[f"model.{key}"] = (level, values[key], source)
    return {key: value for key, value in values.items() if f"model.{key}" not in OLD_NORM_KEYS}


def norm_from_old_keys(decoder: str, found: dict, norm_level: int | None) -> tuple[object, object] | None:
    """(value, source) of model.norm from the old key of the final ``decoder`` (``found``: key -> (level, value,
    source)), unless model.norm was given at the same level or later (``norm_level``); None to keep it."""
    if not found:
        return None
    sources = {str(source) for _, _, source in found.values()}
    warnings.warn(f"{', '.join(sorted(sources))}: {' and '.join(sorted(found))} "
                  f"{'is' if len(found) == 1 else 'are'} now model.norm (one distance norm for transe and rotate); "
                  "the old names will be refused in a later release", FutureWarning, stacklevel=3)
    own = next((key for key, old in OLD_NORM_KEYS.items() if old == decoder), None)
    if own in found and (norm_level is None or found[own][0] > norm_level):
        _, value, source = found[own]
        return value, source
    return None


def run_config_migrations(path: Path) -> list[str]:
    """The ``key=value`` overrides a run's config.yaml (``path``) needs before the user's: what it leaves out
    or meant otherwise when an earlier version wrote it."""
    overrides = []
    if not _saved_key(path, "storage", "dtype"):  # (written before storage.dtype existed: every run was float32)
        overrides = ["storage.dtype=float32", *overrides]
    partitions = _saved_value(path, "storage", "num_partitions")
    if isinstance(partitions, int) and partitions > 1 and _saved_value(path, "storage", "buffer_capacity") == 0:
        # (written before the plan: a buffer of 0 meant every partition, which the plan would choose anew)
        overrides = [f"storage.buffer_capacity={partitions}", *overrides]
    return overrides


def _saved_section(path: Path, section: str) -> dict | None:
    """A section of a run's config.yaml as written (None where it cannot be read: load_config refuses it)."""
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None
    return raw.get(section) if isinstance(raw, dict) and isinstance(raw.get(section), dict) else {}


def _saved_key(path: Path, section: str, key: str) -> bool:
    """Whether a run's config.yaml sets ``section.key`` (a damaged file is left to load_config to refuse)."""
    saved = _saved_section(path, section)
    return saved is None or key in saved


def _saved_value(path: Path, section: str, key: str):
    return (_saved_section(path, section) or {}).get(key)
