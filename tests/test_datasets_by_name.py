"""Datasets by name (issue 54): a registered dataset is fetched over HTTP (resumed after a cut, checked),
its splits taken out of the archive, preprocessed into the cache and checked against the published counts;
offline, from a copy fetched elsewhere, or through a mirror. A local HTTP server stands in for the
internet."""

from __future__ import annotations

import hashlib
import http.server
import io
import tarfile
import threading
from pathlib import Path

import pytest

import marius_py as mp
from marius_py.catalog import DATASETS, DatasetSource, Download, Stats
from marius_py.catalog_entries import registered
from marius_py.cli import main
from marius_py.errors import MariusInputError
from marius_py.registered_data import prepare

UMLS_RAW = Path(__file__).parent / "data" / "umls"
UMLS_STATS = Stats(nodes=135, relations=46, train=5216, valid=652, test=661, where="the UMLS files")


class Server:
    """Files over HTTP on localhost, with range requests; ``cut_after``: the next response of a path stops
    after that many bytes (a dropped connection), and with ``gone_after_cut`` the path then answers 404;
    ``ignore_ranges``: answer every request whole; ``no_length``: send no Content-Length (a cut is then
    invisible to the client); ``failures``: answer the next requests of a path with these HTTP statuses."""

    def __init__(self):
        self.files: dict[str, bytes] = {}
        self.requests: list[tuple[str, str | None]] = []
        self.cut_after: dict[str, int] = {}
        self.ignore_ranges = False
        self.gone_after_cut = False
        self.no_length = False
        self.failures: dict[str, list[int]] = {}
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                wanted = self.headers.get("Range")
                server.requests.append((self.path, wanted))
                body = server.files.get(self.path)
                if server.failures.get(self.path):
                    self.send_error(server.failures[self.path].pop(0))
                    return
                if body is None:
                    self.send_error(404)
                    return
                start = 0
                etag = f'"{hashlib.sha256(body).hexdigest()[:16]}"'
                if self.headers.get("If-Range") not in (None, etag):
                    wanted = None  # (the file changed since the part was fetched: all of it)
                if wanted and not server.ignore_ranges:
                    start = int(wanted.removeprefix("bytes=").split("-")[0])
                    if start >= len(body):
                        self.send_response(416)
                        self.send_header("Content-Range", f"bytes */{len(body)}")
                        self.send_header("Content-Length", "0")
                        self.end_headers()
                        return
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
                else:
                    self.send_response(200)
                if not server.no_length:
                    self.send_header("Content-Length", str(len(body) - start))
                self.send_header("ETag", etag)
                self.end_headers()
                cut = server.cut_after.pop(self.path, None)
                self.wfile.write(body[start:start + cut] if cut is not None else body[start:])
                if cut is not None and server.gone_after_cut:
                    del server.files[self.path]

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}{path}"

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def umls_archive(prefix: str = "umls/") -> bytes:
    """The UMLS splits in a tar.gz, under ``prefix``."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for split in ("train", "valid", "test"):
            archive.add(UMLS_RAW / f"{split}.txt", arcname=f"{prefix}{split}.txt")
    return buffer.getvalue()


@pytest.fixture
def server():
    served = Server()
    yield served
    served.close()


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MARIUS_PY_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("MARIUS_PY_MIRROR", raising=False)
    monkeypatch.delenv("MARIUS_PY_OFFLINE", raising=False)
    monkeypatch.setattr("marius_py.download.time.sleep", lambda seconds: None)
    return tmp_path / "cache"


def umls_entry(url: str, sha256: str | None, stats: Stats = UMLS_STATS, member: str = "umls/") -> DatasetSource:
    return DatasetSource(task="link_prediction", downloads=(Download(url, "umls.tar.gz", sha256=sha256),),
                         splits={split: f"umls.tar.gz!{member}{split}.txt" for split in ("train", "valid", "test")},
                         stats=stats, license="test data")


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_a_registered_dataset_is_downloaded_checked_and_prepared_once(server, cache):
    archive = umls_archive()
    server.files["/umls.tar.gz"] = archive
    with DATASETS.registered("umls-test", umls_entry(server.url("/umls.tar.gz"), sha256(archive))):
        dataset = mp.load_dataset("umls-test")
        assert (dataset.num_nodes, dataset.num_relations) == (135, 46)
        assert (len(dataset.train), len(dataset.valid), len(dataset.test)) == (5216, 652, 661)
        assert dataset.directory.parent == cache / "datasets"
        assert mp.load_dataset("umls-test").directory == dataset.directory  # (prepared once)
        assert server.requests == [("/umls.tar.gz", None)]
        assert (cache / "downloads" / "umls-test" / "umls.tar.gz").read_bytes() == archive
        assert not list((cache / "downloads" / "umls-test").glob("*.part"))


@pytest.mark.parametrize("ignore_ranges", [False, True], ids=["resumed", "server-ignores-ranges"])
def test_a_cut_download_resumes_where_it_stopped(server, cache, ignore_ranges):
    archive = umls_archive()
    server.files["/umls.tar.gz"] = archive
    server.cut_after["/umls.tar.gz"] = 10_000
    server.ignore_ranges = ignore_ranges
    with DATASETS.registered("umls-test", umls_entry(server.url("/umls.tar.gz"), sha256(archive))):
        assert len(mp.load_dataset("umls-test").train) == 5216
    assert server.requests == [("/umls.tar.gz", None), ("/umls.tar.gz", "bytes=10000-")]
    assert (cache / "downloads" / "umls-test" / "umls.tar.gz").read_bytes() == archive


def test_a_file_whose_digest_differs_from_the_published_one_is_refused_and_removed(server, cache):
    server.files["/umls.tar.gz"] = umls_archive()
    with DATASETS.registered("umls-test", umls_entry(server.url("/umls.tar.gz"), "0" * 64)):
        with pytest.raises(MariusInputError, match="umls.tar.gz has SHA-256 [0-9a-f]{64}, not the published 0{64}"):
            mp.load_dataset("umls-test")
    assert not (cache / "downloads" / "umls-test" / "umls.tar.gz").exists()
    assert not (cache / "datasets").exists()


def test_without_a_published_digest_the_first_download_records_one_that_later_ones_must_match(server, cache):
    server.files["/umls.tar.gz"] = umls_archive()
    with DATASETS.registered("umls-test", umls_entry(server.url("/umls.tar.gz"), None)):
        mp.load_dataset("umls-test")
        (cache / "downloads" / "umls-test" / "umls.tar.gz").unlink()
        server.files["/umls.tar.gz"] = umls_archive(prefix="data/")  # (the source changed)
        with pytest.raises(MariusInputError, match="not the one recorded when a dataset was prepared from it"):
            mp.load_dataset("umls-test")


def test_offline_fetches_nothing_and_from_takes_a_copy_fetched_elsewhere(server, cache, tmp_path, monkeypatch):
    archive = umls_archive()
    elsewhere = tmp_path / "fetched-elsewhere"
    elsewhere.mkdir()
    (elsewhere / "umls.tar.gz").write_bytes(archive)
    monkeypatch.setenv("MARIUS_PY_OFFLINE", "1")
    with DATASETS.registered("umls-test", umls_entry(server.url("/umls.tar.gz"), sha256(archive))):
        with pytest.raises(MariusInputError, match="not in the cache and downloads are off"):
            mp.load_dataset("umls-test")
        assert main(["download", "umls-test", "--from", str(elsewhere), "--quiet"]) == 0
        assert len(mp.load_dataset("umls-test").test) == 661
    assert server.requests == []


def test_a_mirror_is_tried_before_the_entrys_url(server, cache, monkeypatch):
    archive = umls_archive()
    server.files["/mirror/umls-test/umls.tar.gz"] = archive
    monkeypatch.setenv("MARIUS_PY_MIRROR", server.url("/mirror/"))
    with DATASETS.registered("umls-test", umls_entry(server.url("/gone/umls.tar.gz"), sha256(archive))):
        assert len(mp.load_dataset("umls-test").valid) == 652
    assert server.requests == [("/mirror/umls-test/umls.tar.gz", None)]


def test_an_unreachable_source_is_one_error_and_keeps_what_was_fetched(server, cache):
    """A source that stops serving midway: one error naming the file and the HTTP status; the bytes fetched
    stay in FILE.part, and the next attempt asks only for the rest."""
    archive = umls_archive()
    server.files["/umls.tar.gz"] = archive
    server.cut_after["/umls.tar.gz"], server.gone_after_cut = 10_000, True
    with DATASETS.registered("umls-test", umls_entry(server.url("/umls.tar.gz"), sha256(archive))):
        with pytest.raises(MariusInputError, match=r"cannot download umls.tar.gz \(.*/umls.tar.gz: HTTP 404"):
            mp.load_dataset("umls-test")
        assert (cache / "downloads" / "umls-test" / "umls.tar.gz.part").stat().st_size == 10_000
        server.files["/umls.tar.gz"] = archive
        assert len(mp.load_dataset("umls-test").train) == 5216
    assert server.requests[-1] == ("/umls.tar.gz", "bytes=10000-")


def test_counts_other_than_the_published_ones_are_refused_and_leave_no_dataset(server, cache):
    archive = umls_archive()
    server.files["/umls.tar.gz"] = archive
    wrong = Stats(nodes=135, relations=46, train=5000, valid=652, test=661)
    with DATASETS.registered("umls-test", umls_entry(server.url("/umls.tar.gz"), sha256(archive), wrong)):
        with pytest.raises(MariusInputError, match="5,216 train edges, published 5,000"):
            mp.load_dataset("umls-test")
    assert not list((cache / "datasets").glob("umls-test-*"))


def test_a_member_the_archive_lacks_is_named(server, cache):
    archive = umls_archive()
    server.files["/umls.tar.gz"] = archive
    with DATASETS.registered("umls-test", umls_entry(server.url("/umls.tar.gz"), sha256(archive), member="UMLS/")):
        with pytest.raises(MariusInputError, match="has no file UMLS/train.txt.*holds umls/train.txt"):
            mp.load_dataset("umls-test")


def test_download_and_datasets_commands(server, cache, capsys):
    archive = umls_archive()
    server.files["/umls.tar.gz"] = archive
    with DATASETS.registered("umls-test", umls_entry(server.url("/umls.tar.gz"), sha256(archive))):
        assert main(["download", "umls-test", "--quiet"]) == 0
        out = capsys.readouterr().out
        assert "135 nodes, 46 relations, 5,216 / 652 / 661 train / valid / test edges" in out
        assert main(["datasets"]) == 0
        listed = capsys.readouterr().out
    assert "umls-test" in listed and "fb15k-237" in listed and "wn18rr" in listed
    assert main(["download", "no-such-dataset"]) == 2
    assert "unknown dataset 'no-such-dataset'" in capsys.readouterr().err


@pytest.mark.parametrize("change, message", [
    ({"task": "ranking"}, "task 'ranking'"),
    ({"downloads": ()}, "has no downloads"),
    ({"downloads": (Download("ftp://example.org/a.tar.gz"),)}, "URL 'ftp://"),
    ({"downloads": (Download("https://example.org/umls.tar.gz", sha256="ABC"),)}, "64 lowercase hex digits"),
    ({"splits": {"train": "umls.tar.gz!train.txt"}}, "exactly train, valid, test"),
    ({"splits": {"train": "other.tar.gz!a", "valid": "umls.tar.gz!b", "test": "umls.tar.gz!c"}},
     "which is no download"),
])
def test_an_incomplete_entry_is_refused_when_registered(change, message):
    import dataclasses
    entry = dataclasses.replace(umls_entry("https://example.org/umls.tar.gz", None), **change)
    with pytest.raises(MariusInputError, match=message):
        DATASETS.register("bad-entry", entry)
    assert registered("bad-entry") is None


def test_preprocess_a_registered_dataset_into_a_directory(server, cache, tmp_path, capsys):
    archive = umls_archive()
    server.files["/umls.tar.gz"] = archive
    out = tmp_path / "umls-p2"
    with DATASETS.registered("umls-test", umls_entry(server.url("/umls.tar.gz"), sha256(archive))):
        assert main(["preprocess", "umls-test", "-o", str(out), "--partitions", "2", "--quiet"]) == 0
        assert main(["preprocess", "umls-test", "-o", str(tmp_path / "x"), "--train", "a.txt"]) == 2
    assert "--train apply to files" in capsys.readouterr().err
    dataset = mp.load_dataset(str(out))
    assert dataset.edges.num_partitions == 2 and len(dataset.train) == 5216
    assert not (tmp_path / "x").exists()


def test_the_built_in_entries_are_complete():
    """Every built-in entry names its license, citation, homepage and published counts, and those that are
    repositories' files are pinned to a commit (a published digest stays true)."""
    names = [name for name in DATASETS if DATASETS.origin(name) == "the engine"]
    assert {"fb15k-237", "wn18rr", "codex-s", "codex-m", "nations", "kinships", "umls"} <= set(names)
    for name in names:
        entry = registered(name)
        assert entry.license and entry.citation and entry.homepage and entry.stats.where, name
        assert entry.stats.nodes and (entry.stats.edges or entry.stats.train), name
        for download in entry.downloads:
            if "raw.githubusercontent.com" in download.url:
                assert len(download.url.split("/")[5]) == 40, download.url  # (owner/repo/COMMIT/...)


def test_a_graph_given_as_one_edge_file_is_split_by_preprocessing(server, cache):
    """A plain graph (SNAP's layout: comment lines, then one 'source<TAB>target' per line, gzipped) names only
    train and the split's fractions; its published edge count is checked over the three splits."""
    import gzip
    lines = [f"{h}\t{t}" for h, _, t in (line.split("\t") for line in
                                          (UMLS_RAW / "train.txt").read_text().splitlines())]
    data = gzip.compress(("# Directed graph\n# FromNodeId\tToNodeId\n" + "\n".join(lines) + "\n").encode())
    server.files["/graph.txt.gz"] = data
    entry = DatasetSource(task="graph", downloads=(Download(server.url("/graph.txt.gz"), sha256=sha256(data)),),
                          splits={"train": "graph.txt.gz"}, pairs=True, skip_header=2, split=(0.1, 0.1),
                          stats=Stats(nodes=135, edges=len(lines)), license="test data")
    with DATASETS.registered("graph-test", entry):
        dataset = mp.load_dataset("graph-test")
    assert len(dataset.train) + len(dataset.valid) + len(dataset.test) == len(lines) == 5216
    assert len(dataset.valid) > 300 and dataset.num_relations == 1


def test_a_node_classification_dataset_is_fetched_and_kept_but_not_trained(server, cache, capsys):
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for member, data in (("nc/raw/edge.csv", b"0,1\n"), ("nc/raw/node-label.csv", b"0\n1\n")):
            info = tarfile.TarInfo(member)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    server.files["/nc.tar.gz"] = buffer.getvalue()
    entry = DatasetSource(task="node_classification", downloads=(Download(server.url("/nc.tar.gz")),), splits={},
                          node_files={"edges": "nc.tar.gz!nc/raw/edge.csv",
                                      "labels": "nc.tar.gz!nc/raw/node-label.csv"},
                          stats=Stats(nodes=2, edges=1, features=3, classes=2), license="test data")
    with DATASETS.registered("nc-test", entry):
        assert main(["download", "nc-test", "--quiet"]) == 0
        out = capsys.readouterr().out
        assert "1 file(s) fetched and checked, 2 part(s) kept for node classification" in out
        labels = Path(next(line for line in out.splitlines() if line.startswith("labels: ")).split(": ", 1)[1])
        assert labels.read_bytes() == b"0\n1\n" and labels.name == "labels-node-label.csv"
        with pytest.raises(MariusInputError, match="for node classification, which training does not do yet"):
            mp.load_dataset("nc-test")


def test_a_restrictive_license_is_said_before_anything_is_fetched(server, cache, capsys):
    import dataclasses
    archive = umls_archive()
    server.files["/umls.tar.gz"] = archive
    entry = dataclasses.replace(umls_entry(server.url("/umls.tar.gz"), sha256(archive)), restricts_use=True,
                                license="non-commercial research use only")
    with DATASETS.registered("umls-test", entry):
        assert main(["download", "umls-test", "--quiet"]) == 0
        assert "umls-test is licensed for restricted use only: non-commercial research use only" in \
            capsys.readouterr().err
        assert main(["download", "umls-test", "--quiet"]) == 0  # (in the cache: nothing fetched, nothing said)
        assert "licensed" not in capsys.readouterr().err


def test_an_unknown_name_suggests_the_closest_registered_ones(cache):
    with pytest.raises(MariusInputError, match="did you mean fb15k-237 or fb15k"):
        mp.api.load_dataset("fb15k_237")


def test_a_full_disk_while_downloading_is_one_error_naming_the_cache(server, cache, monkeypatch):
    import errno
    from marius_py.errors import DiskFullError
    archive = umls_archive()
    server.files["/umls.tar.gz"] = archive

    def full(descriptor):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr("marius_py.download.os.fsync", full)
    with DATASETS.registered("umls-test", umls_entry(server.url("/umls.tar.gz"), sha256(archive))):
        with pytest.raises(DiskFullError, match="downloading umls.tar.gz of umls-test"):
            mp.load_dataset("umls-test")
    assert server.requests == [("/umls.tar.gz", None)]  # (not retried: another attempt cannot fit either)
    assert not [p.name for p in (cache / "downloads" / "umls-test").iterdir() if "umls.tar.gz" in p.name
                and not p.name.endswith(".lock")]  # (neither the file nor a part of it)


@pytest.mark.parametrize("stop", ["full-disk", "interrupt"])
def test_extraction_stopped_midway_leaves_nothing_behind(server, cache, monkeypatch, stop):
    import errno
    import shutil as shutil_module
    from marius_py.errors import DiskFullError
    archive = umls_archive()
    server.files["/umls.tar.gz"] = archive
    original = shutil_module.copyfileobj

    def stopped(source, target, length=0):
        target.write(source.read(1000))
        raise OSError(errno.ENOSPC, "No space left on device") if stop == "full-disk" else KeyboardInterrupt()
    monkeypatch.setattr("marius_py.registered_data.shutil.copyfileobj", stopped)
    expected = DiskFullError if stop == "full-disk" else KeyboardInterrupt
    with DATASETS.registered("umls-test", umls_entry(server.url("/umls.tar.gz"), sha256(archive))):
        with pytest.raises(expected):
            mp.load_dataset("umls-test")
        assert not [p for p in (cache / "raw").rglob("*") if p.is_file()]  # (no member, not even a part)
        assert not (cache / "datasets").exists()
        monkeypatch.setattr("marius_py.registered_data.shutil.copyfileobj", original)
        assert len(mp.load_dataset("umls-test").train) == 5216  # (the download was kept: prepared now)
    assert len(server.requests) == 1


def test_a_published_md5_is_checked_too(server, cache):
    import dataclasses
    archive = umls_archive()
    server.files["/umls.tar.gz"] = archive
    entry = umls_entry(server.url("/umls.tar.gz"), None)
    wrong = dataclasses.replace(entry, downloads=(dataclasses.replace(entry.downloads[0], md5="0" * 32),))
    with DATASETS.registered("umls-test", wrong):
        with pytest.raises(MariusInputError, match="umls.tar.gz has MD5 [0-9a-f]{32}, not the published 0{32}"):
            mp.load_dataset("umls-test")
    right = dataclasses.replace(entry, downloads=(dataclasses.replace(
        entry.downloads[0], md5=hashlib.md5(archive, usedforsecurity=False).hexdigest()),))
    with DATASETS.registered("umls-test", right):
        assert len(mp.load_dataset("umls-test").train) == 5216


def test_a_dataset_registered_by_a_plugin_module_is_named_by_the_config(server, cache, tmp_path, monkeypatch):
    """``model.plugins`` is imported before the dataset is opened, so research code's own entry works from a
    config (and from the command line), like its decoders."""
    archive = umls_archive()
    server.files["/umls.tar.gz"] = archive
    monkeypatch.setenv("PLUGIN_DATASET_URL", server.url("/umls.tar.gz"))
    plugin = tmp_path / "lab_datasets.py"
    plugin.write_text(
        "import os\n"
        "from marius_py.catalog import DATASETS, DatasetSource, Download, Stats\n"
        "DATASETS.register('lab-umls', DatasetSource(task='link_prediction',\n"
        "    downloads=(Download(os.environ['PLUGIN_DATASET_URL'], 'umls.tar.gz'),),\n"
        "    splits={s: f'umls.tar.gz!umls/{s}.txt' for s in ('train', 'valid', 'test')},\n"
        "    stats=Stats(nodes=135, relations=46, train=5216, valid=652, test=661), license='test data'))\n")
    config = mp.make_config(None, [f"model.plugins={plugin}", "dataset.path=lab-umls", "training.device=cpu",
                                   "model.dim=8", "training.epochs=1", "evaluation.every=0"])
    model = mp.train(config, tmp_path / "run", progress=False)
    assert model.dataset.num_nodes == 135 and model.test_metrics["num_queries"] == 2 * 661


def test_a_first_download_cut_short_unseen_does_not_bar_the_right_file(server, cache):
    """Without a Content-Length a cut is invisible: the damaged archive is found at extraction, removed, and
    the next run's full download replaces it (a digest binds only once a dataset was prepared)."""
    archive = umls_archive()
    server.files["/umls.tar.gz"] = archive
    server.no_length, server.cut_after["/umls.tar.gz"] = True, 10_000
    with DATASETS.registered("umls-test", umls_entry(server.url("/umls.tar.gz"), None)):
        with pytest.raises(MariusInputError, match="cannot read umls/.* from the archive .*removed it"):
            mp.load_dataset("umls-test")
        assert not (cache / "downloads" / "umls-test" / "umls.tar.gz").exists()
        assert len(mp.load_dataset("umls-test").train) == 5216
        (cache / "downloads" / "umls-test" / "umls.tar.gz").unlink()
        server.files["/umls.tar.gz"] = umls_archive(prefix="data/")  # (now bound: a changed file is refused)
        with pytest.raises(MariusInputError, match="not the one recorded when a dataset was prepared"):
            mp.load_dataset("umls-test")


def test_server_errors_are_retried(server, cache):
    archive = umls_archive()
    server.files["/umls.tar.gz"] = archive
    server.failures["/umls.tar.gz"] = [500, 503]
    with DATASETS.registered("umls-test", umls_entry(server.url("/umls.tar.gz"), sha256(archive))):
        assert len(mp.load_dataset("umls-test").train) == 5216
    assert len(server.requests) == 3


def test_a_complete_part_is_taken_as_it_is_and_a_part_from_elsewhere_is_not_spliced(server, cache):
    """A part holding the whole file (the run was stopped before renaming it) is finished by a 416 whose
    total is its size; a part fetched from another URL, or of a file that has changed since, starts over."""
    import json as json_module
    archive = umls_archive()
    server.files["/umls.tar.gz"] = archive
    downloads = cache / "downloads" / "umls-test"
    downloads.mkdir(parents=True)
    url = server.url("/umls.tar.gz")
    (downloads / "umls.tar.gz.part").write_bytes(archive)
    (downloads / "umls.tar.gz.part.source").write_text(json_module.dumps({"url": url, "validator": None}))
    with DATASETS.registered("umls-test", umls_entry(url, sha256(archive))):
        assert len(mp.load_dataset("umls-test").train) == 5216
    assert server.requests == [("/umls.tar.gz", f"bytes={len(archive)}-")]
    for noted_url, validator in ((server.url("/elsewhere.tar.gz"), None), (url, '"an-older-file"')):
        server.requests.clear()
        (downloads / "umls.tar.gz").unlink()
        (downloads / "umls.tar.gz.part").write_bytes(b"x" * 5000)  # (bytes that are no part of this file)
        (downloads / "umls.tar.gz.part.source").write_text(json_module.dumps({"url": noted_url,
                                                                              "validator": validator}))
        with DATASETS.registered("umls-test", umls_entry(url, sha256(archive))):
            assert len(mp.load_dataset("umls-test").train) == 5216
        assert (downloads / "umls.tar.gz").read_bytes() == archive


def test_a_mismatch_leaves_an_existing_dataset_in_place(server, cache, tmp_path, capsys):
    """preprocess NAME -o DIR --overwrite replaces DIR only with a dataset that passed its checks."""
    archive = umls_archive()
    server.files["/umls.tar.gz"] = archive
    mine = tmp_path / "mine"
    wrong = Stats(nodes=135, relations=46, train=1, valid=652, test=661)
    with DATASETS.registered("umls-good", umls_entry(server.url("/umls.tar.gz"), sha256(archive))):
        assert main(["preprocess", "umls-good", "-o", str(mine), "--quiet"]) == 0
    before = sorted(p.name for p in mine.iterdir())
    with DATASETS.registered("umls-test", umls_entry(server.url("/umls.tar.gz"), sha256(archive), wrong)):
        assert main(["preprocess", "umls-test", "-o", str(mine), "--overwrite", "--quiet"]) == 2
    assert "5,216 train edges, published 1" in capsys.readouterr().err
    assert sorted(p.name for p in mine.iterdir()) == before and len(mp.load_dataset(str(mine)).train) == 5216


def test_from_a_file_of_another_name_or_content_is_refused(server, cache, tmp_path):
    archive = umls_archive()
    other = tmp_path / "other.tar.gz"
    other.write_bytes(archive)
    wrong = tmp_path / "umls.tar.gz"
    wrong.write_bytes(archive[:-10] + b"0123456789")
    with DATASETS.registered("umls-test", umls_entry(server.url("/umls.tar.gz"), sha256(archive))):
        with pytest.raises(MariusInputError, match="--from has no umls.tar.gz"):
            prepare("umls-test", progress=False, source=other)
        with pytest.raises(MariusInputError, match="has SHA-256 .* not the published"):
            prepare("umls-test", progress=False, source=wrong)
    assert server.requests == []


def test_preprocess_name_refuses_the_options_of_files_and_takes_a_seed(server, cache, tmp_path, capsys):
    archive = umls_archive()
    server.files["/umls.tar.gz"] = archive
    with DATASETS.registered("umls-test", umls_entry(server.url("/umls.tar.gz"), sha256(archive))):
        for option in (["--pairs"], ["--delimiter", ","], ["--skip-header", "1"], ["--unseen", "error"]):
            assert main(["preprocess", "umls-test", "-o", str(tmp_path / "x"), *option]) == 2
            assert f"{option[0]} apply to files" in capsys.readouterr().err
        for seed in ("1", "2"):
            assert main(["preprocess", "umls-test", "-o", str(tmp_path / f"seed{seed}"), "--seed", seed,
                         "--quiet"]) == 0
    first, second = (mp.load_dataset(str(tmp_path / f"seed{seed}")) for seed in ("1", "2"))
    assert first.metadata.seed == 1 and second.metadata.seed == 2 and first.node_names != second.node_names
