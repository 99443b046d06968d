"""One command at a time in a directory: one training command per run directory (``RUN_DIR/LOCK``), one
export into an output folder (``export.py``), each an exclusive ``flock``.

Two commands training into one run directory at once would interleave commits;
the second is refused with the holder's pid and host instead.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path

from marius_py.errors import MariusInputError

LOCK_FILE = "LOCK"


class DirectoryLock:
    """An exclusive ``flock`` on a file in a directory while one command works there; the file names its
    holder (pid, host, since when) for the refusal a second command gets. A kill releases the lock.

    ``busy(holder)`` and ``unwritable(reason)`` make the errors; with ``remove_on_release`` the file goes
    (while still locked: a command waiting to open it then finds it gone and opens the new one).
    """

    def __init__(self, path: Path, busy: Callable[[str], MariusInputError],
                 unwritable: Callable[[str], MariusInputError], remove_on_release: bool = False):
        self.path = path
        self._busy, self._unwritable, self._remove = busy, unwritable, remove_on_release
        self._descriptor: int | None = None

    def acquire(self):
        for _ in range(3):  # (again if the file was removed or replaced between open and flock)
            try:
                descriptor = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            except OSError as error:
                raise self._unwritable(error.strerror) from None
            if self._lock(descriptor):
                break
        else:
            raise MariusInputError(f"its {self.path.name} file keeps being replaced", path=self.path.parent,
                                   expected="one command at a time here")
        self._descriptor = descriptor
        record = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.strftime("%Y-%m-%d %H:%M:%S")}
        try:
            os.ftruncate(descriptor, 0)
            os.pwrite(descriptor, (json.dumps(record) + "\n").encode(), 0)
        except BaseException:  # (a full disk refused the holder record: no lock is held, and none is left)
            self.release()
            raise
        return self

    def _lock(self, descriptor: int) -> bool:
        """Lock the open file; False when it is no longer the file at the path (then try again)."""
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as error:
            if error.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                holder = _lock_holder(descriptor)
                os.close(descriptor)
                raise self._busy(holder) from None
            if error.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
                os.close(descriptor)
                raise
            return True  # a file system without locks: go on unlocked
        try:
            same = os.stat(self.path).st_ino == os.fstat(descriptor).st_ino
        except FileNotFoundError:
            same = False
        if not same:
            os.close(descriptor)
        return same

    def release(self) -> None:
        if self._descriptor is not None:
            if self._remove:
                try:
                    os.unlink(self.path)
                except OSError:
                    pass
            os.close(self._descriptor)
            self._descriptor = None

    def __enter__(self):
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


class RunLock(DirectoryLock):
    """``RUN_DIR/LOCK`` for as long as one command trains in the run directory; the file stays. Commands
    that only read a run (eval, export, predict, info, verify, plot) do not take it. Under torchrun, the
    trainer of rank 0 holds it for the group (the others only read the run directory)."""

    def __init__(self, run_dir: str | os.PathLike):
        self.run_dir = Path(run_dir)
        super().__init__(
            self.run_dir / LOCK_FILE,
            busy=lambda holder: MariusInputError(
                f"run directory {self.run_dir} is in use by {holder}",
                expected="one training command per run directory at a time: wait for it to end or stop it, or "
                         "train into another --run-dir"),
            unwritable=lambda reason: MariusInputError(f"cannot write in the run directory ({reason})",
                                                       path=self.run_dir, expected="a run directory this user can write"))


def _lock_holder(descriptor: int) -> str:
    try:
        record = json.loads(os.pread(descriptor, 4096, 0).decode("utf-8"))
        return f"pid {int(record['pid'])} on {record['host']} (since {record['since']})"
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return "another process (its pid is not written yet)"
