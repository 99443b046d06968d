"""The cache of prepared datasets (``$MARIUS_PY_CACHE``, default ``~/.cache/marius-py``): where it is, the
content keys its entries are made under, and building an entry once, whoever else builds it meanwhile."""

from __future__ import annotations

import hashlib
import os
import stat
import tempfile
from pathlib import Path

from marius_py.dataset import METADATA_FILE
from marius_py.errors import MariusInputError
from marius_py.storage.durable import write_text_atomic

_HASH_EVERY_TIME = 1 << 30  # bytes of raw files read on every open (~0.6 s); larger ones once per file version


def cache_dir() -> Path:
    """``$MARIUS_PY_CACHE`` (``~`` expanded; empty is unset), default ``~/.cache/marius-py``."""
    return Path(os.environ.get("MARIUS_PY_CACHE") or Path.home() / ".cache" / "marius-py").expanduser()


def _writable_cache_directory(directory: Path) -> None:
    """Create ``directory`` (in the cache) and check that files can be made there; else one clear error
    naming ``$MARIUS_PY_CACHE`` and the path."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=directory):
            pass
    except OSError as error:
        blocker = next((p for p in [directory, *directory.parents] if p.exists() and not p.is_dir()), None)
        reason = f"{blocker} is a file, not a directory" if blocker else error.strerror or str(error)
        variable = os.environ.get("MARIUS_PY_CACHE")
        where = f"MARIUS_PY_CACHE={variable}" if variable else f"the cache directory {cache_dir()}"
        raise MariusInputError(f"{where}: cannot write {directory} ({reason})", path="environment",
                               expected="MARIUS_PY_CACHE naming a writable directory (the cache of preprocessed "
                                        "datasets; default ~/.cache/marius-py)") from None


def raw_content_key(files: dict[str, Path]) -> str:
    """A digest of the raw split files' contents (and which split each is). Files up to ``_HASH_EVERY_TIME``
    bytes in all are read on every call; larger ones once per (path, size, modification time, inode), their
    digest kept in the cache (``raw-digests/``)."""
    stats = {split: (path.resolve(), _regular_file_stat(path)) for split, path in files.items()}
    # (the change time and device as well: a tool can set a file's modification time back, not its ctime)
    signature = hashlib.sha256("|".join(f"{split}:{path}:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}:{st.st_ino}:"
                                        f"{st.st_dev}" for split, (path, st) in sorted(stats.items())).encode()
                               ).hexdigest()
    large = sum(st.st_size for _, st in stats.values()) > _HASH_EVERY_TIME
    memo = cache_dir() / "raw-digests" / signature[:32]
    if large and memo.is_file():
        return memo.read_text(encoding="utf-8").strip()
    key = _contents_digest(files)[:16]
    if large:
        try:
            memo.parent.mkdir(parents=True, exist_ok=True)
            write_text_atomic(memo, key + "\n")
        except OSError:
            pass  # (read again next time)
    return key


def _regular_file_stat(path: Path) -> os.stat_result:
    """A raw split file's stat; one that is not a regular file (a FIFO would be read up by the key) is refused."""
    status = path.stat()
    if not stat.S_ISREG(status.st_mode):
        raise MariusInputError("is not a regular file", path=path,
                               expected="regular train/valid/test files in a raw dataset directory (preprocess "
                                        "a pipe with `marius-py preprocess`)")
    return status


def _contents_digest(files: dict[str, Path]) -> str:
    digest = hashlib.sha256()
    for split, path in sorted(files.items()):
        digest.update(f"{split}\0".encode())
        try:
            with open(path, "rb") as handle:
                while block := handle.read(1 << 24):
                    digest.update(block)
        except OSError as error:
            raise MariusInputError(f"cannot read the {split} edges ({error.strerror})", path=path,
                                   expected="readable train/valid/test files") from None
    return digest.hexdigest()


def build_once(output: Path, note: str, progress: bool, build) -> Path:
    """``output``, built by ``build()`` unless a complete dataset is there already."""
    if not (output / METADATA_FILE).exists():
        _writable_cache_directory(output.parent)
        if progress:
            print(note)
        try:
            build()
        except (MariusInputError, OSError):
            if not (output / METADATA_FILE).exists():
                raise
            # Another process (runs of a sweep started together) published the same dataset first:
            # building is deterministic, so theirs is ours.
    return output
