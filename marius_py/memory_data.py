"""Edges held in memory -> a dataset directory, through preprocessing's own passes.

``Dataset.from_triples`` (and ``mp.load_dataset`` given edges rather than a path) take, for each split:
  - a NumPy array [E, 3] (head, relation, tail), or [E, 2] (head, tail: a graph without relations), of str
    (dtype ``U``) or of objects that are str;
  - a pandas DataFrame of three columns (two for pairs), or with columns named head, relation and tail (head
    and tail for pairs; other columns are left out). pandas is never imported here: a DataFrame is known by
    the pandas module its caller imported;
  - a list, or any other iterable, of (head, relation, tail) tuples or lists, or of (head, tail) pairs. An
    iterator that can be read only once (a generator) is read once into a list: preprocessing reads train
    twice.

Names are the user's strings as given: no whitespace is stripped (a text file's fields are), so that
``node_id(name)`` takes the very strings the data held. Numbers are refused rather than made into text (7,
7.0 and 7.5 would all be names; ids of 7 and "7" would meet): convert them, e.g. ``array.astype(str)``. A
name may not be empty or blank, missing (None, NaN, pandas' NA), hold a newline, carriage return, tab or NUL
(names are stored one per line) or be text UTF-8 cannot encode (a lone surrogate). Errors name the split,
the row (from 0, by position, in a DataFrame too) and the column.

Streaming: each split is a ``MemoryEdges``, an ``edge_text.EdgeSource`` that preprocessing reads as it reads a
file: blocks of ``_BLOCK_ROWS`` rows, made into names and checked one block at a time (a block of the
user's arrays is held as Python strings, never the whole of them). Ids, the random split, unseen policies,
buckets and the identity are preprocessing's, so a dataset from memory is the one a text file with the same
names gives (its sources aside).

Where: ``directory`` (new or empty, as preprocess wants), else the dataset cache
(``$MARIUS_PY_CACHE/datasets``) under a key of the content: a digest of every split's names, row by row,
and of the options. Computing it reads (and checks) all the data once before anything is written; the same
names in any form (list, array, DataFrame) find the same dataset again.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from itertools import islice
from operator import itemgetter
from pathlib import Path

import numpy as np
from tqdm import tqdm

from marius_py import dataset
from marius_py.dataset_cache import build_once, cache_dir
from marius_py.edge_text import PAIRS_RELATION, EdgeSource
from marius_py.errors import PATH_TYPES, MariusInputError, check_type
from marius_py.preprocess import PreprocessOptions, _valid_fractions, _validate_options, preprocess

__all__ = ["Dataset", "MemoryEdges", "is_edge_data", "write_triples"]

DEFAULT_SPLIT = (0.05, 0.05)  # (valid, test) fractions of a random split
_BLOCK_ROWS = 1 << 15  # rows made into names at a time (as preprocessing parses lines)
ROLES = ("head", "relation", "tail")
PAIR_ROLES = ("head", "tail")
_FORBIDDEN = {"\n": "a newline", "\r": "a carriage return", "\t": "a tab", "\0": "a NUL character"}
_NAME_EXPECTED = "a str name, neither empty nor blank, without newlines, tabs or NUL: names are stored one per line"
_NUMBERS_HINT = "str names; numbers are not taken as names: convert them, e.g. with array.astype(str)"
_NO_ROW = object()
_DATA_EXPECTED = ("edges held in memory: a NumPy array [E, 3] of str names (head, relation, tail) or [E, 2] "
                  "(head, tail), a pandas DataFrame, or a list of (head, relation, tail) tuples")


def write_triples(train, valid=None, test=None, *, directory=None, split=None, seed=0, pairs=None,
                  num_partitions=1, unseen_policy="drop", progress=False, argument: str = "train") -> Path:
    """Preprocess edges held in memory into ``directory`` (new or empty), or into the cache unless it holds
    them already; return the dataset's directory. ``argument``: what messages call ``train``."""
    check_type(progress, (bool, np.bool_), "progress", "True or False")
    check_type(pairs, (bool, np.bool_, type(None)), "pairs", "True (head, tail pairs), False (triples) or None "
                                                             "(told by the data's width)")
    if directory is not None:
        check_type(directory, PATH_TYPES, "directory", "a new or empty directory's path, a str or pathlib.Path")
    options = PreprocessOptions(pairs=False, num_partitions=num_partitions, seed=seed, unseen_policy=unseen_policy,
                                split_fractions=_checked_split(split, valid, test))
    _validate_options(options)  # (before the data is read)
    sources = _sources(train, valid, test, argument, pairs)
    options.pairs = sources[0].pairs
    def build(output) -> None:
        with _rows_named(sources):
            preprocess(output, **dict(zip(("train", "valid", "test"), sources)), options=options, progress=progress)
    if directory is not None:
        build(directory)
        return Path(directory)
    output = cache_dir() / "datasets" / f"memory-{_content_key(sources, options, progress)}-p{num_partitions}"
    return build_once(output, f"preprocessing edges held in memory into {output}", progress, lambda: build(output))


def is_edge_data(value) -> bool:
    """Whether ``value`` may be edges held in memory (an array, a DataFrame, an iterable of rows) rather than a
    path, a name or a mistake of another type."""
    if isinstance(value, (str, bytes, Mapping, os.PathLike)):
        return False
    return isinstance(value, (np.ndarray, Iterable)) or _is_data_frame(value)


def _is_data_frame(value) -> bool:
    pandas = sys.modules.get("pandas")  # (imported by whoever made a DataFrame)
    return pandas is not None and isinstance(value, pandas.DataFrame)


def _checked_split(split, valid, test) -> tuple[float, float]:
    """The random split's (valid, test) fractions; a split with valid and test given, or only one of them, or
    fractions that leave train nothing are refused."""
    if (valid is None) != (test is None):
        given, missing = ("valid", "test") if test is None else ("test", "valid")
        raise MariusInputError(f"{given} given without {missing}",
                               expected="train, valid and test, or train alone to split at random")
    if split is None:
        return DEFAULT_SPLIT
    if valid is not None:
        raise MariusInputError(f"split {split!r} cannot be honoured: valid and test are given",
                               expected="a split with train alone, or no split")
    if not _valid_fractions(split):
        raise MariusInputError(f"split {split!r} cannot be honoured",
                               expected="(valid, test) fractions in [0, 1) that sum to less than 1, e.g. (0.05, 0.05)")
    return tuple(split)


def _sources(train, valid, test, argument: str, pairs: bool | None) -> list[MemoryEdges]:
    """Each split given as a ``MemoryEdges``; all of one width (triples or pairs)."""
    sources = [MemoryEdges(train, "train", argument, pairs)]
    if valid is not None:
        sources += [MemoryEdges(data, split, split, sources[0].pairs) for split, data in
                    (("valid", valid), ("test", test))]
    return sources


@contextmanager
def _rows_named(sources: list[MemoryEdges]):
    """Preprocessing's errors name a place as ``path:line``; an edge held in memory is a split's row."""
    labels = {str(source) for source in sources}
    try:
        yield
    except MariusInputError as error:
        if error.line is None or error.path not in labels:
            raise
        raise MariusInputError(error.problem, path=f"{error.path}, row {error.line}",
                               expected=error.expected) from None


def _content_key(sources: list[MemoryEdges], options: PreprocessOptions, progress: bool) -> str:
    """A digest of every split's names and of the options (reading and checking all the data). Names hold no tab
    nor newline: a block's columns, each its names joined by newlines and ended by a tab, tell its rows."""
    content = {"options": dataclasses.asdict(options), "splits": {}}
    for source in sources:
        digest = hashlib.sha256()
        for _, names in source.blocks(_BLOCK_ROWS, f"reading {source.name}", progress):
            digest.update("".join("\n".join(column) + "\t" for column in names).encode())
        content["splits"][source.name] = digest.hexdigest()
    return hashlib.sha256(json.dumps(content, sort_keys=True, default=int).encode()).hexdigest()[:16]


# ---------------------------------------------------------------- one split's edges

class MemoryEdges(EdgeSource):
    """One split's edges held in memory, given to preprocessing as blocks of checked names."""
    origin = "in memory"

    def __init__(self, data, split: str, argument: str, pairs: bool | None):
        self.name = split
        self._argument = argument
        self._rows = _rows_of(data, argument, pairs)
        self.pairs = self._rows.width == 2
        if pairs is not None and bool(pairs) != self.pairs:
            wanted = "2 columns (head, tail)" if pairs else "3 columns (head, relation, tail)"
            reason = f"pairs={bool(pairs)}" if split == "train" else "train has"
            raise MariusInputError(f"{argument} has {self._rows.width} columns", expected=f"{wanted}, as {reason}")

    def __str__(self) -> str:
        return self._argument

    def blocks(self, block_lines: int, label: str, progress: bool) -> Iterator[tuple[int, list[Sequence[str]]]]:
        roles = PAIR_ROLES if self.pairs else ROLES
        with tqdm(total=self._rows.count, desc=label, unit=" edges", leave=False,
                  disable=None if progress else True) as bar:
            for first, columns in self._rows.blocks(block_lines):
                names = [self._names(values, first, self._rows.column_labels[c], role)
                         for c, (values, role) in enumerate(zip(columns, roles))]
                if self.pairs:
                    names.insert(1, (PAIRS_RELATION,) * len(names[0]))
                yield first, names
                bar.update(len(names[0]))

    def _names(self, values: list, first: int, column: str, role: str) -> list[str]:
        """One column of a block as names, or the error for the first value that is not one."""
        if set(map(type, values)) != {str} or not _clean_names(values):
            for index, value in enumerate(values):
                problem = _name_problem(value)
                if problem is not None:
                    numbers = isinstance(value, (int, float, np.number)) and not _is_missing(value)
                    raise MariusInputError(problem, path=f"{self._argument}, row {first + index}, {column} ({role})",
                                           expected=_NUMBERS_HINT if numbers else _NAME_EXPECTED)
            values = list(map(str, values))  # (str subclasses, such as NumPy's)
        return values


def _clean_names(names: list[str]) -> bool:
    """Whether every name of a block is fine, checked at C speed (``_name_problem`` says what is not)."""
    text = "\n".join(names)
    if text.count("\n") != len(names) - 1 or any(char in text for char in "\r\t\0") or "" in map(str.strip, names):
        return False
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # (a lone surrogate)
        return False
    return True


def _name_problem(value) -> str | None:
    """What makes ``value`` no name, or None."""
    if _is_missing(value):
        return f"missing name ({value!r})"
    if not isinstance(value, str):
        return f"name {value!r} is a {type(value).__name__}"
    if not value.strip():
        return f"blank name {value!r}" if value else "empty name"
    for char, what in _FORBIDDEN.items():
        if char in value:
            return f"name {_snippet(value)} holds {what}"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as error:
        return f"name {_snippet(value)} is not UTF-8 text ({error.reason} at character {error.start})"
    return None


def _is_missing(value) -> bool:
    """None, NaN (any float type) or pandas' NA and NaT (told by type name: pandas is not imported here)."""
    return (value is None or type(value).__name__ in ("NAType", "NaTType")
            or (isinstance(value, (float, np.floating)) and value != value))


def _snippet(name: str, limit: int = 60) -> str:
    return repr(name if len(name) <= limit else name[:limit] + "...")


# ---------------------------------------------------------------- rows of each kind of data

def _rows_of(data, argument: str, pairs: bool | None):
    """The rows of an array, a DataFrame or an iterable, a block of columns at a time."""
    if isinstance(data, np.ndarray):
        return _ArrayRows(data, argument)
    if _is_data_frame(data):
        return _FrameRows(data, argument, pairs)
    if not is_edge_data(data):
        raise MariusInputError(f"{argument} is a {type(data).__name__}", expected=_DATA_EXPECTED)
    return _IterableRows(data, argument)


def _no_edges(argument: str) -> MariusInputError:
    return MariusInputError(f"{argument} holds no edges", expected=f"at least one edge: {_DATA_EXPECTED}")


class _ArrayRows:
    """A 2-D array of names, [E, 3] or [E, 2]."""

    def __init__(self, array: np.ndarray, argument: str):
        if array.ndim != 2 or array.shape[1] not in (2, 3):
            raise MariusInputError(f"{argument} is a {array.ndim}-D array of shape {array.shape}",
                                   expected="an array [E, 3] (head, relation, tail) or [E, 2] (head, tail)")
        if array.dtype.kind not in "UO":
            numbers = array.dtype.kind in "iufcb"
            raise MariusInputError(f"{argument} is a ndarray of {array.dtype}" + (" numbers" if numbers else ""),
                                   expected=_NUMBERS_HINT if numbers else "a str (U) or object array of names")
        if len(array) == 0:
            raise _no_edges(argument)
        self._array = array
        self.width, self.count = array.shape[1], len(array)
        self.column_labels = [f"column {c}" for c in range(self.width)]

    def blocks(self, rows: int) -> Iterator[tuple[int, list[list]]]:
        for start in range(0, self.count, rows):
            block = self._array[start:start + rows]  # (a view)
            yield start, [block[:, c].tolist() for c in range(self.width)]


class _FrameRows:
    """The head, (relation,) tail columns of a DataFrame: those so named, else all three (two)."""

    def __init__(self, frame, argument: str, pairs: bool | None):
        labels = list(frame.columns)
        candidates = {None: (ROLES, PAIR_ROLES), True: (PAIR_ROLES,), False: (ROLES,)}[None if pairs is None
                                                                                          else bool(pairs)]
        named = next((roles for roles in candidates if all(role in labels for role in roles)), None)
        if named is not None:
            twice = next((role for role in named if labels.count(role) > 1), None)
            if twice is not None:
                raise MariusInputError(f"{argument} is a DataFrame with two columns named {twice!r}",
                                       expected="one column of each name")
            self._positions = [labels.index(role) for role in named]
        elif any(len(labels) == len(roles) for roles in candidates):
            self._positions = list(range(len(labels)))
        else:
            raise MariusInputError(f"{argument} is a DataFrame with {len(labels)} columns "
                                   f"({', '.join(map(repr, labels))})",
                                   expected="three columns (head, relation, tail), or columns named head, relation "
                                            "and tail (two, or head and tail, for pairs)")
        if len(frame) == 0:
            raise _no_edges(argument)
        self._frame = frame
        self.width, self.count = len(self._positions), len(frame)
        self.column_labels = [f"column {labels[p]!r}" for p in self._positions]

    def blocks(self, rows: int) -> Iterator[tuple[int, list[list]]]:
        for start in range(0, self.count, rows):
            yield start, [self._frame.iloc[start:start + rows, p].tolist() for p in self._positions]


class _IterableRows:
    """An iterable of rows, each a tuple, list or 1-D array of 3 (or 2) names; read again for every pass."""
    _ROW_TYPES = (tuple, list, np.ndarray)

    def __init__(self, data: Iterable, argument: str):
        if iter(data) is data:  # one pass only (a generator): keep its rows for the passes
            data = list(data)
        first = next(iter(data), _NO_ROW)
        if first is _NO_ROW:
            raise _no_edges(argument)
        self._data, self._argument = data, argument
        self.width = len(first) if isinstance(first, self._ROW_TYPES) else 0
        if self.width not in (2, 3):
            self._raise_bad_row(0, first)
        self.count = len(data) if isinstance(data, Sequence) else None
        self.column_labels = [f"column {c}" for c in range(self.width)]

    def blocks(self, rows: int) -> Iterator[tuple[int, list[list]]]:
        items, start = iter(self._data), 0
        while block := list(islice(items, rows)):
            if set(map(type, block)) - {tuple, list} or set(map(len, block)) != {self.width}:  # (at C speed)
                bad = next((i for i, row in enumerate(block)
                            if not isinstance(row, self._ROW_TYPES) or len(row) != self.width), None)
                if bad is not None:
                    self._raise_bad_row(start + bad, block[bad])
            yield start, [list(map(itemgetter(c), block)) for c in range(self.width)]  # (zip(*block): 10x slower)
            start += len(block)

    def _raise_bad_row(self, index: int, row) -> None:
        expected = (f"rows of {self.width} names, as row 0" if index else
                    "rows of 3 names (head, relation, tail) or of 2 (head, tail), each a tuple or list")
        if isinstance(row, self._ROW_TYPES):
            raise MariusInputError(f"{self._argument}, row {index}: {len(row)} items", expected=expected)
        raise MariusInputError(f"{self._argument}, row {index}: a {type(row).__name__} ({_snippet(str(row))})",
                               expected=expected)


class Dataset(dataset.Dataset):
    """The preprocessed dataset as the package exports it (``mp.Dataset``): ``marius_py.dataset.Dataset``, which
    the layers below preprocessing use, and ``from_triples``, which preprocesses (so it lives above it)."""

    @classmethod
    def from_triples(cls, train, valid=None, test=None, *, directory: str | os.PathLike | None = None,
                     split: tuple[float, float] | None = None, seed: int = 0, pairs: bool | None = None,
                     num_partitions: int = 1, unseen_policy: str = "drop", progress: bool = False) -> "Dataset":
        """A dataset preprocessed from edges held in memory (``marius_py.memory_data``): a NumPy array [E, 3] of
        str names (head, relation, tail) or [E, 2] (head, tail; ``pairs`` None tells them by width), a pandas
        DataFrame, or a list of name tuples, for ``train`` (split at random with ``split``, the (valid, test)
        fractions, default (0.05, 0.05)) or for ``train``, ``valid`` and ``test``. Written into ``directory``
        (new or empty), else into the dataset cache under a key of the content, where the same edges are found
        again. ``seed``, ``num_partitions`` and ``unseen_policy`` are preprocess's options."""
        return cls(write_triples(train, valid, test, directory=directory, split=split, seed=seed, pairs=pairs,
                                 num_partitions=num_partitions, unseen_policy=unseen_policy, progress=progress))
