"""One training command per run directory: an exclusive ``flock`` on ``RUN_DIR/LOCK``.

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
from pathlib import Path

from marius_py.errors import MariusInputError

LOCK_FILE = "LOCK"


class RunLock:
    """An exclusive ``flock`` on ``RUN_DIR/LOCK`` for as long as one command trains in the run directory.

    The file names its holder (pid, host, since when), for the message a second
    command gets. The lock goes with the process (a kill releases it); the file
    stays. Commands that only read a run (eval, export, predict, info, verify,
    plot) do not take it. Under torchrun, the trainer of rank 0 holds it for the
    group (the others only read the run directory).
    """

    def __init__(self, run_dir: str | os.PathLike):
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / LOCK_FILE
        self._descriptor: int | None = None

    def acquire(self) -> "RunLock":
        for _ in range(3):  # (again if the file was removed or replaced between open and flock)
            descriptor = self._open()
            if self._lock(descriptor):
                break
        else:
            raise MariusInputError(f"run directory {self.run_dir}: its {LOCK_FILE} file keeps being replaced",
                                   expected="one training command per run directory at a time")
        self._descriptor = descriptor
        record = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.strftime("%Y-%m-%d %H:%M:%S")}
        os.ftruncate(descriptor, 0)
        os.pwrite(descriptor, (json.dumps(record) + "\n").encode(), 0)
        return self

    def _open(self) -> int:
        try:
            return os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as error:
            raise MariusInputError(f"cannot write in the run directory ({error.strerror})", path=self.run_dir,
                                   expected="a run directory this user can write") from None

    def _lock(self, descriptor: int) -> bool:
        """Lock the open file; False when it is no longer the file at the path (then try again)."""
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as error:
            if error.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                holder = _lock_holder(descriptor)
                os.close(descriptor)
                raise MariusInputError(f"run directory {self.run_dir} is in use by {holder}",
                                       expected="one training command per run directory at a time: wait for it "
                                                "to end or stop it, or train into another --run-dir") from None
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
            os.close(self._descriptor)
            self._descriptor = None

    def __enter__(self) -> "RunLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def _lock_holder(descriptor: int) -> str:
    try:
        record = json.loads(os.pread(descriptor, 4096, 0).decode("utf-8"))
        return f"pid {int(record['pid'])} on {record['host']} (since {record['since']})"
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return "another process (its pid is not written yet)"
