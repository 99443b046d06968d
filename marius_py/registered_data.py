"""A registered dataset (``marius_py.catalog``) made ready to train: fetched (``marius_py.download``), its split
files taken out of their archives, preprocessed into the cache and checked against the published counts.

Only the members the entry names are read out of an archive, streamed into files of the cache's own
naming (``raw/NAME-KEY/SPLIT...``), so neither memory nor a hostile member path comes into play. The
preprocessed dataset is keyed on the split files' contents and the entry's reading options, as a raw
directory is (``dataset_cache.raw_content_key``): a download that changed is prepared again, never reused.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
import tarfile
import zipfile
import zlib
from pathlib import Path, PurePosixPath

import numpy as np

from marius_py.catalog import SPLITS, DatasetSource, split_location
from marius_py.catalog_entries import registered, unknown_dataset
from marius_py.dataset import NODES_FILE, DatasetMetadata, read_names, write_given_negatives
from marius_py.dataset_cache import build_once, cache_dir, raw_content_key
from marius_py.download import confirm_digests, downloads_dir, fetch_files, recorded_digests
from marius_py.errors import MariusInputError
from marius_py.storage.durable import reporting_full_disk, write_atomic



def prepare(name: str, num_partitions: int = 1, progress: bool = True, offline: bool = False,
            source: Path | None = None, output: Path | None = None, overwrite: bool = False,
            seed: int = 0) -> Path:
    """The preprocessed directory of registered dataset ``name`` (bucketed for ``num_partitions``): in the
    cache, or ``output`` where given (``overwrite``: an existing dataset there is replaced). ``seed``: of the
    ids and of the split of a graph split by preprocessing. It is published only once it holds everything
    and shows the published counts: a failure or an interrupt leaves nothing that looks prepared."""
    entry = registered(name)
    if entry is None:
        raise unknown_dataset(name)
    downloaded = fetch_files(name, entry, offline=offline, source=source, progress=progress)
    if entry.task == "node_classification":
        raise MariusInputError(f"dataset {name} is for node classification, which training does not do yet: its "
                               "files are fetched and checked, kept as downloaded", path=downloads_dir(name),
                               expected="a link-prediction or graph dataset (`marius-py datasets` lists them)")
    files = split_files(name, entry, downloaded)
    build = _ogb_build if entry.ogb is not None else _text_build
    options, make = build(name, entry, files, PreprocessSettings(num_partitions, seed, progress))
    if output is None:
        layout = dataclasses.asdict(entry.ogb) if entry.ogb is not None else None
        key = hashlib.sha256((raw_content_key(files) + json.dumps([dataclasses.asdict(options), layout],
                                                                  sort_keys=True)).encode()).hexdigest()[:16]
        output = cache_dir() / "datasets" / f"{name}-{key}-p{num_partitions}"
        build_once(output, f"preprocessing {name} into {output}", progress, lambda: make(output, False))
    else:
        make(output, overwrite)
    confirm_digests(name, entry)
    return output


@dataclasses.dataclass(frozen=True)
class PreprocessSettings:
    """What a caller decides of a registered dataset's preprocessing (its entry decides the rest)."""
    num_partitions: int
    seed: int
    progress: bool


def _text_build(name: str, entry: DatasetSource, files: dict[str, Path], settings: PreprocessSettings):
    """(options, make(output, overwrite)) for split files preprocessing reads as text."""
    from marius_py.preprocess import PreprocessOptions, preprocess
    extra = {"split_fractions": entry.split} if entry.split is not None else {}
    options = PreprocessOptions(delimiter=entry.delimiter, columns=entry.columns, pairs=entry.pairs,
                                skip_header=entry.skip_header, num_partitions=settings.num_partitions,
                                seed=settings.seed, **extra)

    def make(output: Path, overwrite: bool) -> None:
        preprocess(output, files["train"], files.get("valid"), files.get("test"), options,
                   progress=settings.progress, overwrite=overwrite,
                   finish=lambda staging, metadata: _check_counts(name, entry, metadata, output))
    return options, make


def _ogb_build(name: str, entry: DatasetSource, files: dict[str, Path], settings: PreprocessSettings):
    """(options, make(output, overwrite)) for OGB's split files: every node of the graph known (and every
    relation the splits name), the valid and test negatives put in the dataset's ids before it is published.
    The split files are read only when a dataset is made (a cached one is found by the files' contents)."""
    from marius_py.ogb import OgbEdges, all_names, mapped_negatives, read_node_counts, read_npy_split, \
        read_split, write_lines
    from marius_py.preprocess import PreprocessOptions, preprocess
    layout, folder = entry.ogb, files["train"].parent
    known_nodes = folder / "known_nodes.txt"
    known_relations = None if layout.pairs else folder / "known_relations.txt"
    options = PreprocessOptions(pairs=layout.pairs, num_partitions=settings.num_partitions, seed=settings.seed,
                                known_nodes=str(known_nodes),
                                known_relations=None if known_relations is None else str(known_relations))

    def make(output: Path, overwrite: bool) -> None:
        if layout.gives_negatives:
            splits = {split: read_split(files[split]) for split in SPLITS}
        else:  # (OGB-LSC: the test tails are hidden; its entry names the valid split for test too)
            splits = {split: read_npy_split(files[split], files["valid_tails"] if split != "train" else None)
                      for split in SPLITS}
        write_lines(known_nodes, all_names(read_node_counts(files["node_counts"], layout.typed)))
        if known_relations is not None:
            if layout.gives_negatives:
                relations = np.unique(np.concatenate([split["relation"] for split in splits.values()])).tolist()
            else:  # (hundreds of millions of edges: the count its meta.pt gives)
                relations = range(int(read_split(files["node_counts"])["num_relations"]))
            write_lines(known_relations, map(str, relations))

        def finish(staging: Path, metadata: DatasetMetadata) -> None:
            _check_counts(name, entry, metadata, output)
            if layout.gives_negatives:
                given = mapped_negatives({split: splits[split] for split in ("valid", "test")}, layout,
                                         read_names(staging / NODES_FILE),
                                         {"valid": metadata.num_valid, "test": metadata.num_test}, output)
                write_given_negatives(staging, given, source="OGB")
        preprocess(output, *(OgbEdges(splits[split], split, layout) for split in SPLITS), options,
                   progress=settings.progress, overwrite=overwrite, finish=finish)
    return options, make


def split_files(name: str, entry: DatasetSource, downloaded: dict[str, Path]) -> dict[str, Path]:
    """split -> a file preprocessing reads (an OGB entry's node counts come as "node_counts", OGB-LSC's valid
    tails as "valid_tails")."""
    extra = {} if entry.ogb is None else {"node_counts": entry.ogb.num_nodes,
                                           **({"valid_tails": entry.ogb.valid_tails} if entry.ogb.valid_tails else {})}
    return located_files(name, entry, downloaded, dict(entry.splits, **extra))


def node_files(name: str, entry: DatasetSource, offline: bool = False, source: Path | None = None,
               progress: bool = True) -> dict[str, Path]:
    """A node-classification dataset's parts (``DatasetSource.node_files``), fetched and taken out of their
    archives into the cache, where the GNN encoders will read them."""
    downloaded = fetch_files(name, entry, offline=offline, source=source, progress=progress)
    files = located_files(name, entry, downloaded, entry.node_files)
    confirm_digests(name, entry)
    return files


def located_files(name: str, entry: DatasetSource, downloaded: dict[str, Path],
                  locations: dict[str, str]) -> dict[str, Path]:
    """part -> its file: a download itself, or its member extracted into the cache (once per set of downloads:
    ``raw/NAME-KEY/PART-MEMBER``, the member's own file name kept for its suffix)."""
    digests = recorded_digests(name, entry)
    key = hashlib.sha256(json.dumps([digests, locations], sort_keys=True).encode()).hexdigest()[:16]
    directory = cache_dir() / "raw" / f"{name}-{key}"
    files = {}
    for part, location in locations.items():
        filename, member = split_location(location)
        if member is None:
            files[part] = downloaded[filename]
            continue
        target = directory / f"{part}-{PurePosixPath(member).name}"
        if not target.is_file():
            directory.mkdir(parents=True, exist_ok=True)
            _extract_member(name, downloaded[filename], member, target)
        files[part] = target
    return files


def _extract_member(name: str, archive: Path, member: str, target: Path) -> None:
    """Stream ``member`` of ``archive`` (zip or tar, compressed or not) into ``target``, atomically: whatever
    stops it (a damaged archive, a full disk, an interrupt) leaves no part of it behind."""
    try:
        with reporting_full_disk(f"extracting {member} of {name}", target.parent), \
                _open_member(archive, member) as stream:
            write_atomic(target, lambda out: shutil.copyfileobj(stream, out, 1 << 22))
    except BaseException as error:
        if isinstance(error, (tarfile.TarError, zipfile.BadZipFile, EOFError, zlib.error)):
            archive.unlink(missing_ok=True)  # (damaged: the next run fetches it again)
            raise MariusInputError(f"dataset {name}: cannot read {member} from the archive ({error}); removed it "
                                   "from the cache", path=archive,
                                   expected="the archive as its source serves it (the next run fetches it "
                                            "again)") from None
        if isinstance(error, OSError) and not isinstance(error, MariusInputError):
            raise MariusInputError(f"dataset {name}: cannot extract {member} ({error})", path=target,
                                   expected="a readable archive and a writable cache directory") from None
        raise  # (a full disk's own error, an interrupt)


def _open_member(archive: Path, member: str):
    if zipfile.is_zipfile(archive):
        bundle = zipfile.ZipFile(archive)
        if member not in bundle.namelist():
            bundle.close()
            raise _missing(archive, member, bundle.namelist())
        return _Closing(bundle.open(member), bundle)
    bundle = tarfile.open(archive, "r:*")
    try:
        info = bundle.getmember(member)
        stream = bundle.extractfile(info)
    except KeyError:
        names = bundle.getnames()
        bundle.close()
        raise _missing(archive, member, names) from None
    if stream is None:
        bundle.close()
        raise _missing(archive, member, [])
    return _Closing(stream, bundle)


def _missing(archive: Path, member: str, names: list[str]) -> MariusInputError:
    shown = ", ".join(names[:8]) + (", ..." if len(names) > 8 else "")
    return MariusInputError(f"the archive has no file {member}", path=archive,
                            expected=f"the member the dataset's entry names (the archive holds {shown or 'no files'})")


class _Closing:
    """A member's stream that closes its archive with it."""

    def __init__(self, stream, bundle):
        self.stream, self.bundle = stream, bundle

    def __enter__(self):
        return self.stream

    def __exit__(self, *exc):
        self.stream.close()
        self.bundle.close()


def _check_counts(name: str, entry: DatasetSource, metadata: DatasetMetadata, output: Path) -> None:
    """The built dataset against the published counts: the edges of each split as read (dropped ones
    included), and no more nodes or relations than published. A mismatch is one error (the dataset is not
    published)."""
    wrong = mismatches(entry, metadata)
    if wrong:
        raise MariusInputError(f"dataset {name}: the prepared dataset does not have the published counts "
                               f"({'; '.join(wrong)})", path=output,
                               expected=f"the counts {entry.stats.where or 'its source'} publishes: the files "
                                        "fetched may not be the dataset the entry describes")


def mismatches(entry: DatasetSource, metadata: DatasetMetadata) -> list[str]:
    s, found = entry.stats, []
    read = {"train": metadata.num_train, "valid": metadata.num_valid + metadata.num_dropped_valid,
            "test": metadata.num_test + metadata.num_dropped_test}
    if s.edges is not None and sum(read.values()) != s.edges:
        found.append(f"{sum(read.values()):,} edges, published {s.edges:,}")
    for split, count in read.items():
        published = getattr(s, split)
        if entry.split is None and published is not None and count != published:
            found.append(f"{count:,} {split} edges, published {published:,}")
    if s.nodes is not None and metadata.num_nodes > s.nodes:
        found.append(f"{metadata.num_nodes:,} nodes, published {s.nodes:,}")
    if s.relations is not None and entry.task == "link_prediction" and metadata.num_relations > s.relations:
        found.append(f"{metadata.num_relations:,} relations, published {s.relations:,}")
    return found
