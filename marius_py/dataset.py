"""A preprocessed dataset directory and its loader.

Layout (written by ``marius-py preprocess``, see ``marius_py.preprocess``):
  ``metadata.json``   counts and provenance (``DatasetMetadata``)
  ``nodes.txt``       line ``i`` is the original name of node id ``i``
  ``relations.txt``   line ``i`` is the original name of relation id ``i``
                      (a single ``__edge__`` relation for plain graphs)
  ``edges.h5``        train/valid/test id triples (``storage.edge_store``)
The directory is complete only once ``metadata.json`` exists: it is written last,
atomically, so a crashed or rejected preprocess never looks valid.

The metadata records the dataset's identity (``marius_py.identity``: digests of the names in id order and of
each split's edges). Opening a dataset checks that both names files still hold the names preprocessing wrote
(line count and digest), so no name-keyed output can be misaligned; a dataset written before identities were
recorded gets its identity computed on first open (and recorded in its metadata where the directory is
writable).
"""

from __future__ import annotations

import dataclasses
import json
import numbers
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from marius_py.errors import PATH_TYPES, MariusInputError, check_type
from marius_py.identity import NAME_KEYS, compute_identity, file_digest
from marius_py.storage.durable import write_text_atomic
from marius_py.storage.edge_store import EDGE_FILE, SPLITS, EdgeStore

METADATA_FILE = "metadata.json"
NODES_FILE = "nodes.txt"
RELATIONS_FILE = "relations.txt"
FORMAT_VERSION = 1


@dataclass
class DatasetMetadata:
    num_nodes: int
    num_relations: int
    num_partitions: int
    num_train: int
    num_valid: int
    num_test: int
    has_relations: bool = True
    unseen_policy: str = "drop"  # drop or error (given valid/test files), move (a random split)
    num_dropped_valid: int = 0
    num_dropped_test: int = 0
    num_moved_valid: int = 0  # random split: edges drawn for valid (test) moved into train, their
    num_moved_test: int = 0   # node or relation occurring in no edge drawn for train
    seed: int = 0
    sources: dict = field(default_factory=dict)
    format_version: int = FORMAT_VERSION
    identity: dict = field(default_factory=dict)  # digests of the content (marius_py.identity); {}: not recorded


def write_metadata(directory: Path, metadata: DatasetMetadata) -> None:
    text = json.dumps(dataclasses.asdict(metadata), indent=2, sort_keys=True) + "\n"
    write_text_atomic(Path(directory) / METADATA_FILE, text)


def read_metadata(directory: str | os.PathLike) -> DatasetMetadata:
    path = Path(directory) / METADATA_FILE
    if not path.exists():
        raise MariusInputError("not a preprocessed dataset (no metadata.json)", path=directory,
                               expected="a directory written by `marius-py preprocess`")
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
        known = {f.name for f in dataclasses.fields(DatasetMetadata)}
        metadata = DatasetMetadata(**{k: v for k, v in raw.items() if k in known})
        if not (isinstance(metadata.identity, dict) and all(isinstance(v, str) for v in metadata.identity.values())):
            raise TypeError("its identity is not a mapping of digests")
        return metadata
    except (OSError, UnicodeDecodeError, ValueError, TypeError, AttributeError) as error:
        # (ValueError: not JSON; TypeError: required counts missing; AttributeError: not an object)
        raise MariusInputError(f"unreadable dataset metadata ({type(error).__name__}: {error})", path=path,
                               expected="the metadata.json written by `marius-py preprocess` (preprocess the "
                                        "dataset again)") from None


def write_names(path: Path, names: list[str]) -> None:
    """One name per line, line i for id i; fsynced (it is part of a dataset or export)."""
    with open(path, "w", encoding="utf-8", newline="\n") as handle:
        handle.writelines(f"{name}\n" for name in names)
        handle.flush()
        os.fsync(handle.fileno())


def read_names(path: Path) -> list[str]:
    with open(path, encoding="utf-8", newline="\n") as handle:
        return handle.read().split("\n")[:-1]


GIVEN_NEGATIVES = "given_negatives"  # a dataset's folder of the negatives each valid and test edge is given
_GIVEN_ABOUT = "about.json"          # (written last: it marks the folder complete)


@dataclass(frozen=True)
class GivenNegatives:
    """A split's given negatives, in the dataset's ids: [E, D, K] for the D directions ranked (``heads``:
    candidate heads of each edge; ``tails``: candidate tails), in the split's edge order (OGB's protocol)."""

    ids: np.ndarray
    directions: tuple[str, ...]


def given_negatives(directory: str | os.PathLike, split: str) -> GivenNegatives | None:
    """The negatives a dataset was given for ``split`` (None: it has none)."""
    folder = Path(directory) / GIVEN_NEGATIVES
    if not (folder / _GIVEN_ABOUT).is_file():
        return None
    about = json.loads((folder / _GIVEN_ABOUT).read_text(encoding="utf-8"))
    return GivenNegatives(np.load(folder / f"{split}.npy", mmap_mode="r"), tuple(about["directions"]))


def required_given_negatives(directory: str | os.PathLike, split: str) -> GivenNegatives:
    """``given_negatives``, or the error of ``evaluation.protocol=given`` on a dataset without them."""
    negatives = given_negatives(directory, split)
    if negatives is None:
        raise MariusInputError(f"evaluation.protocol=given: the dataset gives no negatives for its {split} edges",
                               path=directory,
                               expected="a dataset prepared from OGB (ogbl-wikikg2, ogbl-biokg, ogbl-citation2), "
                                        "or evaluation.protocol=filtered or sampled")
    return negatives


def write_given_negatives(directory: str | os.PathLike, negatives: dict[str, GivenNegatives],
                          source: str) -> None:
    """Write each split's given negatives into a dataset being built (each file synced; the description
    last)."""
    folder = Path(directory) / GIVEN_NEGATIVES
    folder.mkdir(exist_ok=True)
    for split, given in negatives.items():
        ids = np.asarray(given.ids)
        narrow = ids.size == 0 or int(ids.max()) < 2 ** 31  # (half the bytes: wikikg2's test split takes 2.4 GB)
        with open(folder / f"{split}.npy", "wb") as out:
            np.save(out, ids.astype(np.int32) if narrow else ids)
            out.flush()
            os.fsync(out.fileno())
    directions = {given.directions for given in negatives.values()}
    write_text_atomic(folder / _GIVEN_ABOUT, json.dumps({"directions": list(directions.pop()),
                                                         "source": source}) + "\n")


class Dataset:
    """A preprocessed dataset: metadata, id<->name maps and edge splits.

    Example::

        ds = Dataset.load("datasets/codex-m")
        ds.num_nodes, ds.train.shape, ds.node_id("Q1041")
    """

    def __init__(self, directory: str | os.PathLike):
        check_type(directory, PATH_TYPES, "Dataset: directory", "a preprocessed dataset's directory, a str or "
                                                                "pathlib.Path (mp.load_dataset also takes edges "
                                                                "held in memory)")
        self.directory = Path(directory)
        self.metadata = read_metadata(self.directory)
        self._edges = EdgeStore(self.directory / EDGE_FILE)  # (a damaged file: one error naming it)
        try:
            self._check_names()  # (first: a dataset from before identities records them only of sound names)
            if not self.metadata.identity:
                self._record_identity()
        except BaseException:
            self._edges.close()
            raise
        self._split_cache: dict[str, np.ndarray] = {}
        self._node_names: list[str] | None = None
        self._relation_names: list[str] | None = None
        self._node_index: dict[str, int] | None = None
        self._relation_index: dict[str, int] | None = None
        self._degrees: np.ndarray | None = None

    @classmethod
    def load(cls, directory: str | os.PathLike) -> "Dataset":
        return cls(directory)

    @property
    def num_nodes(self) -> int:
        return self.metadata.num_nodes

    @property
    def identity(self) -> dict[str, str]:
        """Digests of the dataset's content (``marius_py.identity``)."""
        return self.metadata.identity

    def _record_identity(self) -> None:
        """A dataset from before identities: compute its identity once, and keep it in its metadata where the
        directory may be written (a read-only copy computes it on every open)."""
        self.metadata.identity = compute_identity(self.directory, self._edges)
        try:
            write_metadata(self.directory, self.metadata)
        except OSError:
            pass

    def _check_names(self) -> None:
        """Each names file holds as many lines as the metadata counts, with the digest preprocessing recorded:
        names edited after preprocessing would misalign every name-keyed output."""
        counts = {"nodes": self.metadata.num_nodes, "relations": self.metadata.num_relations}
        for key, file_name in NAME_KEYS.items():
            path = self.directory / file_name
            try:
                lines, digest = file_digest(path)
            except OSError as error:
                raise MariusInputError(f"cannot read the dataset's {key[:-1]} names ({error.strerror})", path=path,
                                       expected=f"the {file_name} `marius-py preprocess` wrote") from None
            recorded = self.metadata.identity.get(key)
            if lines != counts[key]:
                problem = f"{lines:,} names for the dataset's {counts[key]:,} {key}"
            elif recorded is not None and digest != recorded:
                problem = f"the {key[:-1]} names differ from those preprocessing wrote (edited, reordered or replaced)"
            else:
                continue
            raise MariusInputError(f"{problem}: line i must name {key[:-1]} id i", path=path,
                                   expected=f"the {file_name} `marius-py preprocess` wrote: put it back, or "
                                            "preprocess the dataset again (runs trained on it then need training "
                                            "again)")

    @property
    def num_relations(self) -> int:
        return self.metadata.num_relations

    @property
    def edges(self) -> EdgeStore:
        return self._edges

    def split(self, name: str) -> np.ndarray:
        """Edges of ``train``, ``valid`` or ``test`` as int64 [E, 3] (head, relation, tail)."""
        if not isinstance(name, str) or name not in SPLITS:  # (the edge file would be blamed as damaged)
            raise MariusInputError(f"split: {name!r}", expected=" or ".join(map(repr, SPLITS)))
        if name not in self._split_cache:
            self._split_cache[name] = self._edges.split(name)
        return self._split_cache[name]

    @property
    def train(self) -> np.ndarray:
        return self.split("train")

    @property
    def valid(self) -> np.ndarray:
        return self.split("valid")

    @property
    def test(self) -> np.ndarray:
        return self.split("test")

    def all_known_edges(self) -> np.ndarray:
        """Train + valid + test: the filter for filtered ranking."""
        return np.concatenate([self.train, self.valid, self.test])

    @property
    def node_names(self) -> list[str]:
        if self._node_names is None:
            self._node_names = read_names(self.directory / NODES_FILE)
        return self._node_names

    @property
    def relation_names(self) -> list[str]:
        if self._relation_names is None:
            self._relation_names = read_names(self.directory / RELATIONS_FILE)
        return self._relation_names

    def node_id(self, name: str) -> int:
        if self._node_index is None:
            self._node_index = {n: i for i, n in enumerate(self.node_names)}
        return _lookup(self._node_index, name, "node", self.directory / NODES_FILE)

    def relation_id(self, name: str) -> int:
        if self._relation_index is None:
            self._relation_index = {n: i for i, n in enumerate(self.relation_names)}
        return _lookup(self._relation_index, name, "relation", self.directory / RELATIONS_FILE)

    def degrees(self, chunk_rows: int = 1 << 22) -> np.ndarray:
        """Train degree of every node (head + tail occurrences), read ``chunk_rows`` edges at a time: memory
        O(nodes). Counted once per dataset (each validation would read every edge again)."""
        if not isinstance(chunk_rows, numbers.Integral) or isinstance(chunk_rows, bool) or chunk_rows < 1:
            raise MariusInputError(f"degrees: chunk_rows {chunk_rows!r}", expected="a whole number of at least 1")
        if self._degrees is None:
            degrees = np.zeros(self.num_nodes, dtype=np.int64)
            for chunk in self._edges.chunks("train", chunk_rows):
                degrees += np.bincount(chunk[:, 0], minlength=self.num_nodes)
                degrees += np.bincount(chunk[:, 2], minlength=self.num_nodes)
            self._degrees = degrees
        return self._degrees

    def close(self) -> None:
        self._edges.close()


def _lookup(index: dict[str, int], name: str, kind: str, path: Path) -> int:
    check_type(name, str, f"{kind}_id: name", f"a {kind} name, a str")
    try:
        return index[name]
    except KeyError:
        raise MariusInputError(f"unknown {kind} name {name!r}", path=path,
                               expected=f"a {kind} name present in the training data") from None
