"""A dataset's identity: digests of what defines its data, so that a run, a cache entry or a torchrun group
knows its dataset by content rather than by path or counts.

The identity (``DatasetMetadata.identity``) holds, as hex strings:
  ``nodes``, ``relations``          SHA-256 of ``nodes.txt`` / ``relations.txt``: the names in id order
  ``node_set``, ``relation_set``    an order-free digest of the same names (tells renumbering from editing)
  ``train``, ``valid``, ``test``    an order-free digest of each split's id triples (a re-bucketed copy, whose
                                    train edges are in another order, keeps it)
A generated dataset (``bench/freebase_shape.py``) may instead carry ``generated``: a digest of the generator
and its settings, which define its content.

Order-free digests add a 64-bit mix of each item, modulo 2^64, in two independently seeded lanes (128 bits):
streamed in chunks, vectorised for edges, and equal for the same multiset in any order. They detect changes,
not adversaries.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Iterable

import numpy as np

NAME_KEYS = {"nodes": "nodes.txt", "relations": "relations.txt"}
EDGE_KEYS = ("train", "valid", "test")
_READ_BYTES = 1 << 24
_EDGE_ROWS = 1 << 20
_LANE_SEEDS = (np.uint64(0x9E3779B97F4A7C15), np.uint64(0xD1B54A32D192ED03))
_MIX = (np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB))


def file_digest(path: Path) -> tuple[int, str]:
    """(lines, SHA-256) of a names file, read in blocks (memory bounded whatever its size)."""
    digest, lines = hashlib.sha256(), 0
    with open(path, "rb") as handle:
        while block := handle.read(_READ_BYTES):
            digest.update(block)
            lines += block.count(b"\n")
    return lines, digest.hexdigest()


def _mix64(values: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser, elementwise on uint64 (wrapping arithmetic), in place."""
    values ^= values >> np.uint64(30)
    values *= _MIX[0]
    values ^= values >> np.uint64(27)
    values *= _MIX[1]
    values ^= values >> np.uint64(31)
    return values


class OrderFreeDigest:
    """A digest of a multiset: the sum of each item's 64-bit mix, per lane, modulo 2^64."""

    def __init__(self):
        self._sums = [0, 0]

    def add_rows(self, rows: np.ndarray) -> None:
        """Add the rows of an integer array [n, k] (each row one item)."""
        rows = np.ascontiguousarray(rows).astype(np.uint64, copy=False)
        with np.errstate(over="ignore"):
            for lane, seed in enumerate(_LANE_SEEDS):
                mixed = np.full(len(rows), seed, dtype=np.uint64)
                for column in range(rows.shape[1]):
                    mixed ^= rows[:, column]
                    _mix64(mixed)
                self._sums[lane] = (self._sums[lane] + int(mixed.sum(dtype=np.uint64))) % 2**64

    def add_names(self, names: Iterable[str]) -> None:
        """Add names (each through BLAKE2b, 16 bytes: the two lanes)."""
        low = high = 0
        for name in names:
            value = int.from_bytes(hashlib.blake2b(name.encode("utf-8"), digest_size=16).digest(), "little")
            low += value & 0xFFFFFFFFFFFFFFFF
            high += value >> 64
        self._sums = [(self._sums[0] + low) % 2**64, (self._sums[1] + high) % 2**64]

    def hexdigest(self) -> str:
        return "".join(f"{value:016x}" for value in self._sums)


def names_in_file(path: Path) -> Iterable[str]:
    """The names of a names file, line by line (the file's own newlines, as ``read_names`` splits)."""
    with open(path, encoding="utf-8", newline="\n") as handle:
        for line in handle:
            yield line[:-1] if line.endswith("\n") else line


def compute_identity(directory: Path, edges) -> dict[str, str]:
    """The identity of the dataset in ``directory`` from its files; ``edges``: its open ``EdgeStore``."""
    identity = {}
    for key, file_name in NAME_KEYS.items():
        identity[key] = file_digest(directory / file_name)[1]
        names = OrderFreeDigest()
        names.add_names(names_in_file(directory / file_name))
        identity[f"{key[:-1]}_set"] = names.hexdigest()
    for split in EDGE_KEYS:
        digest = OrderFreeDigest()
        for chunk in edges.chunks(split, _EDGE_ROWS):
            digest.add_rows(chunk)
        identity[split] = digest.hexdigest()
    return identity


def describe_change(recorded: dict[str, str], current: dict[str, str]) -> str | None:
    """What differs between the identity a run recorded and the dataset's now, in words (None: the same)."""
    if recorded == current:
        return None
    if "generated" in recorded or "generated" in current:
        return "it was generated with other settings"
    renumbered = [key for key in NAME_KEYS if recorded.get(key) != current.get(key)
                  and recorded.get(f"{key[:-1]}_set") == current.get(f"{key[:-1]}_set")]
    renamed = [key[:-1] for key in NAME_KEYS if recorded.get(key) != current.get(key) and key not in renumbered]
    changes = []
    if renumbered:
        changes.append(f"its {' and '.join(renumbered)} are numbered differently (the same names: it was "
                       "preprocessed again, from input in another line order or with another seed)")
    if renamed:
        changes.append(f"its {' and '.join(renamed)} names changed")
    if not changes:
        edited = [split for split in EDGE_KEYS if recorded.get(split) != current.get(split)]
        changes.append(f"its {' and '.join(edited)} edges changed" if edited else "its identity differs")
    return "; ".join(changes)
