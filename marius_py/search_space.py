"""The search space of ``marius-py tune``: config keys and how each is drawn, from a YAML file or a mapping.

    training.lr: {low: 0.01, high: 0.3, log: true}   # a range, drawn on a log scale
    model.dim: {low: 64, high: 512, step: 64}         # a linear range in steps of 64
    training.batch_size: [500, 1000, 2000]            # choices (also written {choices: [...]})

A range takes its type from its key (int or float keys only); every bound and choice is converted and
checked as the config checks the key, so a bad one is refused, naming the file and line, before any trial
runs. Needs no Optuna: only ``Dimension.suggest`` calls a trial.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import yaml

from marius_py.bundled import bundled_space
from marius_py.config import Config, YamlKind, coerce_key, key_type, read_yaml_text
from marius_py.config_loading import with_overrides
from marius_py.errors import MariusInputError

SPACE_YAML = YamlKind("search space file", "a YAML mapping of config keys to ranges or choices",
                      "like 'training.lr: {low: 0.01, high: 0.3, log: true}'")
RANGE_FIELDS = ("low", "high", "log", "step")
PRUNERS = ("median", "halving", "none")  # how tune stops unpromising trials (search._pruner)
SPEC_EXPECTED = ("a range {low: L, high: H} (optionally log: true or step: S) for an int or float key, or "
                 "choices: a list [a, b, ...]")


@dataclass(frozen=True)
class Dimension:
    """One searched key: a range (``low``, ``high``, ``log``, ``step``) or ``choices``."""

    key: str
    line: int | None  # where the space file gives it
    kind: str         # the key's type: int, float, str or bool
    low: float | int | None = None
    high: float | int | None = None
    log: bool = False
    step: float | int | None = None
    choices: tuple = ()

    def suggest(self, trial):
        """The value an Optuna trial draws for this key."""
        if self.choices:
            return trial.suggest_categorical(self.key, list(self.choices))
        suggest = trial.suggest_int if self.kind == "int" else trial.suggest_float
        step = {} if self.step is None else {"step": self.step}
        return suggest(self.key, self.low, self.high, log=self.log, **step)

    def extremes(self) -> tuple:
        """The values checked against the config before the search: the bounds, or every choice."""
        return self.choices or (self.low, self.high)

    def contains(self, value) -> bool:
        """Whether the search can draw ``value`` (the base config's, run as the first trial)."""
        if self.choices:
            return value in self.choices
        on_grid = self.step is None or math.isclose((value - self.low) / self.step,
                                                     round((value - self.low) / self.step))
        return self.low <= value <= self.high and on_grid


@dataclass(frozen=True)
class SearchSpace:
    dimensions: tuple[Dimension, ...]
    source: str  # the file (or "space" for a mapping), as errors name it
    text: str    # the space as YAML, saved in the search directory

    def suggest(self, trial) -> dict:
        return {dimension.key: dimension.suggest(trial) for dimension in self.dimensions}

    def base_params(self, base: Config) -> dict:
        """The base config's value of every searched key the space can draw."""
        values = {d.key: getattr(getattr(base, d.key.split(".")[0]), d.key.split(".")[1]) for d in self.dimensions}
        return {d.key: values[d.key] for d in self.dimensions if d.contains(values[d.key])}

    def check(self, base: Config) -> None:
        """Every bound and choice, one key at a time on ``base``, must make a valid config; the error names
        the space's line."""
        for d in self.dimensions:
            for value in d.extremes():
                try:
                    with_overrides(base, [f"{d.key}={value}"], self.source, {d.key: (self.source, d.line)})
                except MariusInputError as error:
                    if error.path == self.source:
                        raise
                    raise MariusInputError(f"{d.key}={value} makes the config invalid: {error.problem}",
                                           path=self.source, line=d.line, expected=error.expected) from None


def read_space(space: str | Path | Mapping) -> SearchSpace:
    """A search space from a YAML file, the name of a bundled one (``fb15k-237``), or a mapping of keys."""
    if isinstance(space, Mapping):
        raw, lines, source, text = dict(space), {}, "space", yaml.safe_dump(dict(space), sort_keys=False)
    elif isinstance(space, (str, Path)):
        path = Path(space)
        if not path.exists() and bundled_space(str(space)) is not None:
            path = bundled_space(str(space))
        raw, lines, text = read_yaml_text(path, SPACE_YAML)
        source = str(path)
    else:
        raise MariusInputError(f"space: a {type(space).__name__}", expected="a YAML file's path or a mapping of "
                                                                             "config keys to ranges or choices")
    if not isinstance(raw, dict) or not raw:
        raise MariusInputError("no keys to search" if isinstance(raw, dict) else f"a {type(raw).__name__}, not a "
                               "mapping", path=source, line=lines.get(""), expected=SPACE_YAML.shape)
    return SearchSpace(tuple(_dimension(str(key), spec, source, lines) for key, spec in raw.items()), source, text)


def _dimension(key: str, spec, source: str, lines: dict) -> Dimension:
    line = lines.get(key)
    kind = key_type(key, source, line)
    if isinstance(spec, list):
        return _choices(key, kind, spec, source, line)
    if isinstance(spec, dict) and "choices" in spec:
        if len(spec) > 1:
            raise MariusInputError(f"{key}: choices with {', '.join(k for k in spec if k != 'choices')}",
                                   path=source, line=line, expected="choices alone, or a range")
        return _choices(key, kind, spec["choices"], source, lines.get(f"{key}.choices", line))
    if isinstance(spec, dict):
        return _range(key, kind, spec, source, lines)
    raise MariusInputError(f"{key}: {spec!r} is neither a range nor choices", path=source, line=line,
                           expected=SPEC_EXPECTED + " (a fixed value is a key=value override)")


def _choices(key: str, kind: str, values, source: str, line: int | None) -> Dimension:
    if not isinstance(values, list) or not values:
        raise MariusInputError(f"{key}: choices {values!r}", path=source, line=line,
                               expected="a non-empty list, e.g. [500, 1000]")
    choices = tuple(coerce_key(key, value, source, line) for value in values)
    if len(set(choices)) < len(choices):
        raise MariusInputError(f"{key}: a choice given twice in {values!r}", path=source, line=line,
                               expected="each choice once")
    return Dimension(key, line, kind, choices=choices)


def _range(key: str, kind: str, spec: dict, source: str, lines: dict) -> Dimension:
    line = lines.get(key)
    unknown = [field for field in spec if field not in RANGE_FIELDS]
    if unknown:
        raise MariusInputError(f"{key}: unknown field {unknown[0]!r}", path=source,
                               line=lines.get(f"{key}.{unknown[0]}", line), expected=SPEC_EXPECTED)
    if kind not in ("int", "float"):
        raise MariusInputError(f"{key}: a range, but the key takes a {kind}", path=source, line=line,
                               expected=f"choices for a {kind} key, e.g. {key}: [a, b]")
    if "low" not in spec or "high" not in spec:
        raise MariusInputError(f"{key}: a range needs low and high", path=source, line=line, expected=SPEC_EXPECTED)
    low, high, step = (None if spec.get(f) is None else coerce_key(key, spec[f], source, lines.get(f"{key}.{f}", line))
                       for f in ("low", "high", "step"))
    log = spec.get("log", False)
    problem = _range_problem(low, high, log, step)
    if problem:
        raise MariusInputError(f"{key}: {problem}", path=source, line=line, expected=SPEC_EXPECTED)
    return Dimension(key, line, kind, low=low, high=high, log=log, step=step)


def _range_problem(low, high, log, step) -> str | None:
    """What is wrong with a range's fields (None: nothing)."""
    if not all(math.isfinite(value) for value in (low, high) + ((step,) if step is not None else ())):
        return f"low {low}, high {high}: bounds must be finite numbers"
    if not isinstance(log, bool):
        return f"log {log!r} is not true or false"
    if not low < high:
        return f"low {low} is not below high {high}"
    if log and low <= 0:
        return f"log scale with low {low}: a log range needs low > 0"
    if step is not None and (log or step <= 0):
        return f"step {step}: " + ("a log range takes no step" if log else "expected step > 0")
    return None
