"""Durable writes: fsync files and directories, replace files atomically.

Used wherever a crash must leave either the old complete file or the new one:
checkpoint pointers, dataset metadata, checkpoint versions, exports.
"""

from __future__ import annotations

import os
import shutil
import socket
import time
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


STAGING_KINDS = ("tmp", "old")  # hidden siblings of an output: .NAME.tmp-HOST-PID (built), .NAME.old-HOST-PID
FOREIGN_STAGING_AGE = 7 * 86400  # seconds untouched after which another host's staging is abandoned


def staging_for(output: Path) -> Path:
    """The hidden sibling a directory is built in (``staged_directory``), not yet made. Stale ones are removed
    first: this process's own, and those of runs killed before they could clean up (``remove_abandoned_staging``)."""
    remove_abandoned_staging(output)
    staging = staging_path(output, "tmp")
    shutil.rmtree(staging, ignore_errors=True)
    return staging


def staging_path(output_dir: Path, kind: str) -> Path:
    """This process's hidden sibling of ``output_dir``: ``.NAME.KIND-HOST-PID`` (kind tmp or old)."""
    return output_dir.parent / f".{output_dir.name}.{kind}-{socket.gethostname()}-{os.getpid()}"


def remove_abandoned_staging(output_dir: Path) -> None:
    """Remove the staging (and replaced ``old``) directories of ``output_dir`` left by killed runs: those of
    this host whose process is gone (or of the older ``.NAME.tmp-PID`` form), and another host's once
    untouched for ``FOREIGN_STAGING_AGE`` (its process cannot be asked). Nothing else is touched."""
    host = socket.gethostname()
    prefixes = tuple(f".{output_dir.name}.{kind}-" for kind in STAGING_KINDS)
    try:
        entries = list(output_dir.parent.iterdir())
    except OSError:  # no parent folder yet (or a file in its place): nothing can have been left there
        return
    for entry in entries:
        prefix = next((p for p in prefixes if entry.name.startswith(p)), None)
        if prefix is None:
            continue
        owner, _, pid = entry.name[len(prefix):].rpartition("-")  # HOST-PID, or PID (older runs)
        if not pid.isdigit() or int(pid) == os.getpid() or entry.is_symlink() or not entry.is_dir():
            continue
        abandoned = (not _process_alive(int(pid)) if owner in ("", host)
                     else time.time() - _newest_mtime(entry) > FOREIGN_STAGING_AGE)
        if abandoned:
            shutil.rmtree(entry, ignore_errors=True)


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: alive, another user's
        return True
    return True


def _newest_mtime(directory: Path) -> float:
    try:
        return max([directory.stat().st_mtime] + [child.stat().st_mtime for child in directory.iterdir()])
    except OSError:
        return time.time()  # unreadable or vanishing: treat as in use


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
