"""Checksums of every file of a committed directory (a checkpoint version), and their verification.

A version's ``MANIFEST.json`` maps each file's path (relative, '/'-separated)
to its size and digest: CRC-32 of each 8 MiB block (the standard library's
``zlib.crc32``: ~5.6 GiB/s a core on the development machine, and it releases
the GIL, so blocks hash in parallel on a pool of threads while training runs;
google-crc32c's hardware CRC32C is twice as fast but holds the GIL for
arrays), then BLAKE2b of the blocks' CRCs in order (``crc32_blocks``). A
checksum guards against torn writes and bit rot, not against an adversary: per
8 MiB block a CRC-32 misses a random corruption once in 2^32. Manifests
written before keep their ``blake2b_blocks`` (BLAKE2b of each block: ~1.3 GiB/s
a core, slower than the disks that write a Freebase86m-sized store) or
whole-file ``blake2b`` and are verified with them. It is written before the
version is fsynced and renamed into place, so a committed version always
carries it. Files a version shares with the previous one by hard link
(partitions training did not touch) have the same inode: their digest is taken
from the previous manifest instead of being read again. The previous version's
links keep those inodes alive, so an inode number cannot have been reused.
Files the store writes from memory (``ChunkFiles.write`` and
``write_generated``) are hashed as they are written and remembered
(``remember``): a commit then reads nothing back.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import threading
import zlib
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np

MANIFEST_FILE = "MANIFEST.json"
WHOLE_FILE_KEY = "blake2b"  # one BLAKE2b over the whole file (the first manifests)


def _blake2b():
    return hashlib.blake2b(digest_size=16)


class _Crc32:
    """``zlib.crc32`` with a hasher's update() and digest() (4 bytes, big-endian)."""

    def __init__(self):
        self._value = 0

    def update(self, data) -> None:
        self._value = zlib.crc32(data, self._value)

    def digest(self) -> bytes:
        return self._value.to_bytes(4, "big")


# Each block digest's key -> a new hasher of one block (with update() and digest()).
BLOCK_HASHERS = {"crc32_blocks": _Crc32, "blake2b_blocks": _blake2b}
DIGEST_KEY = "crc32_blocks"
DIGEST_KEYS = (*BLOCK_HASHERS, WHOLE_FILE_KEY)
BLOCK_BYTES = 8 << 20  # (small enough that one partition's write is hashed on many threads)
_READ_BYTES = 1 << 22


def file_digest(path: Path, key: str = DIGEST_KEY) -> str:
    """The digest of a file for a manifest entry's ``key``."""
    if key == WHOLE_FILE_KEY:
        return _range_digest(path, 0, None, _blake2b()).hexdigest()
    offsets = range(0, max(os.path.getsize(path), 1), BLOCK_BYTES)
    blocks = _pool().map(lambda offset: _range_digest(path, offset, BLOCK_BYTES, BLOCK_HASHERS[key]()).digest(),
                         offsets)
    return _blake2b_of(blocks)


def _range_digest(path: Path, offset: int, length: int | None, hasher):
    """``hasher`` updated with ``length`` bytes of ``path`` from ``offset`` (None: to the end)."""
    with open(path, "rb") as handle:
        handle.seek(offset)
        left = length
        while left is None or left > 0:
            block = handle.read(_READ_BYTES if left is None else min(_READ_BYTES, left))
            if not block:
                break
            hasher.update(block)
            left = None if left is None else left - len(block)
    return hasher


def _blake2b_of(block_digests) -> str:
    return hashlib.blake2b(b"".join(block_digests), digest_size=16).hexdigest()


def _block_digests(view: memoryview) -> list[Future]:
    """The blocks' digests, queued on the pool from the calling thread (a pool thread never waits on the
    pool: with every thread waiting for blocks queued behind it, none would run)."""
    data = np.frombuffer(view, dtype=np.uint8)
    return [_pool().submit(_block_digest, data[start:start + BLOCK_BYTES])
            for start in range(0, max(len(data), 1), BLOCK_BYTES)]


def _block_digest(block: np.ndarray) -> bytes:
    hasher = BLOCK_HASHERS[DIGEST_KEY]()
    hasher.update(block)
    return hasher.digest()


def _combined(blocks: list[Future]) -> str:
    return _blake2b_of(block.result() for block in blocks)


class StreamDigest:
    """``file_digest`` of a file written front to back in pieces of any size, hashed as they pass
    (``update``): for writes that stream a table through a small staging buffer."""

    def __init__(self):
        self._blocks: list[bytes] = []
        self._hasher, self._left = BLOCK_HASHERS[DIGEST_KEY](), BLOCK_BYTES

    def update(self, data) -> None:
        piece = np.frombuffer(memoryview(data).cast("B"), dtype=np.uint8)
        while len(piece):
            taken = piece[:self._left]
            self._hasher.update(taken)
            piece, self._left = piece[len(taken):], self._left - len(taken)
            if not self._left:
                self._blocks.append(self._hasher.digest())
                self._hasher, self._left = BLOCK_HASHERS[DIGEST_KEY](), BLOCK_BYTES

    def hexdigest(self) -> str:
        last = [self._hasher.digest()] if self._left < BLOCK_BYTES or not self._blocks else []
        return _blake2b_of(self._blocks + last)


def remember(path: Path, digest: str) -> None:
    """``digest`` is that of ``path`` as it is now (just written from memory): ``write_manifest`` takes it
    instead of reading the file back, unless the file changed since (its inode, size or mtime)."""
    stat = os.stat(path)
    with _written_lock:
        _written[(stat.st_dev, stat.st_ino)] = (stat.st_size, stat.st_mtime_ns, digest)


def digest_while_writing(data, path: Path, write: Callable[[], object]):
    """Run ``write()``, which writes exactly ``data`` to ``path``, while ``data`` is hashed on the pool; then
    remember the digest for ``write_manifest`` (by the file's inode, size and modification time: any later
    write changes them), so a commit need not read the file back."""
    forget(path)  # (a failed write leaves nothing remembered for the file)
    blocks = _block_digests(memoryview(data).cast("B"))
    result = write()
    remember(path, _combined(blocks))
    return result


def forget(path: Path) -> None:
    try:
        stat = os.stat(path)
    except OSError:
        return
    with _written_lock:
        _written.pop((stat.st_dev, stat.st_ino), None)


def _remembered(stat: os.stat_result) -> str | None:
    with _written_lock:
        size, mtime, digest = _written.get((stat.st_dev, stat.st_ino), (None, None, None))
    return digest if (size, mtime) == (stat.st_size, stat.st_mtime_ns) else None


_written: dict[tuple[int, int], tuple[int, int, str]] = {}  # (device, inode) -> (size, mtime_ns, digest)
_written_lock = threading.Lock()


@functools.cache
def _pool() -> ThreadPoolExecutor:
    """Threads that hash blocks (zlib.crc32 and hashlib release the GIL on large updates)."""
    return ThreadPoolExecutor(min(32, os.cpu_count() or 1), thread_name_prefix="marius-digest")


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and p.name != MANIFEST_FILE)


def write_manifest(root: Path, previous: Path | None = None) -> None:
    """Write ``root/MANIFEST.json`` for every file below ``root``, reusing ``previous``'s digests of files
    that are hard links of the same inode."""
    known = {}
    entries = _entries(previous / MANIFEST_FILE) if previous is not None else None
    for relative, entry in (entries or {}).items():  # (an unreadable previous manifest: every file is read)
        try:
            stat = (previous / relative).stat()
        except OSError:
            continue
        known[(stat.st_dev, stat.st_ino, stat.st_size)] = _digest_entry(entry)
    files = {}
    for path in _files(root):
        stat = path.stat()
        key, digest = known.get((stat.st_dev, stat.st_ino, stat.st_size)) or \
            (DIGEST_KEY, _remembered(stat) or file_digest(path))
        files[path.relative_to(root).as_posix()] = {"bytes": stat.st_size, key: digest}
    (root / MANIFEST_FILE).write_text(json.dumps({"files": files}, indent=1) + "\n", encoding="utf-8")


def verify_manifest(root: Path) -> list[str]:
    """Problems of ``root`` against its manifest, one line each (empty: intact). A directory without a
    manifest (written before manifests existed) reports that it cannot be checked."""
    path = root / MANIFEST_FILE
    if not path.exists():
        return [f"{root}: no {MANIFEST_FILE} (written before checksums existed): not checked"]
    files = _entries(path)
    if files is None:
        return [f"{path}: unreadable manifest (not the JSON that a commit writes)"]
    problems = []
    for relative, entry in files.items():
        file = root / relative
        if not file.is_file():
            problems.append(f"{file}: missing")
        elif file.stat().st_size != entry["bytes"]:
            problems.append(f"{file}: {file.stat().st_size} bytes, the manifest says {entry['bytes']}")
        elif file_digest(file, _digest_entry(entry)[0]) != _digest_entry(entry)[1]:
            problems.append(f"{file}: checksum mismatch (the file changed after it was committed)")
    listed = set(files)
    problems += [f"{p}: not in the manifest" for p in _files(root) if p.relative_to(root).as_posix() not in listed]
    return problems


def _entries(path: Path) -> dict | None:
    """A manifest's ``files``: {relative path: {"bytes": int, KEY: digest}}; None when the file is missing,
    unreadable or of another shape (entries with a path leaving the directory included)."""
    try:
        files = json.loads(path.read_text(encoding="utf-8"))["files"]
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError):
        return None
    if not isinstance(files, dict):
        return None
    for relative, entry in files.items():
        if (not isinstance(entry, dict) or not isinstance(entry.get("bytes"), int)
                or _digest_entry(entry) is None or relative.startswith("/")
                or ".." in relative.split("/")):
            return None
    return files


def _digest_entry(entry: dict) -> tuple[str, str] | None:
    """(key, digest) of a manifest entry: its block digest, or the whole-file one of older manifests."""
    key = next((key for key in DIGEST_KEYS if isinstance(entry.get(key), str)), None)
    return None if key is None else (key, entry[key])


def has_manifest(root: Path) -> bool:
    return os.path.exists(root / MANIFEST_FILE)
