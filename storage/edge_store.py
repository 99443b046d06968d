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
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Iterator

import h5py
import numpy as np

from marius_py.errors import MariusInputError

EDGE_FILE = "edges.h5"
SPLITS = ("train", "valid", "test")
_CHUNK_ROWS = 1 << 16


def create_hdf5(path: str | os.PathLike) -> h5py.File:
    """A new HDF5 file whose data writes reach the disk in the call that makes them: no chunk cache, no sieve
    buffer. With them, HDF5 writes data late, when a dataset is closed; h5py closes datasets in
    ``__dealloc__``, which drops the error of a full disk and leaves the library half-closed, so the next
    flush dies of a segmentation fault. (Metadata still waits for the close, whose failure h5py raises.)"""
    access = h5py.h5p.create(h5py.h5p.FILE_ACCESS)
    access.set_libver_bounds(h5py.h5f.LIBVER_EARLIEST, h5py.h5f.LIBVER_LATEST)  # (h5py.File's default)
    metadata_slots, chunk_slots, _, _ = access.get_cache()
    access.set_cache(metadata_slots, chunk_slots, 0, 0.0)
    access.set_sieve_buf_size(0)
    return h5py.File(h5py.h5f.create(os.fsencode(path), h5py.h5f.ACC_TRUNC, fapl=access))


def close_hdf5(file: h5py.File, path: str | os.PathLike) -> None:
    """Close ``file`` (from ``create_hdf5``). A failed close (its metadata writes on a full disk) leaves HDF5
    holding the file: it is emptied, so that the writes find room, closed again and removed; the error raised."""
    try:
        file.close()
    except BaseException:
        with suppress(OSError):
            os.truncate(path, 0)
        with suppress(Exception):
            file.close()
        Path(path).unlink(missing_ok=True)
        raise


@contextmanager
def new_hdf5(path: str | os.PathLike) -> Iterator[h5py.File]:
    """``create_hdf5`` for a ``with`` block, closed by ``close_hdf5`` at its end."""
    file = create_hdf5(path)
    try:
        yield file
    finally:
        close_hdf5(file, path)


def damaged_edge_file(path: Path, error: BaseException) -> MariusInputError:
    """The error of an ``edges.h5`` that is missing, truncated or damaged (a chunk failing its checksum)."""
    problem = "missing" if not path.exists() else "damaged or truncated"
    return MariusInputError(f"the dataset's edge file is {problem} ({type(error).__name__}: {error})", path=path,
                            expected="the edges.h5 `marius-py preprocess` wrote: preprocess the dataset again")


@contextmanager
def _damage_reported(path: Path) -> Iterator[None]:
    try:
        yield
    except (OSError, KeyError, ValueError, RuntimeError) as error:  # (h5py's errors of a damaged file)
        raise damaged_edge_file(path, error) from None


class EdgeStore:
    """Read-only access to a dataset's ``edges.h5``. A file that cannot be read (missing, truncated, a chunk
    whose checksum fails) is one ``MariusInputError`` naming it, when opened or read."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        with _damage_reported(self.path):
            self._file = h5py.File(self.path, "r")
            offsets = self._file["train_bucket_offsets"][:]
        self.num_partitions = int(round((len(offsets) - 1) ** 0.5))
        self._offsets = offsets

    def split(self, name: str) -> np.ndarray:
        """All edges of one split as an int64 [E, 3] array."""
        with _damage_reported(self.path):
            return self._file[name][:]

    def chunks(self, name: str, rows: int = 1 << 22):
        """The edges of one split, ``rows`` at a time (int64 [<= rows, 3] each)."""
        data = self._file[name]
        for start in range(0, data.shape[0], rows):
            with _damage_reported(self.path):
                block = data[start:start + rows]
            yield block

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
        starts, ends = self._bucket_rows(pairs)
        parts: list[np.ndarray] = []
        for first, last in self._reads(starts, ends):
            with _damage_reported(self.path):
                block = self._file["train"][starts[first]:ends[last]]
            parts.extend(block[starts[k] - starts[first]:ends[k] - starts[first]] for k in range(first, last + 1))
        return parts

    def count(self, pairs) -> int:
        """Train edges of the buckets in ``pairs``."""
        starts, ends = self._bucket_rows(pairs)
        return int((ends - starts).sum())

    def read_buckets(self, pairs, out: np.ndarray | None = None) -> np.ndarray:
        """The train edges of the buckets in ``pairs`` joined in file order (``buckets``' parts, concatenated):
        into the first rows of ``out`` where it has room (a staging array reused state after state: no fresh
        pages to fault in, and pinned it copies to a GPU at full speed), else into a new array."""
        starts, ends = self._bucket_rows(pairs)
        total = int((ends - starts).sum())
        joined = out[:total] if out is not None and len(out) >= total else np.empty((total, 3), dtype=np.int64)
        with _damage_reported(self.path):
            return self._read_joined(starts, ends, joined)

    def _read_joined(self, starts: np.ndarray, ends: np.ndarray, joined: np.ndarray) -> np.ndarray:
        train, row = self._file["train"], 0
        for first, last in self._reads(starts, ends):
            if np.array_equal(starts[first + 1:last + 1], ends[first:last]):  # adjacent buckets: read straight in
                rows = int(ends[last] - starts[first])
                if rows:
                    train.read_direct(joined, np.s_[starts[first]:ends[last]], np.s_[row:row + rows])
                row += rows
                continue
            block = train[starts[first]:ends[last]]
            for k in range(first, last + 1):
                rows = int(ends[k] - starts[k])
                joined[row:row + rows] = block[starts[k] - starts[first]:ends[k] - starts[first]]
                row += rows
        return joined

    def _bucket_rows(self, pairs) -> tuple[np.ndarray, np.ndarray]:
        """(first row, end row) of each bucket in ``pairs``, in file order."""
        p = self.num_partitions
        keys = np.sort(np.fromiter((i * p + j for i, j in pairs), dtype=np.int64))
        return self._offsets[keys], self._offsets[keys + 1]

    @staticmethod
    def _reads(starts: np.ndarray, ends: np.ndarray):
        """(first, last) bucket of each read: buckets less than a chunk apart join one."""
        first = 0
        for last in range(len(starts)):
            if last + 1 < len(starts) and starts[last + 1] - ends[last] < _CHUNK_ROWS:
                continue  # the next bucket joins this read
            yield first, last
            first = last + 1

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
        self._file = create_hdf5(self.path)  # (a full disk: an error where it happens, not a crash)
        for name in SPLITS:
            self._file.create_dataset(name, shape=(0, 3), maxshape=(None, 3), dtype="int64",
                                      chunks=(_CHUNK_ROWS, 3), fletcher32=True)  # (a damaged chunk: a read error)
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
        close_hdf5(self._file, self.path)
        with open(self.path, "rb") as handle:
            os.fsync(handle.fileno())
