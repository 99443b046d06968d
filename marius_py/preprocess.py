"""Streaming preprocessor: delimited edge files -> a dataset directory.

Reads ``head<TAB>relation<TAB>tail`` lines (or ``head<TAB>tail`` pairs for plain
graphs), plain text or ``.gz``, strict UTF-8, LF or CRLF, and writes the layout
described in ``marius_py.dataset``.

Passes (no pass holds the edge list in memory):
  1. Stream the train input (the single input in split mode) and give every node
     and relation name its first-appearance index; only train edges define ids
     (in split mode, names only valid/test draws have come after them: their
     edges move into train in pass 2). A seeded permutation then turns these indices into ids, so ids are in random
     order and contiguous id ranges are random partitions. nodes.txt and
     relations.txt are written.
  2. Stream valid, test, then train again (valid/test first so that their errors
     surface before the long train work). Names map to ids; valid/test edges are
     appended to ``edges.h5`` chunk by chunk. Train edges with one partition are
     appended directly; with ``p > 1`` each chunk is sorted by bucket and spilled
     as one "run" to a scratch HDF5 file, with its per-bucket counts.
  3. (p > 1) Copy bucket by bucket from every run into ``edges.h5`` so that each
     bucket's edges are contiguous (input order inside a bucket), then write the
     ``p*p+1`` offsets.
All files go to a hidden sibling directory that is renamed into place after
``metadata.json`` (written last) exists; on any error it is removed, so the
output directory never exists unless it is complete. A killed run cannot remove
its own: the next preprocess to the same output removes those whose process is
gone (``storage.durable.staging_for``). A dataset replaced with ``overwrite``
waits in ``.NAME.old-HOST-PID`` until the new one is in place; a run killed
between those two renames leaves the output missing, and the next one puts the
old dataset back before anything else (``storage.durable.restore_replaced``).

Memory bound, O(distinct names + chunk_lines), whatever the number of edges:
  ~ (150 bytes + name length) x distinct node and relation names (dicts, names)
  + ~ 100 bytes x chunk_lines         (id buffers of the splits, concatenation, sort)
  + ~ 40 MB fixed                     (a parsed block of <= 32768 lines, a 1 MiB chunk's lines, HDF5 caches)
  + 8 bytes x p^2 x (train edges / chunk_lines)   (bucket counts of the runs)
Measured above the interpreter's baseline: 3M edges, 20k nodes, p=4: 35 MB at
chunk_lines=10**4, 140 MB at 10**6; 1M edges, 1M distinct nodes: 180 MB.

Speed: ~2.5 us per edge line for both passes together (~400k lines/s); text is
split block by block with C-level list operations, not line by line.

Determinism: the same inputs, options and seed give the same ids and the same
edges in every split, for any ``chunk_lines``: the random split draws one uniform
number per edge, in input order, from its own seeded stream. The split is
per-edge Bernoulli, so its fractions hold in expectation, not exactly. As in
PyKEEN, an edge drawn for valid/test with a node or relation that no edge drawn
for train has is moved into train (counted in ``num_moved_valid/test``), so no
edge and no name is lost: pass 1 gives every name of the file an id (a name seen
only in valid/test draws makes its edges move), train-drawn names first, so ids
are those of a train-only pass when nothing moves. ``unseen_policy`` applies to
explicitly given valid/test files only ("error" with a random split is refused).

Input rules (``marius_py.edge_text``, which reads and checks the lines): surrounding
whitespace of every field is stripped; names may not be empty; 2 or 3 fields a
line (more with explicit ``columns``); a UTF-8 BOM is ignored; LF and CRLF line
endings are read, a carriage return elsewhere, a NUL byte or a line over 1 MiB is
an error (CR-only line endings, UTF-16 or binary files); blank lines only at the
end of a file; a wrong field count on line 1 gets the hint the lines after it suggest (``--skip-header`` for a
header, ``--pairs`` for two fields, ``--columns`` for more).
"""

from __future__ import annotations

import dataclasses
import gc
import os
import shutil
import sys
from contextlib import closing, contextmanager
from dataclasses import dataclass
from itertools import repeat
from pathlib import Path
from types import MappingProxyType
from typing import Callable, Iterator, Mapping, Sequence

import h5py
import numpy as np
from tqdm import tqdm

from marius_py.dataset import (GIVEN_NEGATIVES, METADATA_FILE, NODES_FILE, RELATIONS_FILE, Dataset, DatasetMetadata,
                               read_names, write_metadata, write_names)
from marius_py.edge_text import (PAIRS_RELATION, EdgeSource, _EdgeBlock, _iter_blocks, pipes_copied,
                                 refuse_special_file)
from marius_py.errors import MariusInputError
from marius_py.identity import compute_identity
from marius_py.resources import available_memory
from marius_py.storage.durable import (is_disk_full, replace_directory, reporting_full_disk, restore_replaced,
                                       staging_for)
from marius_py.storage.edge_store import EDGE_FILE, SPLITS, EdgeStore, EdgeStoreWriter, close_hdf5, create_hdf5
from marius_py.storage.partitioning import bucket_of, most_partitions_filled, partitions_filled

__all__ = ["PAIRS_RELATION", "UNSEEN_POLICIES", "PreprocessOptions", "preprocess", "rebucket"]

UNSEEN_POLICIES = ("drop", "error")
TRAIN, VALID, TEST = range(3)  # split codes; SPLITS[code] is the split's name
RUNS_FILE = "train_runs.h5"
_BLOCK_LINES = 1 << 15  # lines parsed at a time (bounded: a parsed line costs ~0.5 KB)
_NO_NAMES: Mapping[str, int] = MappingProxyType({})


@dataclass
class PreprocessOptions:
    delimiter: str = "\t"
    # Indices of (head, relation, tail), or (head, tail) with pairs; None: (0, 1, 2) / (0, 1)
    # and the line must have exactly that many fields; explicit columns allow extra fields.
    columns: tuple[int, ...] | None = None
    pairs: bool = False  # plain graph: no relation column, one relation "__edge__"
    skip_header: int = 0  # leading lines skipped in every input file
    num_partitions: int = 1
    split_fractions: tuple[float, float] = (0.05, 0.05)  # (valid, test), single input only
    seed: int = 0
    # given valid/test files' edges with names unseen in train: drop or error (a random split moves them
    # into train instead)
    unseen_policy: str = "drop"
    chunk_lines: int = 1_000_000  # edges buffered per split before writing
    # Files of names, one per line: every node (relation) of the graph, those no train edge has included.
    # They get ids (rows that train leaves as initialised), so valid/test edges with them are kept.
    known_nodes: str | None = None
    known_relations: str | None = None


@dataclass(frozen=True)
class _Input:
    path: Path | EdgeSource  # a file, or edges from elsewhere (held in memory)
    split: int | None  # split code, or None: split each edge at random


def preprocess(output_dir: str | os.PathLike, train: str | os.PathLike,
               valid: str | os.PathLike | None = None, test: str | os.PathLike | None = None,
               options: PreprocessOptions | None = None, progress: bool = True,
               overwrite: bool = False,
               finish: Callable[[Path, DatasetMetadata], None] | None = None) -> DatasetMetadata:
    """Preprocess edge files into ``output_dir``; return its metadata.

    Give ``train``, ``valid`` and ``test``, or ``train`` alone to split it at random
    with ``options.split_fractions``. ``progress`` shows progress bars and notes on
    stderr. An existing dataset in ``output_dir`` is replaced only with ``overwrite``.
    Bad input raises ``MariusInputError`` and leaves ``output_dir`` untouched. An input may be a
    pipe (a FIFO, or ``<(command)``'s /dev/fd/N): it is read once into the staging directory; or an
    ``EdgeSource``, edges that are not a file (``marius_py.memory_data``: held in memory). ``finish(staging,
    metadata)`` adds to or checks the built dataset before it is published: its error leaves nothing.
    """
    options = options or PreprocessOptions()
    _validate_options(options)
    inputs = _resolve_inputs(train, valid, test)
    if inputs[0].split is None and options.unseen_policy == "error":  # ("drop", the default, is no choice made)
        raise MariusInputError("unseen_policy 'error' (--unseen error) applies only to given valid/test files",
                               expected="no unseen_policy with a random split (it moves edges whose node or "
                                        "relation no train edge has into train)")

    def build(staging: Path) -> DatasetMetadata:  # (the pipes' copies are removed before it is published)
        with pipes_copied([item.path for item in inputs], staging) as paths, _gc_paused():
            readable = [dataclasses.replace(item, path=path) for item, path in zip(inputs, paths)]
            metadata = _build_dataset(staging, readable, options, progress)
        if finish is not None:
            finish(staging, metadata)
        return metadata
    return _build_staged(Path(output_dir), overwrite, build)


def rebucket(source: str | os.PathLike, output_dir: str | os.PathLike, num_partitions: int,
             progress: bool = True) -> DatasetMetadata:
    """Copy the preprocessed dataset ``source`` into ``output_dir`` with its train edges bucketed for
    ``num_partitions``; return the copy's metadata.

    A partition is a range of node ids, so ids, names, valid and test (and their given negatives) stay as they
    are; only the order of the train edges and their bucket offsets change. ``output_dir`` must be new or
    empty.
    """
    source = Path(source)
    with closing(Dataset(source)) as dataset:  # (its identity, computed once for a dataset from before them)
        metadata = dataset.metadata
    _check_partition_count(metadata.num_nodes, num_partitions)
    options = PreprocessOptions(num_partitions=num_partitions)

    def build(staging: Path) -> DatasetMetadata:
        for name in (NODES_FILE, RELATIONS_FILE):
            shutil.copyfile(source / name, staging / name)
        if (source / GIVEN_NEGATIVES).is_dir():  # (valid and test keep their ids and order)
            shutil.copytree(source / GIVEN_NEGATIVES, staging / GIVEN_NEGATIVES)
        with EdgeStore(source / EDGE_FILE) as edges, \
                closing(_EdgeWriter(staging, metadata.num_nodes, options)) as writer:
            for code, split in enumerate(SPLITS):
                for block in edges.chunks(split, options.chunk_lines):
                    writer.add(code, block)
            writer.finish(progress)
        copy = dataclasses.replace(metadata, num_partitions=num_partitions)
        write_metadata(staging, copy)  # last: marks the directory complete
        return copy
    return _build_staged(Path(output_dir), False, build)


def _build_staged(output_dir: Path, overwrite: bool, build) -> DatasetMetadata:
    """Run ``build(staging)`` in a scratch directory beside ``output_dir`` and publish it there whole:
    on any error nothing half-written is left, and an existing dataset is replaced only with ``overwrite``.
    First of all, a dataset that a killed overwrite had moved aside (the output missing) is put back."""
    restored = restore_replaced(output_dir, METADATA_FILE)
    if restored is not None:
        print(f"note: {output_dir} was missing: put back the dataset that a killed run replacing it had moved "
              f"to {restored.name}", file=sys.stderr)
    _check_output_dir(output_dir, overwrite)
    made = [folder for folder in output_dir.parents if not folder.exists()]  # (removed again on failure)
    with reporting_full_disk(f"writing the dataset {output_dir}", output_dir.parent):
        try:
            output_dir.parent.mkdir(parents=True, exist_ok=True)
            staging = staging_for(output_dir, METADATA_FILE)  # (abandoned ones of killed runs removed)
            staging.mkdir()
        except OSError as error:
            if is_disk_full(error):
                raise
            blocker = next((p for p in output_dir.parents if p.exists() and not p.is_dir()), None)
            reason = f"{blocker} is a file, not a directory" if blocker else error.strerror or str(error)
            raise MariusInputError(f"cannot create the output directory ({reason})", path=output_dir,
                                   expected="an output path whose parent is, or can be made, a writable "
                                            "directory") from None
        try:
            metadata = build(staging)
            _publish(staging, output_dir, overwrite)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            _remove_empty(made)
            raise
    return metadata


def _remove_empty(folders: list[Path]) -> None:
    """Remove ``folders`` (deepest first) where they are empty: the output's parents a failed preprocess made."""
    for folder in folders:
        try:
            folder.rmdir()
        except OSError:
            return


@contextmanager
def _gc_paused():
    """Pause the cyclic GC: parsing makes millions of short-lived lists, and each
    collection rescans every live name (2-3x slower overall); we create no cycles."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


# ---------------------------------------------------------------- validation

def _options_error(name: str, value: object, expected: str) -> MariusInputError:
    return MariusInputError(f"preprocess option {name}: got {value!r}", expected=expected)


def _is_int(value: object) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def _validate_options(options: PreprocessOptions) -> None:
    if not isinstance(options.delimiter, str) or not options.delimiter \
            or "\n" in options.delimiter or "\r" in options.delimiter:
        raise _options_error("delimiter", options.delimiter, "a non-empty string without newlines")
    num_columns = 2 if options.pairs else 3
    if options.columns is not None:
        columns = tuple(options.columns)
        if (len(columns) != num_columns or not all(_is_int(c) and c >= 0 for c in columns)
                or len(set(columns)) != num_columns):
            raise _options_error("columns", options.columns,
                                 f"{num_columns} distinct column indices >= 0")
    for name, minimum in (("skip_header", 0), ("num_partitions", 1), ("seed", 0),
                          ("chunk_lines", 1)):
        value = getattr(options, name)
        if not _is_int(value) or value < minimum:
            raise _options_error(name, value, f"an integer >= {minimum}")
    if not _valid_fractions(options.split_fractions):
        raise _options_error("split_fractions", options.split_fractions,
                             "(valid, test) fractions in [0, 1) that sum to less than 1")
    if options.unseen_policy not in UNSEEN_POLICIES:
        raise _options_error("unseen_policy", options.unseen_policy, " or ".join(UNSEEN_POLICIES))
    for name in ("known_nodes", "known_relations"):
        value = getattr(options, name)
        if value is not None and not (isinstance(value, (str, os.PathLike)) and Path(value).is_file()):
            raise _options_error(name, value, "a file of names, one per line")


def _check_partition_count(num_nodes: int, num_partitions: int) -> None:
    """Every partition holds nodes, and the p x p bucket counts fit in memory (before they are allocated)."""
    if num_partitions > 1 and partitions_filled(num_nodes, num_partitions) < num_partitions:
        valid = most_partitions_filled(num_nodes, num_partitions)
        raise _options_error("num_partitions", num_partitions,
                             f"at most {valid} partitions for {num_nodes:,} nodes (more would leave some empty)")
    needed = 3 * 8 * num_partitions ** 2  # per-run bucket counts, their sum and the offsets, int64
    available = available_memory()
    if available is not None and needed > available:
        raise _options_error("num_partitions", num_partitions,
                             f"fewer partitions: {num_partitions} x {num_partitions} bucket counts need "
                             f"{needed / 2**30:.1f} GiB, {available / 2**30:.1f} GiB is available")


def _valid_fractions(value: object) -> bool:
    try:
        fractions = tuple(value)
    except TypeError:
        return False
    return (len(fractions) == 2 and sum(fractions) < 1
            and all(isinstance(f, (int, float)) and 0 <= f < 1 for f in fractions))


def _resolve_inputs(train, valid, test) -> list[_Input]:
    if (valid is None) != (test is None):
        raise MariusInputError("got only one of valid and test",
                               expected="train, valid and test files, or a single file to split")
    if valid is None:
        inputs = [_Input(_input_path(train), None)]
    else:
        inputs = [_Input(_input_path(path), code)
                  for path, code in ((train, TRAIN), (valid, VALID), (test, TEST))]
    for item in inputs:
        if isinstance(item.path, EdgeSource):
            continue  # (no file to find)
        refuse_special_file(item.path, "input", expected="an edge file: a file, a FIFO or <(command)")
        if not item.path.exists():
            raise MariusInputError("input file not found", path=item.path,
                                   expected="an existing edge file")
    return inputs


def _input_path(value) -> Path | EdgeSource:
    return value if isinstance(value, EdgeSource) else Path(value)


def _check_output_dir(output_dir: Path, overwrite: bool) -> None:
    """Refuse to clobber: only an empty directory, or a dataset with overwrite, is replaced."""
    if not output_dir.exists() or (output_dir.is_dir() and not any(output_dir.iterdir())):
        return
    if not output_dir.is_dir():
        raise MariusInputError("output path exists and is not a directory", path=output_dir,
                               expected="a new or empty directory")
    if not (output_dir / METADATA_FILE).exists():  # never delete what is not ours
        raise MariusInputError("output directory exists, is not empty and holds no dataset",
                               path=output_dir, expected="a new or empty directory")
    if not overwrite:
        raise MariusInputError("output directory already holds a dataset", path=output_dir,
                               expected="a new or empty directory, or overwrite (--overwrite)")


def _publish(staging: Path, output_dir: Path, overwrite: bool) -> None:
    """Rename the complete staging directory into place (replacing an old one only with ``overwrite``).

    Without ``overwrite`` an empty directory is removed with rmdir and the staging renamed onto nothing:
    if another process published the same output meanwhile, either fails (not empty) and theirs stays.
    """
    _check_output_dir(output_dir, overwrite)  # again: it may have changed meanwhile
    if output_dir.exists() and not overwrite:  # empty (checked)
        os.rmdir(output_dir)
    replace_directory(staging, output_dir, METADATA_FILE)  # a dataset replaced waits in .NAME.old-HOST-PID


# ---------------------------------------------------------------- splits

class _SplitAssigner:
    """Seeded split codes, one per edge: Bernoulli draws with the split fractions.

    float64 draws take one value each from the stream, so codes for blocks of any
    size concatenate to the same sequence: the split ignores chunk_lines.
    """

    def __init__(self, fractions: tuple[float, float], seed: np.random.SeedSequence):
        self._rng = np.random.default_rng(seed)
        self._valid, self._test = fractions

    def codes(self, count: int) -> np.ndarray:
        uniform = self._rng.random(count)
        codes = np.full(count, TRAIN, dtype=np.int8)
        codes[uniform < self._valid + self._test] = TEST
        codes[uniform < self._valid] = VALID
        return codes


def _edge_blocks(inputs: list[_Input], options: PreprocessOptions, split_seed, label: str,
                 progress: bool) -> Iterator[_EdgeBlock]:
    """Blocks of edges of several inputs, each with its split codes."""
    for item in inputs:
        assigner = _SplitAssigner(tuple(options.split_fractions), split_seed)  # same per pass
        block_lines, desc = min(options.chunk_lines, _BLOCK_LINES), f"{label} {item.path.name}"
        blocks = (item.path.blocks(block_lines, desc, progress) if isinstance(item.path, EdgeSource)
                  else _iter_blocks(item.path, options, desc, progress, block_lines))
        for first_line, names in blocks:
            splits = item.split if item.split is not None else assigner.codes(len(names[0]))
            yield _EdgeBlock(item.path, first_line, *names, splits)


# ---------------------------------------------------------------- pass 1: ids

@dataclass
class _Names:
    """Pass 1's result: first-appearance index of every node and relation name (then, after
    ``_assign_random_ids``, its id), and how many of each come from train edges (the first indices)."""
    nodes: dict[str, int]
    relations: dict[str, int]
    num_train: int  # edges of the train input, or drawn for train by the random split
    num_train_nodes: int
    num_train_relations: int


def _collect_names(inputs: list[_Input], options: PreprocessOptions, split_seed, progress: bool) -> _Names:
    """Every train node and relation name; with a random split also the names only valid/test draws have,
    after them (their edges move into train)."""
    nodes: dict[str, int] = {}
    relations: dict[str, int] = {}
    held_out_nodes: dict[str, int] = {}  # names of valid/test draws not (yet) in train (random split)
    held_out_relations: dict[str, int] = {}
    num_train = 0
    train_inputs = [item for item in inputs if item.split in (TRAIN, None)]
    for block in _edge_blocks(train_inputs, options, split_seed, "names", progress):
        if isinstance(block.splits, np.ndarray):
            num_train += _add_edge_names(nodes, relations, *block.select((block.splits == TRAIN).tolist()))
            _add_edge_names(held_out_nodes, held_out_relations, *block.select((block.splits != TRAIN).tolist()),
                            known=(nodes, relations))
        else:
            num_train += _add_edge_names(nodes, relations, block.heads, block.relations, block.tails)
    names = _Names(nodes, relations, num_train, len(nodes), len(relations))
    _add_names(nodes, held_out_nodes)  # (a random split of a tiny file may draw no train edge at all)
    _add_names(relations, held_out_relations)
    for index, known in ((nodes, options.known_nodes), (relations, options.known_relations)):
        if known is not None:
            _add_names(index, read_names(Path(known)))
    return names


def _add_edge_names(nodes: dict[str, int], relations: dict[str, int], heads: Sequence[str],
                    rels: Sequence[str], tails: Sequence[str],
                    known: tuple[Mapping[str, int], Mapping[str, int]] = (_NO_NAMES, _NO_NAMES)) -> int:
    """Add the names of edges to ``nodes`` and ``relations`` (those in ``known`` excepted); the edge count."""
    interleaved = [""] * (2 * len(heads))  # head, tail, head, tail: appearance order
    interleaved[0::2], interleaved[1::2] = heads, tails
    _add_names(nodes, interleaved, known[0])
    _add_names(relations, rels, known[1])
    return len(heads)


def _add_names(index: dict[str, int], names: Sequence[str], known: Mapping[str, int] = _NO_NAMES) -> None:
    """Give names not yet in ``index`` (nor in ``known``) the next indices, in order of first appearance."""
    for name in dict.fromkeys(names):  # unique, in order, at C speed (hashing: most of the time)
        if name not in index and name not in known:  # (filterfalse/update at C speed measured no faster)
            index[name] = len(index)


def _assign_random_ids(index: dict[str, int], num_train: int,
                       seed: np.random.SeedSequence) -> tuple[list[str], np.ndarray]:
    """Replace first-appearance indices by a seeded permutation, in place: (names by id, whether each id's
    name is one of the first ``num_train``, those of train edges)."""
    permutation = np.random.default_rng(seed).permutation(len(index))
    in_train = np.zeros(len(index), dtype=bool)
    in_train[permutation[:num_train]] = True
    permutation = permutation.tolist()
    names = [""] * len(index)
    for name, first in index.items():
        index[name] = new_id = permutation[first]
        names[new_id] = name
    return names, in_train


# ---------------------------------------------------------------- pass 2: edges

class _BucketRuns:
    """Train edges spilled as bucket-sorted runs (one per chunk) to a scratch file."""

    def __init__(self, path: Path, num_nodes: int, num_partitions: int):
        self._path = path
        self._file = create_hdf5(path)  # (a full disk: an error where it happens, not a crash)
        self._edges = self._file.create_dataset("edges", shape=(0, 3), maxshape=(None, 3),
                                                dtype="int64", chunks=(1 << 14, 3))
        self._num_nodes = num_nodes
        self._num_partitions = num_partitions
        self._run_counts: list[np.ndarray] = []  # per run: edges in each bucket

    def add(self, edges: np.ndarray) -> None:
        buckets = bucket_of(edges[:, 0], edges[:, 2], self._num_nodes, self._num_partitions)
        order = np.argsort(buckets, kind="stable")  # stable: input order inside a bucket
        start = self._edges.shape[0]
        self._edges.resize(start + len(edges), axis=0)
        self._edges[start:] = edges[order]
        self._run_counts.append(np.bincount(buckets, minlength=self._num_partitions ** 2))

    def copy_to(self, writer: EdgeStoreWriter, max_rows: int, progress: bool) -> np.ndarray:
        """Append all runs to ``writer`` bucket by bucket; return the bucket offsets."""
        close_hdf5(self._file, self._path)  # written: read back through HDF5's chunk cache
        self._file = h5py.File(self._path, "r")
        edges = self._file["edges"]
        counts = np.array(self._run_counts, dtype=np.int64).reshape(-1, self._num_partitions ** 2)
        run_starts = np.cumsum(counts.sum(axis=1)) - counts.sum(axis=1)
        starts = run_starts[:, None] + np.cumsum(counts, axis=1) - counts  # [run, bucket]
        pending: list[np.ndarray] = []
        num_pending = 0
        for bucket in tqdm(range(counts.shape[1]), desc="buckets", leave=False,
                           disable=None if progress else True):
            for run in np.flatnonzero(counts[:, bucket]):
                start = starts[run, bucket]
                pending.append(edges[start:start + counts[run, bucket]])
                num_pending += int(counts[run, bucket])
                if num_pending >= max_rows:
                    writer.append("train", np.concatenate(pending))
                    pending, num_pending = [], 0
        if pending:
            writer.append("train", np.concatenate(pending))
        offsets = np.zeros(counts.shape[1] + 1, dtype=np.int64)
        offsets[1:] = np.cumsum(counts.sum(axis=0))
        return offsets

    def close(self) -> None:
        close_hdf5(self._file, self._path)


class _EdgeWriter:
    """Buffers id triples per split; flushes a split once it holds ``chunk_lines`` edges."""

    def __init__(self, staging: Path, num_nodes: int, options: PreprocessOptions):
        self._staging = staging
        self._store = EdgeStoreWriter(staging / EDGE_FILE, options.num_partitions)
        self._runs = (_BucketRuns(staging / RUNS_FILE, num_nodes, options.num_partitions)
                      if options.num_partitions > 1 else None)
        self._chunk_lines = options.chunk_lines
        self._pending: list[list[np.ndarray]] = [[] for _ in SPLITS]
        self._num_pending = [0] * len(SPLITS)
        self.counts = [0] * len(SPLITS)

    def add(self, code: int, edges: np.ndarray) -> None:
        self._pending[code].append(edges)
        self._num_pending[code] += len(edges)
        if self._num_pending[code] >= self._chunk_lines:
            self._flush(code)

    def _flush(self, code: int) -> None:
        if not self._pending[code]:
            return
        edges = np.concatenate(self._pending[code])
        self._pending[code], self._num_pending[code] = [], 0
        self.counts[code] += len(edges)
        if code == TRAIN and self._runs is not None:
            self._runs.add(edges)
        else:
            self._store.append(SPLITS[code], edges)

    def finish(self, progress: bool) -> None:
        """Flush every split and write the train bucket offsets."""
        for code in range(len(SPLITS)):
            self._flush(code)
        if self._runs is None:
            offsets = np.array([0, self.counts[TRAIN]], dtype=np.int64)
        else:
            offsets = self._runs.copy_to(self._store, self._chunk_lines, progress)
            self._close_runs()
        self._store.set_bucket_offsets(offsets)

    def _close_runs(self) -> None:
        if self._runs is not None:
            self._runs.close()
            self._runs = None
            (self._staging / RUNS_FILE).unlink(missing_ok=True)

    def close(self) -> None:
        try:
            self._close_runs()
        finally:  # (a full disk fails both: neither file is left open)
            self._store.close()


def _map_ids(block: _EdgeBlock, nodes: dict[str, int], relations: dict[str, int]) -> np.ndarray:
    """int64 [rows, 3] ids of a block; -1 for a name that train does not have."""
    ids = np.empty((len(block), 3), dtype=np.int64)
    for column, (names, index) in enumerate(((block.heads, nodes), (block.relations, relations),
                                             (block.tails, nodes))):
        ids[:, column] = np.fromiter(map(index.get, names, repeat(-1)), dtype=np.int64,
                                     count=len(names))
    return ids


def _unseen_error(block: _EdgeBlock, row: int, ids: np.ndarray, split: str) -> MariusInputError:
    names = (block.heads[row], block.relations[row], block.tails[row])
    column = int(np.flatnonzero(ids[row] < 0)[0])
    what = ("node {!r} (head)", "relation {!r}", "node {!r} (tail)")[column].format(names[column])
    return MariusInputError(
        f"{split} edge has {what}, which no train edge has",
        path=block.path, line=block.first_line + row,
        expected="only nodes and relations that occur in train, "
                 "or unseen_policy 'drop' (--unseen drop)")


def _rows_of_split(block: _EdgeBlock, code: int) -> np.ndarray:
    if isinstance(block.splits, np.ndarray):
        return np.flatnonzero(block.splits == code)
    return np.arange(len(block)) if block.splits == code else np.empty(0, dtype=np.int64)


def _write_block(block: _EdgeBlock, ids: np.ndarray, writer: _EdgeWriter,
                 options: PreprocessOptions, dropped: list[int]) -> None:
    """Route a block's edges to their splits, applying the unseen policy."""
    for code in (TRAIN, VALID, TEST):
        rows = _rows_of_split(block, code)
        if len(rows) == 0:
            continue
        unseen = (ids[rows] < 0).any(axis=1)
        if unseen.any():
            first = int(rows[np.argmax(unseen)])
            if code == TRAIN:  # pass 1 saw every train name: the file changed under us
                raise MariusInputError("input changed during preprocessing", path=block.path,
                                       line=block.first_line + first,
                                       expected="input files left unchanged")
            if options.unseen_policy == "error":
                raise _unseen_error(block, first, ids, SPLITS[code])
            dropped[code] += int(unseen.sum())
            rows = rows[~unseen]
        writer.add(code, ids[rows])


def _move_unseen_to_train(block: _EdgeBlock, ids: np.ndarray, in_train: tuple[np.ndarray, np.ndarray],
                          moved: list[int]) -> None:
    """Random split: give valid/test draws with a node or relation that no train draw has the train code
    (counted per split in ``moved``). A name without an id (-1: the file changed) moves too, and the
    train routing then reports it."""
    nodes_in_train, relations_in_train = in_train
    seen = ((ids >= 0).all(axis=1) & nodes_in_train.take(ids[:, 0], mode="clip")
            & relations_in_train.take(ids[:, 1], mode="clip") & nodes_in_train.take(ids[:, 2], mode="clip"))
    move = ~seen & (block.splits != TRAIN)
    if move.any():
        for code in (VALID, TEST):
            moved[code] += int(np.count_nonzero(move & (block.splits == code)))
        block.splits = np.where(move, TRAIN, block.splits).astype(np.int8)


def _write_edges(staging: Path, inputs: list[_Input], options: PreprocessOptions, names: _Names,
                 in_train: tuple[np.ndarray, np.ndarray], split_seed,
                 progress: bool) -> tuple[list[int], list[int], list[int]]:
    """Pass 2 (and 3): map names to ids and write edges.h5; (counts, dropped, moved) per split."""
    dropped, moved = [0] * len(SPLITS), [0] * len(SPLITS)
    # valid and test first: their errors (unseen names) surface before the long train work
    ordered = sorted(inputs, key=lambda item: item.split not in (VALID, TEST))
    _check_partition_count(len(names.nodes), options.num_partitions)
    with closing(_EdgeWriter(staging, len(names.nodes), options)) as writer:
        for block in _edge_blocks(ordered, options, split_seed, "edges", progress):
            ids = _map_ids(block, names.nodes, names.relations)
            if isinstance(block.splits, np.ndarray):
                _move_unseen_to_train(block, ids, in_train, moved)
            _write_block(block, ids, writer, options, dropped)
        writer.finish(progress)
        return writer.counts, dropped, moved


# ---------------------------------------------------------------- assembly

def _build_dataset(staging: Path, inputs: list[_Input], options: PreprocessOptions,
                   progress: bool) -> DatasetMetadata:
    node_seed, relation_seed, split_seed = np.random.SeedSequence(options.seed).spawn(3)
    names = _collect_names(inputs, options, split_seed, progress)
    node_names, nodes_in_train = _assign_random_ids(names.nodes, names.num_train_nodes, node_seed)
    relation_names, relations_in_train = _assign_random_ids(names.relations, names.num_train_relations,
                                                            relation_seed)
    write_names(staging / NODES_FILE, node_names)
    write_names(staging / RELATIONS_FILE, relation_names)
    counts, dropped, moved = _write_edges(staging, inputs, options, names, (nodes_in_train, relations_in_train),
                                          split_seed, progress)
    if counts[TRAIN] != names.num_train + sum(moved):
        raise MariusInputError("input changed during preprocessing", path=inputs[0].path,
                               expected="input files left unchanged")
    random_split = inputs[0].split is None
    if progress:
        _print_notes(counts, dropped, moved)
    metadata = DatasetMetadata(
        num_nodes=len(names.nodes), num_relations=len(names.relations),
        num_partitions=options.num_partitions, num_train=counts[TRAIN],
        num_valid=counts[VALID], num_test=counts[TEST], has_relations=not options.pairs,
        unseen_policy="move" if random_split else options.unseen_policy, num_dropped_valid=dropped[VALID],
        num_dropped_test=dropped[TEST], num_moved_valid=moved[VALID], num_moved_test=moved[TEST],
        seed=options.seed, sources=_sources(inputs))
    with EdgeStore(staging / EDGE_FILE) as edges:
        metadata.identity = compute_identity(staging, edges)
    write_metadata(staging, metadata)  # last: marks the directory complete
    return metadata


def _sources(inputs: list[_Input]) -> dict[str, str]:
    return {SPLITS[item.split if item.split is not None else TRAIN]:
            item.path.origin if isinstance(item.path, EdgeSource) else os.path.abspath(item.path)
            for item in inputs}


def _print_notes(counts: list[int], dropped: list[int], moved: list[int]) -> None:
    for code in (VALID, TEST):
        if dropped[code]:
            total = counts[code] + dropped[code]
            print(f"note: dropped {dropped[code]} of {total} {SPLITS[code]} edges with a node "
                  f"or relation absent from train (unseen_policy=drop)", file=sys.stderr)
        if moved[code]:
            total = counts[code] + moved[code]
            print(f"note: moved {moved[code]} of {total} edges drawn for {SPLITS[code]} into train: their node "
                  f"or relation occurs in no edge drawn for train", file=sys.stderr)
