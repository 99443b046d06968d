"""Datasets by name: the registry ``marius-py download NAME`` (and ``train``, ``preprocess`` and
``mp.load_dataset`` given a name) fetches from.

An entry (``DatasetSource``) says where the files come from (``Download``: a URL, mirrors, a checksum where
one is published), where its splits lie inside them (``"archive.zip!member/train.txt"``, or a download
itself), how preprocessing reads them, and what the dataset should hold once prepared (``Stats``, the
published counts, checked after preprocessing). Research code adds its own the way it adds any plug-in:

    from marius_py.catalog import DATASETS, DatasetSource, Download, Stats

    DATASETS.register("my-graph", DatasetSource(
        task="link_prediction", downloads=(Download("https://example.org/my-graph.tar.gz"),),
        splits={"train": "my-graph.tar.gz!train.tsv", "valid": "my-graph.tar.gz!valid.tsv",
                "test": "my-graph.tar.gz!test.tsv"},
        stats=Stats(nodes=1000, relations=5, train=9000, valid=500, test=500)))

The built-in entries are in ``marius_py.catalog_entries``, whose ``registered(name)`` looks a name up with
them loaded.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import PurePosixPath
from urllib.parse import urlparse

from marius_py.errors import MariusInputError
from marius_py.ogb import OgbLayout
from marius_py.registry import Registry

TASKS = ("link_prediction", "graph", "node_classification")
SPLITS = ("train", "valid", "test")
MEMBER_SEPARATOR = "!"  # "download!member": a file inside an archive


@dataclass(frozen=True)
class Download:
    """One file to fetch. ``filename``: its name in the cache (default: the URL's last part); ``sha256``: its
    published digest (None: the first download records one, and later ones must match it); ``md5``: an MD5
    its source publishes, checked too."""

    url: str
    filename: str = ""
    sha256: str | None = None
    mirrors: tuple[str, ...] = ()
    size: int | None = None
    md5: str | None = None  # (where the source publishes only an MD5: checked as well)

    def __post_init__(self):
        if not self.filename:
            object.__setattr__(self, "filename", PurePosixPath(urlparse(self.url).path).name)

    @property
    def urls(self) -> tuple[str, ...]:
        return (self.url, *self.mirrors)


@dataclass(frozen=True)
class Stats:
    """Published counts: ``nodes`` and ``relations`` over the whole dataset, ``train``/``valid``/``test``
    edges per split, or ``edges`` for a graph split by preprocessing."""

    nodes: int | None = None
    relations: int | None = None
    train: int | None = None
    valid: int | None = None
    test: int | None = None
    edges: int | None = None
    features: int | None = None  # node classification: feature width and classes; train/valid/test count nodes
    classes: int | None = None
    where: str = ""  # where they were published


@dataclass(frozen=True)
class DatasetSource:
    """A dataset the registry can fetch and prepare (see the module's docstring). ``splits`` maps each split
    to a download (its ``filename``) or a member of one (``"filename!path/in/archive"``); a graph given as
    one edge file maps only ``train`` and is split by preprocessing (``split``: the valid and test
    fractions). ``delimiter``, ``columns``, ``pairs`` and ``skip_header`` are ``marius-py preprocess``'s."""

    task: str
    downloads: tuple[Download, ...]
    splits: dict[str, str]
    stats: Stats = field(default_factory=Stats)
    delimiter: str = "\t"
    columns: tuple[int, ...] | None = None
    pairs: bool = False
    skip_header: int = 0
    split: tuple[float, float] | None = None
    license: str = ""
    restricts_use: bool = False  # (its license limits use, e.g. to non-commercial research: said before fetching)
    citation: str = ""
    homepage: str = ""
    protocol: str = "filtered"  # the evaluation its published results use
    notes: str = ""
    ogb: OgbLayout | None = None  # splits in OGB's files (``marius_py.ogb``): split/*/*.pt, not text
    # Node classification: where its parts lie (edges, features, labels, train/valid/test nodes), as splits do
    node_files: dict[str, str] = field(default_factory=dict)

    def download_named(self, filename: str) -> Download:
        for download in self.downloads:
            if download.filename == filename:
                return download
        raise KeyError(filename)


def split_location(location: str) -> tuple[str, str | None]:
    """("filename", member or None) of a split's location."""
    filename, _, member = location.partition(MEMBER_SEPARATOR)
    return filename, member or None


def _check_entry(name: str, entry: DatasetSource) -> None:
    """A registered entry must be complete enough to fetch and prepare."""
    def refuse(what: str, expected: str):
        raise MariusInputError(f"dataset {name!r}: {what}", expected=expected)
    if not isinstance(entry, DatasetSource):
        refuse(f"is a {type(entry).__name__}", "a marius_py.catalog.DatasetSource")
    if entry.task not in TASKS:
        refuse(f"task {entry.task!r}", f"one of {', '.join(TASKS)}")
    if not entry.downloads:
        refuse("has no downloads", "at least one Download(url)")
    filenames = [d.filename for d in entry.downloads]
    if len(set(filenames)) != len(filenames) or any(not f or "/" in f for f in filenames):
        refuse(f"download file names {filenames}", "distinct plain file names (Download.filename)")
    for download in entry.downloads:
        if urlparse(download.url).scheme not in ("http", "https", "file"):
            refuse(f"URL {download.url!r}", "an http, https or file URL")
        for kind, digest, length in (("sha256", download.sha256, 64), ("md5", download.md5, 32)):
            if digest is not None and (len(digest) != length or any(c not in "0123456789abcdef" for c in digest)):
                refuse(f"{kind} {digest!r} of {download.filename}", f"{length} lowercase hex digits")
    wanted = () if entry.task == "node_classification" else ("train",) if entry.split is not None else SPLITS
    if set(entry.splits) != set(wanted):
        refuse(f"splits {sorted(entry.splits)}", f"exactly {', '.join(wanted)}"
               + (" (a graph split by preprocessing names only train)" if entry.split is not None else "")
               if wanted else "none: a node-classification dataset is kept as downloaded")
    locations = (list(entry.splits.items()) + list(entry.node_files.items())
                 + ([("node counts", entry.ogb.num_nodes)] if entry.ogb else []))
    for split, location in locations:
        if split_location(location)[0] not in filenames:
            refuse(f"{split} is in {location!r}, which is no download", f"one of {', '.join(filenames)} "
                   f"(or 'filename{MEMBER_SEPARATOR}member')")


DATASETS: Registry[DatasetSource] = Registry("dataset", "marius_py.catalog.DATASETS", check=_check_entry)


def describe(name: str, entry: DatasetSource) -> str:
    """One line of ``marius-py datasets``."""
    s = entry.stats
    counts = (f"{s.nodes:,} nodes" if s.nodes else "") + (f", {s.relations:,} relations" if s.relations else "")
    if entry.task == "node_classification":
        counts += f", {_count(s.edges)} edges, {_count(s.features)} features, {_count(s.classes)} classes"
    else:
        counts += f", {_count(s.edges or sum(n for n in (s.train, s.valid, s.test) if n))} edges"
    return f"{name:<18} {entry.task:<20} {counts}; {entry.license or 'license: see homepage'}"


def _count(value: int | None) -> str:
    return f"{value:,}" if value else "?"
