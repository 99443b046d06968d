"""Checkpoint integrity: every committed file is checksummed; a changed byte is found and named."""

from __future__ import annotations

import hashlib
import json
import os

import numpy as np
import torch
import pytest

import marius_py as mp
from marius_py.checkpoint import RunDirectory
from marius_py.cli import main
from marius_py.storage.embedding_store import EmbeddingStore
from marius_py.storage.manifest import MANIFEST_FILE, file_digest, verify_manifest, write_manifest


def flip_byte(path, offset=0):
    data = bytearray(path.read_bytes())
    data[offset] ^= 1
    path.write_bytes(bytes(data))


def test_manifest_finds_changed_missing_and_extra_files(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "a").write_bytes(b"alpha")
    (tmp_path / "sub" / "b").write_bytes(b"beta")
    write_manifest(tmp_path)
    assert verify_manifest(tmp_path) == []
    flip_byte(tmp_path / "a")
    (tmp_path / "sub" / "b").unlink()
    (tmp_path / "c").write_bytes(b"new")
    problems = verify_manifest(tmp_path)
    assert any("/a: checksum mismatch" in p for p in problems)
    assert any("sub/b: missing" in p for p in problems)
    assert any("/c: not in the manifest" in p for p in problems)


def test_manifest_reuses_digests_of_hard_linked_files(tmp_path, monkeypatch):
    """Partitions a commit shares with the previous version by hard link are not read again."""
    old, new = tmp_path / "old", tmp_path / "new"
    old.mkdir(), new.mkdir()
    (old / "shared").write_bytes(b"unchanged partition")
    write_manifest(old)
    os.link(old / "shared", new / "shared")
    (new / "changed").write_bytes(b"rewritten partition")
    read = []
    monkeypatch.setattr("marius_py.storage.manifest.file_digest", lambda path: read.append(path.name) or file_digest(path))
    write_manifest(new, previous=old)
    assert read == ["changed"]
    monkeypatch.undo()
    assert verify_manifest(new) == []


def test_block_digests_find_a_change_in_any_block_and_keep_their_order(tmp_path, monkeypatch):
    """Blocks are hashed in parallel; the file's digest depends on every block, in order."""
    monkeypatch.setattr("marius_py.storage.manifest.BLOCK_BYTES", 1000)
    data = os.urandom(4500)  # five blocks, the last one short
    (tmp_path / "table").write_bytes(data)
    write_manifest(tmp_path)
    entry = json.loads((tmp_path / MANIFEST_FILE).read_text())["files"]["table"]
    assert set(entry) == {"bytes", "crc32_blocks"} and verify_manifest(tmp_path) == []
    flip_byte(tmp_path / "table", 3999)  # the fourth block
    assert any("checksum mismatch" in p for p in verify_manifest(tmp_path))
    swapped = data[1000:2000] + data[:1000] + data[2000:]  # same blocks, another order
    (tmp_path / "table").write_bytes(swapped)
    assert any("checksum mismatch" in p for p in verify_manifest(tmp_path))


def test_files_the_store_writes_are_hashed_from_memory_not_read_back(tmp_path, monkeypatch):
    monkeypatch.setattr("marius_py.storage.manifest.BLOCK_BYTES", 4096)  # several blocks, hashed on the pool
    store = EmbeddingStore.create(tmp_path / "store", 1000, 8, 8, 2)
    rows = np.random.default_rng(0).standard_normal((1000, 8)).astype(np.float32)
    store.write_all(rows, rows)
    read = []
    monkeypatch.setattr("marius_py.storage.manifest.file_digest", lambda path: read.append(path) or file_digest(path))
    write_manifest(tmp_path / "store")
    written = [p for p in (tmp_path / "store").rglob("*") if p.is_file() and p.name not in ("zarr.json", MANIFEST_FILE)]
    assert len(written) == 4 and not set(written) & set(read)  # (zarr's metadata files are read)
    monkeypatch.setattr("marius_py.storage.manifest.file_digest", file_digest)  # (the 4 KiB blocks stay)
    assert verify_manifest(tmp_path / "store") == []  # the digests from memory are those of the bytes on disk
    flip_byte(written[0], 5)  # a later change of a file is not covered by what was remembered
    write_manifest(tmp_path / "store")
    assert verify_manifest(tmp_path / "store") == []
    entry = json.loads((tmp_path / "store" / MANIFEST_FILE).read_text())["files"]
    assert entry[written[0].relative_to(tmp_path / "store").as_posix()]["crc32_blocks"] == file_digest(written[0])


@pytest.mark.parametrize("key", ["crc32_blocks", "blake2b_blocks"])
def test_a_digest_streamed_in_pieces_of_any_size_is_the_files(tmp_path, monkeypatch, key):
    """Pieces that end inside a block, on its edge, or span several blocks hash as the whole file does."""
    from marius_py.storage import manifest
    monkeypatch.setattr(manifest, "BLOCK_BYTES", 1000)
    monkeypatch.setattr(manifest, "DIGEST_KEY", key)
    for size in (0, 1000, 4321):
        data = os.urandom(size)
        (tmp_path / "table").write_bytes(data)
        stream, start = manifest.StreamDigest(), 0
        for piece in (999, 1, 1000, 2500, 17, 10_000):
            stream.update(data[start:start + piece])
            start += piece
        assert stream.hexdigest() == file_digest(tmp_path / "table", key)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_a_commit_streams_gpu_or_host_tables_and_remembers_their_digests(tmp_path, monkeypatch, device):
    """write_all takes the tables where they are (no copy of them), in pieces smaller than a partition: first
    into new files, then over the files in place (only the live store links them)."""
    from marius_py.storage import embedding_store, manifest
    monkeypatch.setattr(embedding_store, "WRITE_PIECE_BYTES", 1)  # one page's rows a piece (128 of 8 floats)
    monkeypatch.setattr(manifest, "BLOCK_BYTES", 4096)
    store = EmbeddingStore.create(tmp_path / "store", 1000, 8, 8, 3)
    files = [p for p in (tmp_path / "store").rglob("*") if p.is_file() and p.name != "zarr.json"]
    for scale in (1.0, -2.0):
        nodes = torch.randn(1000, 8, device=device) * scale
        store.write_all(nodes, nodes.abs())
        back = store.read_tables()
        assert torch.equal(back[0], nodes.cpu()) and torch.equal(back[1], nodes.abs().cpu())
        files = [p for p in (tmp_path / "store").rglob("*") if p.is_file() and p.name != "zarr.json"]
        assert len(files) == 6 and all(os.stat(p).st_nlink == 1 for p in files)
        for path in files:
            assert manifest._remembered(os.stat(path)) == file_digest(path)


def test_a_failed_streamed_write_names_the_file_and_leaves_nothing_remembered(tmp_path, monkeypatch):
    """A commit's write that fails (its rows, or the disk) leaves no temporary file and no remembered digest:
    the next manifest reads whatever the file holds."""
    from marius_py.storage import chunk_files, manifest
    monkeypatch.setattr(manifest, "BLOCK_BYTES", 4096)
    store = EmbeddingStore.create(tmp_path / "store", 1000, 8, 8, 1)
    embeddings, _ = store.chunk_files()
    rows = np.ones((1000, 8), dtype=np.float32)
    embeddings.write_generated(0, lambda first, last: rows[first:last], 128, for_commit=True)
    path = embeddings.chunk_path(0)
    assert manifest._remembered(os.stat(path)) == file_digest(path)

    def rows_failing(first, last):
        if first >= 256:
            raise RuntimeError("rows unavailable")
        return rows[first:last]
    with pytest.raises(RuntimeError, match="rows unavailable"):
        embeddings.write_generated(0, rows_failing, 128, for_commit=True)
    assert manifest._remembered(os.stat(path)) is None
    os.link(path, tmp_path / "snapshot")  # linked: the next write goes to a new file renamed over it

    def disk_full(descriptor, view, offset):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(chunk_files, "_pwrite_all", disk_full)
    with pytest.raises(OSError, match=f"No space left on device: '{path}'"):
        embeddings.write_generated(0, lambda first, last: rows[first:last], 128, for_commit=True)
    assert manifest._remembered(os.stat(path)) is None
    assert not [p for p in path.parent.iterdir() if p.name.endswith(".tmp")]


def test_only_writes_a_commit_follows_are_hashed_from_memory(tmp_path):
    """A write-back in the middle of an epoch is not hashed (the epoch would wait for it); the manifest reads
    that file instead."""
    from marius_py.storage import manifest
    store = EmbeddingStore.create(tmp_path / "store", 1000, 8, 8, 2)
    embeddings, _ = store.chunk_files()
    rows = np.ones((embeddings.rows_per_chunk, 8), dtype=np.float32)
    embeddings.write(0, rows, for_commit=False)
    embeddings.write(1, rows)
    assert manifest._remembered(os.stat(embeddings.chunk_path(0))) is None
    assert manifest._remembered(os.stat(embeddings.chunk_path(1))) == file_digest(embeddings.chunk_path(1))


def test_a_write_no_commit_follows_forgets_the_digest_remembered_for_the_old_bytes(tmp_path):
    """Even where the file's size and time stamp would not tell (a coarse clock): the manifest then reads it."""
    from marius_py.storage import manifest
    store = EmbeddingStore.create(tmp_path / "store", 1000, 8, 8, 2)
    embeddings, _ = store.chunk_files()
    rows = np.ones((embeddings.rows_per_chunk, 8), dtype=np.float32)
    path = embeddings.chunk_path(1)
    embeddings.write(1, rows)
    stamped = os.stat(path)
    embeddings.write(1, rows * 2, for_commit=False)
    os.utime(path, ns=(stamped.st_atime_ns, stamped.st_mtime_ns))
    assert os.stat(path).st_ino == stamped.st_ino  # (overwritten in place)
    assert manifest._remembered(os.stat(path)) is None


def test_hashing_while_writing_never_waits_on_its_own_pool(tmp_path, monkeypatch):
    """With as many writes as pool threads (here one), a pool thread that waited for blocks queued behind it
    would hang the writer for good."""
    from concurrent.futures import ThreadPoolExecutor
    import threading
    from marius_py.storage import manifest
    pool = ThreadPoolExecutor(1)
    monkeypatch.setattr(manifest, "_pool", lambda: pool)
    monkeypatch.setattr(manifest, "BLOCK_BYTES", 4096)
    data = os.urandom(5 * 4096)
    path = tmp_path / "chunk"
    writers = [threading.Thread(target=manifest.digest_while_writing,
                                args=(data, path, lambda: path.write_bytes(data)), daemon=True) for _ in range(2)]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join(timeout=20)
    assert not any(writer.is_alive() for writer in writers), "the digest pool deadlocked"
    assert manifest._remembered(os.stat(path)) == file_digest(path)
    pool.shutdown()


def test_blake2b_block_digests_of_earlier_manifests_still_verify(tmp_path, monkeypatch):
    """Manifests written before CRC32C blocks (BLAKE2b of each block) verify, and find a change."""
    monkeypatch.setattr("marius_py.storage.manifest.BLOCK_BYTES", 1000)
    data = os.urandom(2500)
    (tmp_path / "table").write_bytes(data)
    blocks = b"".join(hashlib.blake2b(data[start:start + 1000], digest_size=16).digest() for start in (0, 1000, 2000))
    digest = hashlib.blake2b(blocks, digest_size=16).hexdigest()
    (tmp_path / MANIFEST_FILE).write_text(json.dumps({"files": {"table": {"bytes": 2500, "blake2b_blocks": digest}}}))
    assert verify_manifest(tmp_path) == []
    flip_byte(tmp_path / "table", 2400)
    assert any("checksum mismatch" in p for p in verify_manifest(tmp_path))


def test_whole_file_digests_of_earlier_manifests_still_verify(tmp_path):
    (tmp_path / "table").write_bytes(b"partition rows")
    whole = hashlib.blake2b(b"partition rows", digest_size=16).hexdigest()
    (tmp_path / MANIFEST_FILE).write_text(json.dumps({"files": {"table": {"bytes": 14, "blake2b": whole}}}))
    assert verify_manifest(tmp_path) == []
    flip_byte(tmp_path / "table")
    assert any("checksum mismatch" in p for p in verify_manifest(tmp_path))


@pytest.fixture
def run(small_config, tmp_path):
    mp.train(small_config("training.epochs=2"), tmp_path / "run", progress=False)
    return tmp_path / "run"


def test_committed_versions_carry_manifests_and_verify(run, capsys):
    for version in RunDirectory(run).committed_versions():
        assert (version / MANIFEST_FILE).exists() and verify_manifest(version) == []
    assert main(["verify", str(run)]) == 0
    assert "intact" in capsys.readouterr().out


def test_a_flipped_byte_is_named_on_load_and_by_verify(run, capsys):
    version = RunDirectory(run).latest_version()
    chunk = next(p for p in sorted((version / "nodes").rglob("*")) if p.is_file() and p.stat().st_size > 100)
    flip_byte(chunk, 50)
    with pytest.raises(mp.MariusInputError, match="checkpoint is corrupt") as caught:
        mp.load_checkpoint(run, device="cpu")
    assert str(chunk) in str(caught.value)
    assert main(["verify", str(run)]) == 2
    captured = capsys.readouterr()
    assert f"{chunk}: checksum mismatch" in captured.out and "differ from their manifest" in captured.err
    assert main(["train", "--resume", str(run), "training.epochs=3", "--quiet"]) == 2  # never trains on it



def test_versions_of_a_partitioned_run_stay_intact_while_the_live_store_is_overwritten(small_config, tmp_path,
                                                                                       monkeypatch):
    """Write-backs overwrite the live store's unlinked chunk files in place and replace the ones a version
    links: after every commit (between buffer states and at epoch ends), the versions kept (latest, and a
    best from an earlier epoch) still verify."""
    from pathlib import Path

    from marius_py.preprocess import PreprocessOptions, preprocess
    from marius_py.checkpointer import Checkpointer
    raw = Path(__file__).parent / "data" / "umls"
    dataset = tmp_path / "umls-p4"
    preprocess(dataset, raw / "train.txt", raw / "valid.txt", raw / "test.txt",
               PreprocessOptions(num_partitions=4), progress=False)
    original, checked = Checkpointer._write_version, []

    def commit_then_verify(self, *args, **kwargs):  # (every commit, behind training or not)
        version = original(self, *args, **kwargs)
        for version in self.run.committed_versions():
            assert verify_manifest(version) == [], version.name
            checked.append(version.name)
        return version
    monkeypatch.setattr(Checkpointer, "_write_version", commit_then_verify)
    config = small_config(f"dataset.path={dataset}", "storage.num_partitions=4", "storage.buffer_capacity=2",
                          "storage.ordering=beta", "training.epochs=4", "training.checkpoint_interval=1e-9")
    mp.train(config, tmp_path / "run", progress=False)
    assert any(".s" in name for name in checked) and len(set(checked)) > 8  # mid-epoch and epoch versions
