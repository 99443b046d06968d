"""Whole-chunk file IO on an uncompressed, row-chunked zarr array.

An uncompressed zarr chunk file (v3 ``bytes`` codec little-endian, or v2 with
no compressor) holds exactly the raw rows of its chunk, always full size (an
edge chunk is padded). Reading or writing that file directly into a
preallocated (pinned) buffer runs at disk speed, about twice the zarr API's,
while the store stays a valid zarr array that any zarr tool opens.

Writes go to a temporary file renamed over the chunk: a partition is replaced
whole and atomically, and a hard link to the old file (a checkpoint snapshot)
keeps the old bytes.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import numpy as np


class ChunkFiles:
    """Direct access to chunk ``i`` (rows ``[i * rows, (i + 1) * rows)``) of a 2-D float32 array."""

    def __init__(self, array_path: str | os.PathLike):
        self.path = Path(array_path)
        shape, chunks, self._key = _read_layout(self.path)
        self.num_rows, self.cols = shape
        self.rows_per_chunk = chunks[0]
        self.chunk_bytes = self.rows_per_chunk * self.cols * 4
        self.num_chunks = max(1, -(-self.num_rows // self.rows_per_chunk))

    def chunk_path(self, chunk: int) -> Path:
        return self.path / self._key(chunk)

    def read_into(self, chunk: int, out: np.ndarray) -> int:
        """Fill ``out`` (float32, ``rows_per_chunk x cols``, C-contiguous) with chunk ``chunk``."""
        view = memoryview(_checked(out, self.chunk_bytes)).cast("B")
        try:
            with open(self.chunk_path(chunk), "rb", buffering=0) as handle:
                filled = 0
                while filled < self.chunk_bytes:
                    count = handle.readinto(view[filled:])
                    if not count:
                        raise OSError(f"{self.chunk_path(chunk)}: chunk file is truncated "
                                      f"({filled} of {self.chunk_bytes} bytes)")
                    filled += count
        except FileNotFoundError:  # never written: zarr's fill value
            out.fill(0.0)
        return self.chunk_bytes

    def write(self, chunk: int, data: np.ndarray) -> int:
        """Replace chunk ``chunk`` atomically with ``data`` (``rows_per_chunk x cols`` float32)."""
        view = memoryview(_checked(data, self.chunk_bytes)).cast("B")
        target = self.chunk_path(chunk)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        try:
            with open(tmp, "wb", buffering=0) as handle:
                written = 0
                while written < self.chunk_bytes:
                    written += handle.write(view[written:])
            os.replace(tmp, target)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        return self.chunk_bytes


def _checked(array: np.ndarray, nbytes: int) -> np.ndarray:
    if array.dtype != np.float32 or not array.flags.c_contiguous or array.nbytes != nbytes:
        raise ValueError(f"need a C-contiguous float32 buffer of {nbytes} bytes, got "
                         f"{array.dtype} {array.shape} contiguous={array.flags.c_contiguous}")
    return array


def _read_layout(path: Path):
    """(shape, chunks, chunk key function) of a v3 or v2 uncompressed float32 array."""
    if (path / "zarr.json").exists():
        meta = json.loads((path / "zarr.json").read_text())
        codecs = meta.get("codecs", [])
        plain = (meta.get("data_type") == "float32" and len(codecs) == 1 and codecs[0]["name"] == "bytes"
                 and codecs[0].get("configuration", {}).get("endian", "little") == "little")
        encoding = meta.get("chunk_key_encoding", {})
        separator = encoding.get("configuration", {}).get("separator", "/")
        if encoding.get("name", "default") == "default":
            key = lambda i: f"c{separator}{i}{separator}0"  # noqa: E731
        else:  # "v2" key encoding
            key = lambda i: f"{i}{separator}0"  # noqa: E731
        chunks = meta["chunk_grid"]["configuration"]["chunk_shape"]
    else:
        meta = json.loads((path / ".zarray").read_text())
        plain = (meta.get("dtype") == "<f4" and meta.get("compressor") is None and not meta.get("filters")
                 and meta.get("order", "C") == "C")
        separator = meta.get("dimension_separator", ".")
        key = lambda i: f"{i}{separator}0"  # noqa: E731
        chunks = meta["chunks"]
    shape = meta["shape"]
    if not plain or len(shape) != 2 or chunks[1] != shape[1]:
        raise ValueError(f"{path}: not an uncompressed little-endian float32 array chunked by rows")
    return tuple(shape), tuple(chunks), key
