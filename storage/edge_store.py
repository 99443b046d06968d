"""Edges of a preprocessed dataset in one HDF5 file (``edges.h5``).

Layout:
  ``train``                 int64 [E, 3] (head, relation, tail), sorted by bucket
  ``train_bucket_offsets``  int64 [p * p + 1]; bucket (i, j) is rows
                            ``offsets[i * p + j] : offsets[i * p + j + 1]``
  ``valid``, ``test``       int64 [E, 3], input order
Plain graphs (no relation column) store relation 0 everywhere.
"""

from __future__ import annotations

import os
from pathlib import Path

import h5py
import numpy as np

EDGE_FILE = "edges.h5"
SPLITS = ("train", "valid", "test")
_CHUNK_ROWS = 1 << 16


class EdgeStore:
    """Read-only access to a dataset's ``edges.h5``."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self._file = h5py.File(self.path, "r")
        offsets = self._file["train_bucket_offsets"][:]
        self.num_partitions = int(round((len(offsets) - 1) ** 0.5))
        self._offsets = offsets

    def split(self, name: str) -> np.ndarray:
        """All edges of one split as an int64 [E, 3] array."""
        return self._file[name][:]

    def chunks(self, name: str, rows: int = 1 << 22):
        """The edges of one split, ``rows`` at a time (int64 [<= rows, 3] each)."""
        data = self._file[name]
        for start in range(0, data.shape[0], rows):
            yield data[start:start + rows]

    def num_edges(self, name: str) -> int:
        return int(self._file[name].shape[0])

    def bucket_offsets(self) -> np.ndarray:
        return self._offsets.copy()

    def bucket(self, src_partition: int, dst_partition: int) -> np.ndarray:
        """Train edges whose head is in ``src_partition`` and tail in ``dst_partition``."""
        return self.buckets([(src_partition, dst_partition)])[0]

    def buckets(self, pairs) -> list[np.ndarray]:
        """Train edges of each (src, dst) bucket in ``pairs``, in file order (sorted), with few reads.

        Buckets less than one HDF5 chunk apart are read in one call and split in
        memory: HDF5 reads whole chunks anyway, and one call per small bucket
        (comet's many small partitions) costs far more than its bytes.
        """
        p = self.num_partitions
        keys = np.sort(np.fromiter((i * p + j for i, j in pairs), dtype=np.int64))
        starts, ends = self._offsets[keys], self._offsets[keys + 1]
        parts: list[np.ndarray] = []
        first = 0
        for last in range(len(keys)):
            if last + 1 < len(keys) and starts[last + 1] - ends[last] < _CHUNK_ROWS:
                continue  # the next bucket joins this read
            block = self._file["train"][starts[first]:ends[last]]
            parts.extend(block[starts[k] - starts[first]:ends[k] - starts[first]] for k in range(first, last + 1))
            first = last + 1
        return parts

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> "EdgeStore":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class EdgeStoreWriter:
    """Writes ``edges.h5`` incrementally (appends), so callers can stream."""

    def __init__(self, path: str | os.PathLike, num_partitions: int):
        self.path = Path(path)
        self._file = h5py.File(self.path, "w")
        for name in SPLITS:
            self._file.create_dataset(name, shape=(0, 3), maxshape=(None, 3), dtype="int64",
                                      chunks=(_CHUNK_ROWS, 3))
        self.num_partitions = num_partitions

    def append(self, split: str, edges: np.ndarray) -> None:
        if len(edges) == 0:
            return
        data = self._file[split]
        start = data.shape[0]
        data.resize(start + len(edges), axis=0)
        data[start:] = np.asarray(edges, dtype=np.int64)

    def set_bucket_offsets(self, offsets: np.ndarray) -> None:
        offsets = np.asarray(offsets, dtype=np.int64)
        if len(offsets) != self.num_partitions ** 2 + 1:
            raise ValueError(f"need {self.num_partitions ** 2 + 1} offsets, got {len(offsets)}")
        self._file.create_dataset("train_bucket_offsets", data=offsets)

    def close(self) -> None:
        self._file.flush()
        self._file.close()
        with open(self.path, "rb") as handle:
            os.fsync(handle.fileno())
