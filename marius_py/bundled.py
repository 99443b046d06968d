"""Bundled datasets and configs, and resolution of ``dataset.path``.

``dataset.path`` may name the bundled dataset (``codex-m``), a registered dataset (``marius_py.catalog``:
fetched and prepared once, ``marius_py.registered_data``), a preprocessed
dataset directory, or a raw directory holding ``train/valid/test.txt[.gz]``
(tab-separated head, relation, tail); the latter two are preprocessed once into
the cache directory (``$MARIUS_PY_CACHE``, default ``~/.cache/marius-py``), under a key made of the raw files'
contents (``raw_content_key``), never of their path alone: files edited or replaced are preprocessed anew. A dataset whose train edges
are bucketed for another partition count than the run's is re-bucketed into the cache once
(``bucketed_for_run``), so any ``storage.num_partitions`` trains on it.
"""

from __future__ import annotations

import hashlib
from importlib import resources
from pathlib import Path

from marius_py.dataset import METADATA_FILE, Dataset
from marius_py.dataset_cache import build_once, cache_dir, raw_content_key
from marius_py.errors import MariusInputError
from marius_py.resources import check_partitions_filled
from marius_py.storage.edge_store import EDGE_FILE

BUNDLED_DATASETS = ("codex-m",)
BUNDLED_CONFIGS = ("codex-m", "codex-m-best", "codex-s", "fb15k-237", "ogbl-wikikg2", "ogbl-biokg")
BUNDLED_SPACES = ("fb15k-237",)  # search spaces of `marius-py tune --space NAME`
SPLIT_NAMES = ("train", "valid", "test")


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


def _preprocess_raw(files: dict[str, Path], name: str, num_partitions: int, progress: bool) -> Path:
    """The cached dataset preprocessed from raw split ``files``, keyed on their contents."""
    from marius_py.preprocess import PreprocessOptions, preprocess
    output = cache_dir() / "datasets" / f"{name}-{raw_content_key(files)}-p{num_partitions}"
    return build_once(output, f"preprocessing {files['train'].parent} into {output}", progress,
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
    return build_once(output, f"re-bucketing {directory} for {num_partitions} partitions into {output}", progress,
                       lambda: rebucket(directory, output, num_partitions, progress=progress))


def bucketed_for_run(num_partitions: int, dataset: Dataset, progress: bool) -> Dataset:
    """``dataset`` with its train edges bucketed for the run's (physical) partitions: itself, or a re-bucketed
    copy in the cache (made once)."""
    if num_partitions <= 1 or dataset.edges.num_partitions == num_partitions:
        return dataset
    check_partitions_filled(num_partitions, dataset)
    return Dataset(_bucketed_for(dataset.directory, num_partitions, progress))


def resolve_dataset(path_or_name: str, num_partitions: int = 1, progress: bool = True) -> Path:
    """The preprocessed directory for ``dataset.path``, preprocessing it first if needed."""
    if path_or_name in BUNDLED_DATASETS and not Path(path_or_name).exists():
        source = Path(str(resources.files("marius_py.data").joinpath(path_or_name)))
        return _preprocess_raw(_raw_split_files(source), path_or_name, num_partitions, progress)
    directory = Path(path_or_name).expanduser()
    if (directory / METADATA_FILE).exists():
        return directory  # (bucketed_for_run re-buckets it when a run needs other partitions)
    files = _raw_split_files(directory) if directory.is_dir() else None
    if files is None and not directory.exists():
        from marius_py.catalog_entries import registered
        if registered(str(path_or_name)) is not None:  # (a registry name: fetched and prepared once)
            from marius_py.registered_data import prepare
            return prepare(str(path_or_name), num_partitions, progress)
    if files is None:
        from marius_py.catalog_entries import closest_names
        close = closest_names(str(path_or_name)) if not directory.exists() else []
        hint = f" (a registered dataset's name? did you mean {' or '.join(close)}?)" if close else ""
        raise MariusInputError(f"dataset.path: not a dataset{hint}", path=directory,
                               expected=f"a preprocessed directory (with {METADATA_FILE}), a directory "
                                        f"with train/valid/test.txt, one of {', '.join(BUNDLED_DATASETS)}, or a "
                                        "registered dataset's name (`marius-py datasets` lists them)")
    return _preprocess_raw(files, directory.resolve().name or "dataset", num_partitions, progress)
