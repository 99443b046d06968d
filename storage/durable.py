"""Durable writes: fsync files and directories, replace files atomically.

Used wherever a crash must leave either the old complete file or the new one:
checkpoint pointers, dataset metadata, checkpoint versions, exports.

Directories are built in hidden siblings named for their process (``.NAME.tmp-HOST-PID``) and renamed
into place; a replaced one waits in ``.NAME.old-HOST-PID`` until the new one is there. A run killed
midway leaves these behind: the next one to the same output removes those whose process is gone, and
puts a complete ``old`` one back when the output itself is missing (``remove_abandoned_staging``).
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import tempfile
import socket
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import BinaryIO
from contextlib import contextmanager
from pathlib import Path

from marius_py.errors import DiskFullError, MariusInputError
from marius_py.orderings.simulator import format_bytes


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
    """Write ``text`` (UTF-8) as ``write_bytes_atomic`` does."""
    write_bytes_atomic(path, text.encode("utf-8"))


def write_bytes_atomic(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` as ``write_atomic`` does."""
    write_atomic(path, lambda handle: handle.write(data))


def write_atomic(path: str | os.PathLike, fill: Callable[[BinaryIO], object]) -> None:
    """Write a file whole: ``fill(handle)`` writes it into a temporary sibling, which is fsynced and renamed
    over ``path`` (then the directory is fsynced); whatever stops it leaves no part of it behind."""
    path = Path(path)
    # (a name of its own: processes writing the same file at once, as readers upgrading a dataset's metadata
    # do, must not rename each other's half-written files into place)
    descriptor, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    tmp = Path(name)
    try:
        with open(descriptor, "wb") as handle:
            fill(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:  # (a full disk): no half-written sibling left
        tmp.unlink(missing_ok=True)
        raise
    fsync_directory(path.parent)


DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
_HDF5_ERRNO = re.compile(r"\berrno = (\d+)")  # how HDF5 quotes a failed system call in h5py's error texts


def is_disk_full(error: BaseException | None) -> bool:
    """Whether ``error`` (or one it was raised from or while handling) is a full disk or quota: an ``OSError``'s
    errno, SQLite's SQLITE_FULL (a study's database), or the errno HDF5 quotes in the text of the error h5py
    raises for a failed flush or close."""
    while error is not None:
        if isinstance(error, OSError) and error.errno in DISK_FULL_ERRNOS:
            return True
        if getattr(error, "sqlite_errorname", None) == "SQLITE_FULL":
            return True
        if any(int(number) in DISK_FULL_ERRNOS for number in _HDF5_ERRNO.findall(str(error))):
            return True
        error = error.__cause__ or (None if error.__suppress_context__ else error.__context__)
    return False


def free_bytes(directory: str | os.PathLike) -> int:
    """Bytes this user may still write on the file system of ``directory`` (``nearest_existing``)."""
    stat = os.statvfs(nearest_existing(directory))
    return stat.f_bavail * stat.f_frsize


def nearest_existing(directory: str | os.PathLike) -> Path:
    """``directory``, or its nearest parent that exists (an output not made yet, or that a full disk stopped)."""
    directory = Path(directory).absolute()
    while not directory.exists() and directory != directory.parent:
        directory = directory.parent
    return directory


def disk_full_error(what: str, directory: Path, needed: int | None = None) -> DiskFullError:
    """The error for ``what`` (an output, already removed) not fitting in ``directory``: "needs about
    ``needed``" where it is known and more than is free, else "needs more than the free space" (it was
    measured by failing)."""
    directory = nearest_existing(directory)
    free = free_bytes(directory)
    if needed is not None and needed > free:
        amount = f"about {format_bytes(needed)} in {directory}, {format_bytes(free)} is free"
    else:
        amount = f"more than the {format_bytes(free)} free in {directory}"
    return DiskFullError(f"no space left on the device: {what} needs {amount}; nothing half-written was "
                         "left (free space or write elsewhere, then run again)")


FILE_SYSTEM_BLOCK = 4096  # the unit a file takes space in, on the usual file systems


def on_disk(sizes: Iterable[int]) -> int:
    """The space files of these sizes take: whole blocks each."""
    return sum(-(-size // FILE_SYSTEM_BLOCK) * FILE_SYSTEM_BLOCK for size in sizes)


@contextmanager
def reporting_full_disk(what: str, directory: Path, needed: int | None = None) -> Iterator[None]:
    """Around the writing of ``what`` into ``directory``: refuse to start (``DiskFullError``) where its
    ``needed`` bytes, when known, do not fit; and turn a full disk met inside (once the block has removed what
    it half-wrote) into one ``DiskFullError``, whatever raised it (HDF5's errors are no ``OSError``)."""
    if needed is not None and needed > free_bytes(directory):
        raise disk_full_error(what, directory, needed)
    try:
        yield
    except Exception as error:
        if isinstance(error, MariusInputError) or not is_disk_full(error):  # (a message of its own already)
            raise
        raise disk_full_error(what, directory, needed) from None


STAGING_KINDS = ("tmp", "old")  # hidden siblings of an output: .NAME.tmp-HOST-PID (built), .NAME.old-HOST-PID
FOREIGN_STAGING_AGE = 7 * 86400  # seconds untouched after which another host's staging is abandoned
COMPLETE_MARKER = "metadata.json"  # the file a complete dataset has (marius_py.dataset.METADATA_FILE), written last


def staging_for(output: Path, marker: str = COMPLETE_MARKER) -> Path:
    """The hidden sibling a directory is built in (``staged_directory``), not yet made. Stale ones are removed
    first: this process's own, and those of runs killed before they could clean up (``remove_abandoned_staging``;
    a complete earlier output, one holding ``marker``, that such a run had moved aside is put back first)."""
    remove_abandoned_staging(output, marker)
    staging = staging_path(output, "tmp")
    shutil.rmtree(staging, ignore_errors=True)
    return staging


def owned_name(prefix: str) -> str:
    """``PREFIX`` + ``HOST-PID``: a name of this process's, that ``remove_abandoned`` removes once it is gone."""
    return f"{prefix}{socket.gethostname()}-{os.getpid()}"


def staging_path(output_dir: Path, kind: str) -> Path:
    """This process's hidden sibling of ``output_dir``: ``.NAME.KIND-HOST-PID`` (kind tmp or old)."""
    return output_dir.parent / owned_name(f".{output_dir.name}.{kind}-")


def remove_abandoned_staging(output_dir: Path, marker: str = COMPLETE_MARKER) -> None:
    """Remove the staging (and replaced ``old``) directories of ``output_dir`` left by killed runs (see
    ``abandoned``). Nothing else is touched, and while ``output_dir`` is missing an ``old`` one holding
    ``marker`` (the complete earlier output, moved aside by a run killed before it put the new one in place)
    is never removed: ``restore_replaced`` renames it back first."""
    restore_replaced(output_dir, marker)
    output_missing = not os.path.lexists(output_dir)
    old_prefix = f".{output_dir.name}.old-"
    for entry in abandoned(output_dir.parent, [f".{output_dir.name}.{kind}-" for kind in STAGING_KINDS]):
        if output_missing and entry.name.startswith(old_prefix) and _holds(entry, marker):
            continue  # (several: restore_replaced refused to choose; the user picks)
        shutil.rmtree(entry, ignore_errors=True)


def remove_abandoned(directory: Path, prefixes: Sequence[str]) -> None:
    """Remove the directories of ``directory`` named ``PREFIX`` + ``HOST-PID`` whose process is gone
    (``abandoned``)."""
    for entry in abandoned(directory, prefixes):
        shutil.rmtree(entry, ignore_errors=True)


def abandoned(directory: Path, prefixes: Sequence[str]) -> list[Path]:
    """The directories in ``directory`` named ``PREFIX`` + ``HOST-PID`` (``owned_name``) left by killed runs:
    those of this host whose process is gone (or of the older ``PREFIX`` + ``PID`` form), and another host's
    once untouched for ``FOREIGN_STAGING_AGE`` (its process cannot be asked). Never this process's own, a
    link, or a file."""
    host = socket.gethostname()
    try:
        entries = list(Path(directory).iterdir())
    except OSError:  # no folder yet (or a file in its place): nothing can have been left there
        return []
    found = []
    for entry in entries:
        prefix = next((p for p in prefixes if entry.name.startswith(p)), None)
        if prefix is None:
            continue
        owner, _, pid = entry.name[len(prefix):].rpartition("-")  # HOST-PID, or PID (older runs)
        if not pid.isdigit() or int(pid) == os.getpid() or entry.is_symlink() or not entry.is_dir():
            continue
        if (not _process_alive(int(pid)) if owner in ("", host)
                else time.time() - _newest_mtime(entry) > FOREIGN_STAGING_AGE):
            found.append(entry)
    return found


def restore_replaced(output_dir: Path, marker: str = COMPLETE_MARKER) -> Path | None:
    """Undo a replacement cut between its two renames (``replace_directory``): when ``output_dir`` is missing
    and an abandoned ``.NAME.old-HOST-PID`` holds ``marker`` (the complete earlier output), rename it back to
    ``output_dir`` and return where it was. Several such (killed runs of their own) are refused by name, never
    removed: which one is the latest cannot be told."""
    output_dir = Path(output_dir)
    if os.path.lexists(output_dir):
        return None
    candidates = sorted(entry for entry in abandoned(output_dir.parent, [f".{output_dir.name}.old-"])
                        if _holds(entry, marker))
    if not candidates:
        return None
    if len(candidates) > 1:
        raise MariusInputError(f"output is missing and {len(candidates)} runs that were replacing it were killed, "
                               f"each leaving an earlier complete copy: {', '.join(c.name for c in candidates)}",
                               path=output_dir, expected=f"one of them renamed back to {output_dir.name} (the "
                                                         "others can then be deleted), or another output path")
    try:
        os.replace(candidates[0], output_dir)
    except OSError:  # another run made the output meanwhile: it is there, and the old copy stays untouched
        if os.path.lexists(output_dir):
            return None
        raise
    fsync_directory(output_dir.parent)
    return candidates[0]


def replace_directory(staging: Path, output: Path, marker: str = COMPLETE_MARKER) -> None:
    """Rename the complete directory ``staging`` to ``output``. An existing ``output`` is first moved aside to
    ``.NAME.old-HOST-PID`` and removed once the new one is in place (its ``marker`` first, so a partly removed
    copy never looks complete); a kill between the two renames leaves it for ``restore_replaced``."""
    old = None
    if os.path.lexists(output):
        old = staging_path(output, "old")
        discard_replaced(old, marker)  # (a stale one of this pid's)
        os.replace(output, old)
    try:
        os.replace(staging, output)
    except BaseException:  # (an interrupt, or another run's output made meanwhile): the earlier one goes back
        if old is not None and not os.path.lexists(output):
            os.replace(old, output)
        raise
    fsync_directory(output.parent)
    if old is not None:
        discard_replaced(old, marker)


def discard_replaced(old: Path, marker: str = COMPLETE_MARKER) -> None:
    """Remove a replaced output moved aside: its ``marker`` first (and durably), then the rest. A link is
    unlinked, what it points to left alone."""
    if old.is_symlink():
        old.unlink()
        return
    try:
        os.unlink(old / marker)
        fsync_directory(old)
    except OSError:
        pass
    shutil.rmtree(old, ignore_errors=True)


def _holds(directory: Path, marker: str) -> bool:
    try:
        return (directory / marker).is_file()
    except OSError:
        return False


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
def staged_directory(output: Path, staging: Path, marker: str = COMPLETE_MARKER) -> Iterator[Path]:
    """Build a directory in ``staging`` (made by the caller); on success it takes the place of ``output``,
    on any error it is removed, so ``output`` never exists half-written.

    An existing ``output`` is replaced only when it is empty or a complete earlier result (it holds
    ``marker``); it is kept aside until the new one is in place (``replace_directory``). Anything else is
    refused (``MariusInputError``, before and again after the build), never removed."""
    try:
        check_replaceable(output, marker)
        yield staging
        check_replaceable(output, marker)  # again: it may have changed meanwhile
        replace_directory(staging, output, marker)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def check_replaceable(output: Path, marker: str = COMPLETE_MARKER) -> None:
    """Refuse (``MariusInputError``) an existing ``output`` that is neither an empty directory nor a complete
    earlier result (a directory holding ``marker``)."""
    if not os.path.lexists(output):
        return
    if not output.is_dir():
        raise MariusInputError("output path exists and is not a directory", path=output,
                               expected="a new path, an empty directory or an earlier result to replace")
    try:
        empty = not any(output.iterdir())
    except OSError as error:
        raise MariusInputError(f"cannot read the output directory ({error.strerror})", path=output,
                               expected="a directory this user can read and write, or a new path") from None
    if not empty and not _holds(output, marker):
        raise MariusInputError(f"output directory is not empty and holds no {marker}, so it is not an earlier "
                               "result: it is not replaced", path=output,
                               expected="a new path, an empty directory or an earlier result to replace")
