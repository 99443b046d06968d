"""Bundled datasets and configs, and resolution of ``dataset.path``.

``dataset.path`` may name the bundled dataset (``codex-m``), a preprocessed
dataset directory, or a raw directory holding ``train/valid/test.txt[.gz]``
(tab-separated head, relation, tail); the latter two are preprocessed once into
the cache directory (``$MARIUS_PY_CACHE``, default ``~/.cache/marius-py``), under a key made of the raw files'
contents (``raw_content_key``), never of their path alone: files edited or replaced are preprocessed anew. A dataset whose train edges
are bucketed for another partition count than the run's is re-bucketed into the cache once
(``bucketed_for_run``), so any ``storage.num_partitions`` trains on it.
"""

from __future__ import annotations

import hashlib
import os
import stat
import tempfile
from importlib import resources
from pathlib import Path

from marius_py.dataset import METADATA_FILE, Dataset
from marius_py.errors import MariusInputError
from marius_py.resources import check_partitions_filled
from marius_py.storage.durable import write_text_atomic
from marius_py.storage.edge_store import EDGE_FILE

BUNDLED_DATASETS = ("codex-m",)
BUNDLED_CONFIGS = ("codex-m", "codex-m-best", "codex-s", "fb15k-237")
BUNDLED_SPACES = ("fb15k-237",)  # search spaces of `marius-py tune --space NAME`
SPLIT_NAMES = ("train", "valid", "test")
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


def bundled_config(name: str) -> Path:
    """Path of a config shipped with the package (``codex-m``, ``codex-s``, ``fb15k-237``)."""
    return Path(str(resources.files("marius_py.configs").joinpath(f"{name}.yaml")))


def bundled_space(name: str) -> Path | None:
    """Path of a search space shipped with the package (``marius_py/configs/spaces``), or None."""
    if name not in BUNDLED_SPACES:
        return None
    return Path(str(resources.files("marius_py.configs").joinpath(f"spaces/{name}.yaml")))


def _raw_split_files(directory: Path) -> dict[str, Path] | None:
    found = {}
    for split in SPLIT_NAMES:
        for suffix in (".txt", ".txt.gz", ".tsv", ".tsv.gz"):
            if (directory / f"{split}{suffix}").exists():
                found[split] = directory / f"{split}{suffix}"
                break
    return found if len(found) == len(SPLIT_NAMES) else None


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


def _preprocess_raw(files: dict[str, Path], name: str, num_partitions: int, progress: bool) -> Path:
    """The cached dataset preprocessed from raw split ``files``, keyed on their contents."""
    from marius_py.preprocess import PreprocessOptions, preprocess
    output = cache_dir() / "datasets" / f"{name}-{raw_content_key(files)}-p{num_partitions}"
    return _build_once(output, f"preprocessing {files['train'].parent} into {output}", progress,
                       lambda: preprocess(output, files["train"], files["valid"], files["test"],
                                          PreprocessOptions(num_partitions=num_partitions), progress=progress))


def _bucketed_for(directory: Path, num_partitions: int, progress: bool) -> Path:
    """The copy of the preprocessed ``directory`` re-bucketed for ``num_partitions``, in the cache."""
    from marius_py.preprocess import rebucket
    edges = (directory / EDGE_FILE).stat()  # in the key: a dataset preprocessed again gets a new copy
    metadata = (directory / METADATA_FILE).read_bytes()
    key = hashlib.sha256(f"{directory.resolve()}:{edges.st_size}:{edges.st_mtime_ns}:{edges.st_ino}:".encode()
                         + metadata).hexdigest()[:12]
    output = cache_dir() / "datasets" / f"{directory.name}-{key}-p{num_partitions}"
    return _build_once(output, f"re-bucketing {directory} for {num_partitions} partitions into {output}", progress,
                       lambda: rebucket(directory, output, num_partitions, progress=progress))


def bucketed_for_run(num_partitions: int, dataset: Dataset, progress: bool) -> Dataset:
    """``dataset`` with its train edges bucketed for the run's (physical) partitions: itself, or a re-bucketed
    copy in the cache (made once)."""
    if num_partitions <= 1 or dataset.edges.num_partitions == num_partitions:
        return dataset
    check_partitions_filled(num_partitions, dataset)
    return Dataset(_bucketed_for(dataset.directory, num_partitions, progress))


def _build_once(output: Path, note: str, progress: bool, build) -> Path:
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


def resolve_dataset(path_or_name: str, num_partitions: int = 1, progress: bool = True) -> Path:
    """The preprocessed directory for ``dataset.path``, preprocessing it first if needed."""
    if path_or_name in BUNDLED_DATASETS and not Path(path_or_name).exists():
        source = Path(str(resources.files("marius_py.data").joinpath(path_or_name)))
        return _preprocess_raw(_raw_split_files(source), path_or_name, num_partitions, progress)
    directory = Path(path_or_name).expanduser()
    if (directory / METADATA_FILE).exists():
        return directory  # (bucketed_for_run re-buckets it when a run needs other partitions)
    files = _raw_split_files(directory) if directory.is_dir() else None
    if files is None:
        raise MariusInputError("dataset.path: not a dataset", path=directory,
                               expected=f"a preprocessed directory (with {METADATA_FILE}), a directory "
                                        f"with train/valid/test.txt, or one of {', '.join(BUNDLED_DATASETS)}")
    return _preprocess_raw(files, directory.resolve().name or "dataset", num_partitions, progress)
