"""OGB's link-prediction downloads (ogbl-wikikg2, ogbl-biokg, ogbl-citation2) as datasets, with the negatives
OGB ranks each valid and test edge against.

An OGB download keeps its splits as ``torch.save``d dictionaries of NumPy arrays of integer ids
(``split/*/train.pt``: ``head``, ``relation``, ``tail``; valid and test add ``head_neg`` and ``tail_neg``,
[E, K] each; ogbl-biokg gives ids within a node type, with ``head_type`` and ``tail_type``; ogbl-citation2
has ``source_node``, ``target_node`` and ``target_node_neg``). They are read with an unpickler that builds
arrays and nothing else, then preprocessed like any edges, every node of the graph known (an entity that no
train edge has keeps its row, as OGB's protocol ranks it). The negatives are then put in the dataset's own
ids (``dataset.GivenNegatives``), which the ``given`` evaluation protocol ranks against.
"""

from __future__ import annotations

import gzip
import pickle
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from marius_py.dataset import GivenNegatives
from marius_py.edge_text import PAIRS_RELATION, EdgeSource
from marius_py.errors import MariusInputError
from marius_py.storage.durable import write_atomic



@dataclass(frozen=True)
class OgbLayout:
    """How an OGB download holds its graph. ``num_nodes``: the member with the node count
    (``raw/num-node-list.csv.gz``), or, for a typed graph, the count per type (``raw/num-node-dict.csv.gz``),
    or OGB-LSC's ``meta.pt``; ``pairs``: a graph without relations (ogbl-citation2's keys)."""

    num_nodes: str
    typed: bool = False
    pairs: bool = False
    valid_tails: str | None = None  # OGB-LSC (WikiKG90Mv2): splits in .npy, valid's tails apart; no negatives

    @property
    def gives_negatives(self) -> bool:
        return self.valid_tails is None


# ---- reading OGB's files

class _ArraysOnly(pickle.Unpickler):
    """Builds the NumPy arrays and plain containers a split file holds; refuses anything else (a pickle can
    run any code it names)."""

    _ALLOWED = {("collections", "OrderedDict"), ("numpy", "ndarray"), ("numpy", "dtype"),
                ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
                ("numpy.core.multiarray", "scalar"), ("numpy._core.multiarray", "scalar"),
                ("_codecs", "encode")}  # (an array's bytes, as pickle protocol 2 stores them)

    def find_class(self, module: str, name: str):
        # (a dotted name would walk attributes from an allowed one to anything: refused outright)
        if "." not in name and ((module, name) in self._ALLOWED or (module == "numpy.dtypes" and _is_dtype(name))):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"{module}.{name} is not an array")


def _is_dtype(name: str) -> bool:
    """Whether ``numpy.dtypes.NAME`` is one of NumPy's dtype classes (how NumPy 2 pickles an array's dtype)."""
    import numpy.dtypes
    found = getattr(numpy.dtypes, name, None)
    return isinstance(found, type) and issubclass(found, np.dtype)


class _ArraysOnlyModule:
    """The ``pickle_module`` ``torch.load`` unpickles a split file with."""
    Unpickler = _ArraysOnly
    load = staticmethod(lambda file, **kwargs: _ArraysOnly(file, **kwargs).load())
    __name__ = "marius_py.ogb arrays-only pickle"


def read_split(path: Path) -> dict[str, np.ndarray]:
    """One of OGB's split files: key -> array."""
    import torch
    try:
        loaded = torch.load(path, map_location="cpu", pickle_module=_ArraysOnlyModule, weights_only=False)
    except Exception as error:  # (whatever a damaged or hostile file makes the unpickler raise)
        raise MariusInputError(f"cannot read OGB's split file ({type(error).__name__}: {error})", path=path,
                               expected="a dictionary of arrays saved by torch.save, as OGB's split/*/*.pt") \
            from None
    if not isinstance(loaded, dict) or not all(isinstance(v, (np.ndarray, int, np.integer)) for v in loaded.values()):
        raise MariusInputError(f"holds a {type(loaded).__name__} of other things than arrays", path=path,
                               expected="a dictionary of arrays saved by torch.save, as OGB's split/*/*.pt")
    return {key: np.asarray(value) for key, value in loaded.items()}


def read_npy_split(triples: Path, tails: Path | None = None) -> dict[str, np.ndarray]:
    """An OGB-LSC split: [E, 3] (head, relation, tail) ids, or [E, 2] (head, relation) with the tails apart,
    memory-mapped (read a block at a time)."""
    rows = np.load(triples, mmap_mode="r")
    columns = {"head": rows[:, 0], "relation": rows[:, 1]}
    columns["tail"] = np.load(tails, mmap_mode="r") if tails is not None else rows[:, 2]
    return columns


def read_node_counts(path: Path, typed: bool) -> dict[str, int]:
    """Node counts: {"": N}, or per type from a CSV of types over counts (OGB-LSC: ``meta.pt``)."""
    if path.suffix == ".pt":
        return {"": int(read_split(path)["num_entities"])}
    with gzip.open(path, "rt", encoding="utf-8") if path.suffix == ".gz" else open(path, encoding="utf-8") as f:
        lines = [line.strip() for line in f if line.strip()]
    try:
        if typed:
            return dict(zip(lines[0].split(","), (int(n) for n in lines[1].split(","))))
        return {"": int(lines[0].split(",")[0])}
    except (IndexError, ValueError):
        raise MariusInputError("unreadable node counts", path=path,
                               expected="OGB's num-node-list.csv.gz (one count) or num-node-dict.csv.gz (types, "
                                        "then counts)") from None


def node_name(node_type: str, node_id) -> str:
    return f"{node_type}:{node_id}" if node_type else str(node_id)


class OgbEdges(EdgeSource):
    """One split's id arrays as the names preprocessing reads (``TYPE:ID`` for a typed graph, else ``ID``)."""
    origin = "an OGB split file"

    def __init__(self, split: dict[str, np.ndarray], name: str, layout: OgbLayout):
        self.name = name
        self._columns = _edge_columns(split, layout)
        self._pairs = layout.pairs

    def __str__(self) -> str:
        return f"OGB's {self.name} split"

    def blocks(self, block_lines: int, label: str, progress: bool) -> Iterator[tuple[int, list[Sequence[str]]]]:
        (head_types, heads), relations, (tail_types, tails) = self._columns
        for first in range(0, len(heads), block_lines):
            rows = slice(first, first + block_lines)
            names = [_names(head_types, heads, rows), _names(None, relations, rows) if relations is not None
                     else (PAIRS_RELATION,) * len(heads[rows]), _names(tail_types, tails, rows)]
            yield first, names


def _edge_columns(split: dict[str, np.ndarray], layout: OgbLayout):
    if layout.pairs:
        return (None, split["source_node"]), None, (None, split["target_node"])
    types = (split["head_type"], split["tail_type"]) if layout.typed else (None, None)
    return (types[0], split["head"]), split["relation"], (types[1], split["tail"])


def _names(types, ids: np.ndarray, rows: slice) -> list[str]:
    if types is None:
        return list(map(str, ids[rows].tolist()))
    return [f"{t}:{i}" for t, i in zip(np.asarray(types[rows]).tolist(), ids[rows].tolist())]


def all_names(counts: dict[str, int]) -> Iterator[str]:
    for node_type, count in counts.items():
        for node in range(count):
            yield node_name(node_type, node)


def write_lines(path: Path, names) -> None:
    """Names one per line, published whole (runs started together may write the same file)."""
    write_atomic(path, lambda out: out.writelines(f"{name}\n".encode() for name in names))


# ---- the negatives, in the dataset's ids

def mapped_negatives(splits: dict[str, dict[str, np.ndarray]], layout: OgbLayout, node_names: list[str],
                     num_edges: dict[str, int], where: Path) -> dict[str, GivenNegatives]:
    """Each split's OGB negatives in the dataset's ids (its ``node_names``), which must keep every edge."""
    ours = {name: node for node, name in enumerate(node_names)}
    keys = ["target_node_neg"] if layout.pairs else ["head_neg", "tail_neg"]
    directions = ("tails",) if layout.pairs else ("heads", "tails")
    mapped = {}
    for split, arrays in splits.items():
        types = [None] if layout.pairs else ([arrays["head_type"], arrays["tail_type"]] if layout.typed
                                              else [None, None])
        if len(arrays[keys[0]]) != num_edges[split]:
            raise MariusInputError(f"OGB's {split} split has {len(arrays[keys[0]]):,} edges with negatives, the "
                                   f"dataset {num_edges[split]:,}", path=where,
                                   expected="every valid and test edge kept (prepare the dataset again)")
        ids = np.stack([_mapped(arrays[key], kinds, ours, where) for key, kinds in zip(keys, types)], axis=1)
        mapped[split] = GivenNegatives(ids, directions)
    return mapped


def _mapped(negatives: np.ndarray, types, ours: dict[str, int], where: Path) -> np.ndarray:
    """[E, K] OGB ids (within each edge's type, for a typed graph) -> the dataset's ids."""
    negatives = np.asarray(negatives)
    if types is None:
        return _renamed(negatives, "", ours, where)
    out = np.empty(negatives.shape, dtype=np.int64)
    types = np.asarray(types)
    for node_type in np.unique(types).tolist():
        rows = types == node_type
        out[rows] = _renamed(negatives[rows], node_type, ours, where)
    return out


def _renamed(negatives: np.ndarray, node_type: str, ours: dict[str, int], where: Path) -> np.ndarray:
    unique, inverse = np.unique(negatives, return_inverse=True)
    names = [node_name(node_type, n) for n in unique.tolist()]
    unknown = next((name for name in names if name not in ours), None)
    if unknown is not None:
        raise MariusInputError(f"a given negative, {unknown}, is no node of the graph", path=where,
                               expected="negatives among the nodes OGB's node counts give")
    return np.fromiter((ours[name] for name in names), np.int64, len(names))[inverse].reshape(negatives.shape)
