"""A validated config from a YAML file and ``key=value`` overrides: read into the schema (``config``), keys of
earlier versions migrated as they are read (``config_migration``), then checked (``config_validation``).

It sits above the three so that none of them imports another's caller: validation reads the schema's
choices and the store's layout (``layout``), and the schema's reading applies the migrations.
"""

from __future__ import annotations

import copy
from pathlib import Path

from marius_py.config import Config, apply_overrides, from_dict, read_yaml, set_key
from marius_py.config_migration import RENAMED_KEYS, norm_from_old_keys
from marius_py.config_validation import validate


def load_config(path: str | Path | None = None, overrides: list[str] | None = None,
                source: object = "overrides") -> Config:
    """Read a YAML config (or the defaults), apply overrides, validate. ``source``: where the overrides came
    from, as errors about them name it (the CLI's: "command line")."""
    config = Config()
    origins: dict = {}
    old_norms: dict = {}
    norm_level = None  # where model.norm itself was given: 0 the file, 1 the overrides
    if path is not None:
        path = Path(path)
        raw, lines = read_yaml(path)
        config = from_dict(raw, source=path, lines=lines, old_norms=old_norms)
        origins.update({RENAMED_KEYS.get(key, key): (path, line) for key, line in lines.items()})
        norm_level = 0 if "model.norm" in lines else None
    apply_overrides(config, overrides or [], source, old_norms)
    given = {RENAMED_KEYS.get(key, key) for key in (item.split("=", 1)[0].strip() for item in overrides or [])}
    origins.update({key: (source, None) for key in given})
    norm_level = 1 if "model.norm" in given else norm_level
    norm = norm_from_old_keys(config.model.decoder, old_norms, norm_level)
    if norm is not None:
        set_key(config, "model.norm", *norm)
    for key, (level, _, where) in old_norms.items():  # (errors about model.norm name where it came from)
        origins.setdefault("model.norm", origins.get(key, (where, None)))
    return validate(config, origins)


def with_overrides(config: Config, overrides: list[str], source: object = "overrides",
                   origins: dict | None = None) -> Config:
    """A validated copy of ``config`` with ``key=value`` overrides applied (``config`` itself is unchanged);
    ``origins`` as ``validate`` takes them."""
    return validate(apply_overrides(copy.deepcopy(config), overrides, source), origins)
