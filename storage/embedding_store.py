"""Node embeddings and their optimizer state as zarr arrays on local disk.

A store is a directory holding two uncompressed zarr arrays, ``embeddings``
[n, d] and ``state`` [n, s], chunked so that one node partition is exactly one
chunk: a partition is read and written whole, each one file of raw rows (all
of them, zeros too). A chunk never written reads as zarr's fill value, zero:
a new store's optimizer state, and a new in-memory run's tables until its
first commit writes them. Any zarr tool can open the store. Values are
float32, or bfloat16 (``storage.dtype``): zarr has
no bfloat16, so those arrays are uint16 holding the bits, marked by the
``element_type`` attribute.
"""

from __future__ import annotations

import os
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch
import zarr

from marius_py.storage.chunk_files import (ELEMENT_TYPE_ATTRIBUTE, PAGE, ChunkFiles, page_aligned_empty, raw_bytes,
                                          stored_dtype)
from marius_py.storage.partitioning import partition_bounds, partition_size

EMBEDDINGS = "embeddings"
STATE = "state"
INIT_PIECE_ROWS = 65_536  # rows drawn and written at once per thread when a store is created
# Staging pieces of a commit's writes: with their alignment page, each fits 32 MiB of torch's cached pinned
# allocator (under pinned.REGISTER_MIN_BYTES: no registration per piece; its power-of-two rounding wastes nothing).
WRITE_PIECE_BYTES = (32 << 20) - PAGE
_ZARR_V3 = int(zarr.__version__.split(".")[0]) >= 3


def _create_array(path: Path, shape: tuple[int, int], chunk_rows: int, dtype: torch.dtype) -> zarr.Array:
    chunks = (chunk_rows, shape[1])
    bits = dtype == torch.bfloat16
    zarr_dtype, attributes = ("uint16", {ELEMENT_TYPE_ATTRIBUTE: "bfloat16"}) if bits else ("float32", {})
    if _ZARR_V3:
        return zarr.create_array(store=str(path), shape=shape, chunks=chunks, dtype=zarr_dtype,
                                 compressors=None, fill_value=0, overwrite=True, attributes=attributes,
                                 config={"write_empty_chunks": True})
    array = zarr.open_array(str(path), mode="w", shape=shape, chunks=chunks, dtype=zarr_dtype,
                            compressor=None, fill_value=0, write_empty_chunks=True)
    array.attrs.update(attributes)
    return array


class EmbeddingStore:
    """Partition-granular access to ``embeddings`` and ``state``."""

    def __init__(self, path: str | os.PathLike, mode: str = "r+"):
        self.path = Path(path)
        self.embeddings = zarr.open_array(str(self.path / EMBEDDINGS), mode=mode)
        self.state = zarr.open_array(str(self.path / STATE), mode=mode)
        self.dtype = stored_dtype(str(self.embeddings.dtype), dict(self.embeddings.attrs))
        if self.dtype is None or stored_dtype(str(self.state.dtype), dict(self.state.attrs)) != self.dtype:
            raise ValueError(f"{self.path}: expected float32 or bfloat16 embeddings and state alike, got "
                             f"{self.embeddings.dtype} and {self.state.dtype}")
        self.num_nodes, self.dim = self.embeddings.shape
        self.state_dim = self.state.shape[1]
        chunk_rows = self.embeddings.chunks[0]
        self.num_partitions = max(1, -(-self.num_nodes // chunk_rows))

    @classmethod
    def create(cls, path: str | os.PathLike, num_nodes: int, dim: int, state_dim: int,
               num_partitions: int, init: Callable[[int, int], np.ndarray] | None = None, threads: int = 1,
               dtype: torch.dtype = torch.float32, partitions: Sequence[int] | None = None) -> "EmbeddingStore":
        """Create a store of ``dtype`` values; ``init(start, end)`` gives the initial rows (float32) of each
        partition (of ``partitions`` only, when given: a trainer of a group initialises those its store holds;
        the rows do not depend on which process draws them).

        Rows are written a partition at a time per thread, so memory stays at ``threads`` partitions.
        """
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        rows = partition_size(num_nodes, num_partitions)
        _create_array(path / EMBEDDINGS, (num_nodes, dim), rows, dtype)
        _create_array(path / STATE, (num_nodes, state_dim), rows, dtype)
        store = cls(path)
        if init is not None:
            store._initialise(init, threads, range(store.num_partitions) if partitions is None else partitions)
        return store

    def _initialise(self, init: Callable[[int, int], np.ndarray], threads: int, partitions: Sequence[int]) -> None:
        """Write ``init``'s rows as raw chunk files (zarr's array writes ran at ~0.1 GiB/s), ``threads``
        partitions at once (torch's generators and file writes release the GIL), each drawn and written
        in pieces of ``INIT_PIECE_ROWS``: memory is two pieces a thread, whatever the partitions' size.
        Optimizer state stays zarr's fill value, 0: its chunk files are never written."""
        files = self.chunk_files()[0]

        def write(part: int) -> None:
            start, end = self.bounds(part)
            if end > start:  # a partition past the last node stays zarr's fill value
                files.write_generated(part, lambda first, last: init(start + first, start + last), INIT_PIECE_ROWS)

        with ThreadPoolExecutor(max(1, threads)) as pool:
            list(pool.map(write, partitions))

    @property
    def rows_per_partition(self) -> int:
        return self.embeddings.chunks[0]

    def chunk_files(self, direct: bool = True) -> tuple[ChunkFiles, ChunkFiles]:
        """Whole-partition IO on the embedding and state arrays (the training hot path); ``direct``: bypassing
        the page cache."""
        return ChunkFiles(self.path / EMBEDDINGS, direct), ChunkFiles(self.path / STATE, direct)

    def bounds(self, partition: int) -> tuple[int, int]:
        return partition_bounds(self.num_nodes, self.num_partitions, partition)

    def write_partition(self, partition: int, embeddings: np.ndarray | torch.Tensor,
                        state: np.ndarray | torch.Tensor) -> None:
        """Replace one partition whole (arrays, or tensors on any device; rows of another dtype are converted
        to the store's), for a commit: streamed to its files through small staging pieces
        (``ChunkFiles.write_generated``: no copy of the partition is made), hashed as they pass."""
        for files, rows in zip(self.chunk_files(), (embeddings, state)):
            files.write_generated(partition, lambda first, last, rows=rows: rows[first:last],
                                  WRITE_PIECE_BYTES // (files.cols * files.itemsize), for_commit=True,
                                  pin=isinstance(rows, torch.Tensor) and rows.is_cuda)

    def _tensor(self, values: np.ndarray) -> torch.Tensor:
        """Values read through zarr as a tensor of the store's dtype."""
        if self.dtype == torch.bfloat16:
            return torch.from_numpy(values.view(np.int16)).view(torch.bfloat16)
        return torch.from_numpy(values)

    def read_tables(self, pin_memory: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """Both tables whole, in the store's dtype (page-locked with ``pin_memory``): every partition's chunk
        file read straight into one allocation, with O_DIRECT where the chunk starts on a page (zarr's slicing
        reads at about half the disk's speed, and pinning its result copied the tables once more)."""
        return tuple(self._read_table(files, pin_memory) for files in self.chunk_files())

    def _read_table(self, files: ChunkFiles, pin_memory: bool) -> torch.Tensor:
        rows = files.rows_per_chunk
        table = page_aligned_empty(files.num_chunks * rows + _page_rows(files), files.cols, pin_memory, self.dtype)
        for chunk in range(files.num_chunks):
            files.read_into(chunk, raw_bytes(table[chunk * rows:]))
        nodes = table[:self.num_nodes]
        nodes._locked_base = table._locked_base  # (the page lock lives as long as its base tensor)
        return nodes

    def read_all(self) -> tuple[np.ndarray, np.ndarray]:
        """Both tables whole, as float32 arrays."""
        return tuple(table.float().numpy() for table in self.read_tables())

    def embedding_rows(self, start: int, end: int) -> torch.Tensor:
        """Embeddings of nodes ``[start, end)`` as float32."""
        return self._tensor(self.embeddings[start:end]).float()

    def write_all(self, embeddings: np.ndarray | torch.Tensor, state: np.ndarray | torch.Tensor) -> None:
        for part in range(self.num_partitions):
            start, end = self.bounds(part)
            self.write_partition(part, embeddings[start:end], state[start:end])


def initial_tables(num_nodes: int, dim: int, state_dim: int, init: Callable[[int, int], np.ndarray],
                   threads: int = 1, pin_memory: bool = False, dtype: torch.dtype = torch.float32,
                   device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """The tables ``EmbeddingStore.create(..., init)`` would store and ``read_tables`` read back, built in
    memory (``device``'s: a GPU's tables never pass through a host copy of them): ``init``'s rows (drawn
    ``INIT_PIECE_ROWS`` at a time on ``threads`` threads, rounded to ``dtype`` alike) and zero optimizer
    state. A run holding its tables in memory starts without writing them and reading them back: its first
    commit writes them."""
    if torch.device(device).type == "cpu":
        nodes = page_aligned_empty(num_nodes, dim, pin_memory, dtype)
        state = page_aligned_empty(num_nodes, state_dim, pin_memory, dtype)
    else:
        nodes = torch.empty(num_nodes, dim, dtype=dtype, device=device)
        state = torch.empty(num_nodes, state_dim, dtype=dtype, device=device)

    def fill(first: int) -> None:
        last = min(first + INIT_PIECE_ROWS, num_nodes)
        nodes[first:last] = torch.from_numpy(init(first, last))
        state[first:last] = 0

    with ThreadPoolExecutor(max(1, threads)) as pool:
        list(pool.map(fill, range(0, num_nodes, INIT_PIECE_ROWS)))
    return nodes, state


def _page_rows(files: ChunkFiles) -> int:
    """Rows that cover a page: room after a chunk for O_DIRECT's whole pages."""
    return -(-PAGE // (files.cols * files.itemsize))


def link_tree(source: str | os.PathLike, destination: str | os.PathLike,
              partitions: Sequence[int] | None = None) -> None:
    """Mirror ``source`` into a new ``destination`` with hard links (copies where links fail); ``partitions``:
    of a store, only those partitions' chunk files (the others read as zarr's fill value there).

    A linked chunk file is only ever replaced by rename, never rewritten in place
    (``ChunkFiles.write`` overwrites only files with one link), so a linked
    snapshot keeps the bytes it was taken with.
    """
    source, destination = Path(source), Path(destination)
    left_out = set() if partitions is None else {
        files.chunk_path(chunk) for files in EmbeddingStore(source).chunk_files()
        for chunk in sorted(set(range(files.num_chunks)) - set(partitions))}
    for root, _, files in os.walk(source):
        target = destination / Path(root).relative_to(source)
        target.mkdir(parents=True, exist_ok=True)
        for name in files:
            if name.endswith(".tmp") or Path(root) / name in left_out:
                continue
            try:
                os.link(Path(root) / name, target / name)
            except OSError:
                shutil.copy2(Path(root) / name, target / name)
