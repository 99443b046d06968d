"""Durable writes: fsync files and directories, replace files atomically.

Used wherever a crash must leave either the old complete file or the new one:
checkpoint pointers, dataset metadata, checkpoint versions, exports.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def fsync_directory(path: str | os.PathLike) -> None:
    """Persist a directory's entries (renames and new files inside it)."""
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def fsync_tree(root: str | os.PathLike) -> None:
    """fsync every file below ``root``, then every directory, deepest first."""
    for directory, _, files in os.walk(root, topdown=False):
        for name in files:
            with open(os.path.join(directory, name), "rb") as handle:
                os.fsync(handle.fileno())
        fsync_directory(directory)


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` to a temporary sibling, fsync it, rename it over ``path``, fsync the directory."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
    fsync_directory(path.parent)


def staging_for(output: Path) -> Path:
    """The hidden sibling a directory is built in (``staged_directory``); a stale one is removed."""
    staging = output.with_name(f".{output.name}.tmp-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    return staging


@contextmanager
def staged_directory(output: Path, staging: Path) -> Iterator[Path]:
    """Build a directory in ``staging`` (made by the caller); on success it replaces ``output``, on any
    error it is removed, so ``output`` never exists half-written."""
    try:
        yield staging
        if output.exists():
            shutil.rmtree(output)
        os.replace(staging, output)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
