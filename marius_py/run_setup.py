"""A run directory claimed for one training command: a new run's directory made (or one a run that never
committed left, reused), a resumed one checked, the directory locked (``run_lock.RunLock``) while the command
trains, and what a new run wrote removed when its setup fails with a user error.

``claim_run_dir`` is that sequence, for ``api.train`` and for rank 0 of a torchrun group
(``distributed.launch``).
"""

from __future__ import annotations

import errno
import os
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

import yaml

from marius_py.checkpoint import (CHECKPOINTS, CONFIG_FILE, LIVE_STORE, METRICS_FILE, TEMPORARY_VERSION,
                                  RunDirectory)
from marius_py.config import CONFIG_SECTIONS
from marius_py.dataset import METADATA_FILE
from marius_py.errors import MariusInputError
from marius_py.run_lock import LOCK_FILE, RunLock

# What a new run writes besides config.yaml and checkpoints/ (removed when a directory whose run never
# committed is reused).
RUN_OUTPUTS = (METRICS_FILE, LIVE_STORE, "tensorboard", "plots", "distributed")

Started = TypeVar("Started")


@contextmanager
def claim_run_dir(run_dir: Path, resume: bool, set_up: Callable[[], Started]) -> Iterator[Started]:
    """The run directory, held for the with-block (which trains): made for a new run or checked for a
    resume, locked, then ``set_up()`` (a new run's config written, the dataset opened, the trainer built),
    whose result is yielded.

    A user error in ``set_up`` removes what the new run wrote (the directory, when this call made it);
    errors while training leave it (--resume continues it, and a new run that finds nothing committed there
    reuses it). A file that may not be written is one error naming it, in setup or training. The lock is
    released however the block ends."""
    with unwritable_as_user_error():
        created = open_run_dir(run_dir, resume)
        with RunLock(run_dir):
            check_new_run_dir(run_dir, resume)
            try:
                started = set_up()
            except MariusInputError:
                if not resume:
                    discard_new_run(run_dir, created)
                raise
            yield started


def closing_on_failure(trainer, step: Callable[[], None]) -> None:
    """Run ``step`` (a setup step after ``trainer`` is built: anything with ``close()``); when it fails, release
    the trainer first."""
    try:
        step()
    except BaseException:
        trainer.close()
        raise


def open_run_dir(run_dir: Path, resume: bool) -> bool:
    """Make a new run's directory (True: this call made it); a resumed one must be a run directory."""
    if resume:
        if not (run_dir / CONFIG_FILE).is_file():
            raise not_a_run(run_dir)
        return False
    if run_dir.exists() and not run_dir.is_dir():
        raise MariusInputError("exists and is not a directory", path=run_dir,
                               expected="--run-dir naming a new or empty directory")
    if run_dir.is_dir():  # (refused before a lock file is written into it; checked again under the lock)
        _check_new_run_dir(run_dir)
    created = not run_dir.exists()
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise MariusInputError(f"cannot create the run directory ({error.strerror})", path=run_dir,
                               expected="a --run-dir where this user can create a directory") from None
    return created


def check_new_run_dir(run_dir: Path, resume: bool) -> None:
    """With the run directory's lock held: a new run refuses a directory that holds committed state (or a
    dataset), and clears what a run that never committed left there (its config, log and live store), so
    it starts clean; a resume checks that it can write what it rewrites."""
    if resume:
        _check_writable(run_dir)
        return
    _check_new_run_dir(run_dir)
    run = RunDirectory(run_dir)
    if written_by_a_run(run):
        clear_uncommitted(run)


def _check_new_run_dir(run_dir: Path) -> None:
    """Refuse a directory with committed state, a dataset, or files of its own that a new run would
    overwrite (config.yaml, metrics.jsonl, store/, ...) unless a run that never committed wrote them."""
    run = RunDirectory(run_dir)
    if holds_committed_run(run):
        raise MariusInputError("run directory already holds a run", path=run_dir,
                               expected="a new directory, or --resume to continue it")
    if (run_dir / METADATA_FILE).exists():
        raise MariusInputError("is a preprocessed dataset directory", path=run_dir,
                               expected="a --run-dir of its own for the run (not the dataset's)")
    names = clashes(run)
    if names and not written_by_a_run(run):
        raise MariusInputError(f"holds {', '.join(names)}, which a new run would overwrite, and is not a run "
                               f"directory", path=run_dir,
                               expected="a new or empty directory, or one a run that never committed left")


def _check_writable(run_dir: Path) -> None:
    """A resume writes versions into checkpoints/ and relinks the live store: refuse, up front, read-only
    places (rather than fail after an epoch of training)."""
    places = [run_dir, run_dir / CHECKPOINTS] + [Path(d) for d, _, _ in os.walk(run_dir / LIVE_STORE)]
    for place in places:
        if place.exists() and not os.access(place, os.W_OK | os.X_OK):
            raise MariusInputError("not writable", path=place,
                                   expected="a run directory whose folders this user can write (a resume writes "
                                            "checkpoints/, store/, config.yaml and metrics.jsonl)")


def discard_new_run(run_dir: Path, created: bool) -> None:
    """Remove what a new run that failed before its first commit wrote: the directory when it made it, else
    its config, log, live store and lock file (never anything of a committed run)."""
    run = RunDirectory(run_dir)
    if holds_committed_run(run):
        return
    if created:
        shutil.rmtree(run_dir, ignore_errors=True)
        return
    try:
        clear_uncommitted(run, config_too=True)
        (run_dir / LOCK_FILE).unlink(missing_ok=True)
    except OSError:
        pass  # (the error being raised says more)


@contextmanager
def unwritable_as_user_error():
    """A file training must write that it may not (permissions, a read-only file system): one clear error
    naming it. (The commit protocol leaves the last committed version intact whatever failed.)"""
    try:
        yield
    except OSError as error:
        if error.errno not in (errno.EACCES, errno.EPERM, errno.EROFS):
            raise
        raise MariusInputError(f"cannot write ({error.strerror})", path=error.filename or "the run directory",
                               expected="a run directory and dataset cache this user can write") from None


def not_a_run(run_dir) -> MariusInputError:
    """The error for a directory without a run's config.yaml (a resume, or a command reading a run)."""
    if (Path(run_dir) / CHECKPOINTS).is_dir():
        return MariusInputError("missing (the run's checkpoints/ is there)", path=Path(run_dir) / CONFIG_FILE,
                                expected="the run's config.yaml restored from a copy (it names the dataset and "
                                         "model the checkpoints were trained with)")
    return MariusInputError("not a run directory (no config.yaml)", path=run_dir,
                            expected="a directory written by `marius-py train`")


# ---- what a directory holds ----

def holds_committed_run(run: RunDirectory) -> bool:
    """Whether a new run here could overwrite committed state: a pointer file (even a damaged one) or a
    version directory."""
    return run.pointer_file.exists() or bool(run.versions_on_disk())


def written_by_a_run(run: RunDirectory) -> bool:
    """Whether the directory is what ``RunDirectory.create`` makes: checkpoints/ and a run's resolved
    config.yaml (its sections, not necessarily valid for this version's checks)."""
    if not (run.checkpoints.is_dir() and (run.path / CONFIG_FILE).is_file()):
        return False
    try:
        raw = yaml.safe_load((run.path / CONFIG_FILE).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return False
    return isinstance(raw, dict) and {"dataset", "model", "training"} <= set(raw) <= set(CONFIG_SECTIONS)


def clashes(run: RunDirectory) -> list[str]:
    """Names in the directory that a new run writes (an empty checkpoints/ aside)."""
    names = [name for name in (CONFIG_FILE,) + RUN_OUTPUTS if (run.path / name).exists()]
    if run.checkpoints.exists() and not (run.checkpoints.is_dir() and all(
            TEMPORARY_VERSION.fullmatch(child.name) for child in run.checkpoints.iterdir())):
        names.append(CHECKPOINTS)
    return names


def clear_uncommitted(run: RunDirectory, config_too: bool = False) -> None:
    """Remove what a run that never committed left (its log, live store, temporary versions; with
    ``config_too`` its config.yaml and an empty checkpoints/), so a new run starts clean. Refuses a
    directory that holds committed state."""
    if holds_committed_run(run):
        raise MariusInputError("run directory already holds a run", path=run.path,
                               expected="a new directory, or --resume to continue it")
    for name in RUN_OUTPUTS + ((CONFIG_FILE,) if config_too else ()):
        target = run.path / name
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        elif target.exists() or target.is_symlink():
            target.unlink()
    if run.checkpoints.is_dir():
        for child in run.checkpoints.iterdir():
            if TEMPORARY_VERSION.fullmatch(child.name):
                shutil.rmtree(child)
        if config_too and not any(run.checkpoints.iterdir()):
            run.checkpoints.rmdir()
