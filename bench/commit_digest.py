"""A checkpoint's digests against the disk that writes them (issue 37): CRC-32 and BLAKE2b blocks, whole files.

    python bench/commit_digest.py --nodes 20000000 --dim 100 --partitions 16 --json bench/results/commit-digest.json

Writes an embedding store (``EmbeddingStore.create``: embeddings and Adagrad state, one chunk file per
partition, fsynced) of ``--nodes`` x ``--dim`` float32 rows, drops its pages from the page cache
(``posix_fadvise(DONTNEED)``: the digests read from the disk, as after O_DIRECT partition writes), then
times a commit's write of the tables from memory (``write_all``, streamed through small staging pieces
with CRC-32 block digests computed as they pass; beside the same write hashing BLAKE2b blocks, the digests
before, and hashing nothing) and its manifest from those digests, then ``write_manifest`` reading the files back with one BLAKE2b over each whole
file (the first manifests) and with the parallel 8 MiB-block digests of each kind, each from a cold cache.
Prints GiB/s of each.
Freebase86m's store (86M nodes, d=100: 69 GB) does not fit this machine's disk; the rates are what a
commit of it would see.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from marius_py.storage import chunk_files, manifest  # noqa: E402
from marius_py.storage.embedding_store import EmbeddingStore  # noqa: E402
from marius_py.trainer import init_rows  # noqa: E402
from store_init import timed  # noqa: E402


def drop_cached_pages(root: Path) -> None:
    for path in root.rglob("*"):
        if path.is_file():
            descriptor = os.open(path, os.O_RDONLY)
            try:
                os.fsync(descriptor)
                os.posix_fadvise(descriptor, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(descriptor)


@contextlib.contextmanager
def hashing_with(key: str):
    default_key, manifest.DIGEST_KEY = manifest.DIGEST_KEY, key
    try:
        yield
    finally:
        manifest.DIGEST_KEY = default_key


class NoDigest:
    def update(self, data) -> None:
        pass

    def hexdigest(self) -> str:
        return ""


@contextlib.contextmanager
def hashing_nothing():
    """The same write, nothing hashed (what it remembers is rewritten before the manifest is timed)."""
    hashing = chunk_files.StreamDigest
    chunk_files.StreamDigest = NoDigest
    try:
        yield
    finally:
        chunk_files.StreamDigest = hashing


def store_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=20_000_000)
    parser.add_argument("--dim", type=int, default=100)
    parser.add_argument("--partitions", type=int, default=16)
    parser.add_argument("--threads", type=int, default=os.cpu_count(), help="store writer threads")
    parser.add_argument("--device", default="cpu", help="where the tables live (cuda: GPU-resident tables)")
    parser.add_argument("--repeats", type=int, default=3, help="turns of the three writes (best of each)")
    parser.add_argument("--workdir", default=None)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(dir=args.workdir, prefix="commit-digest-"))
    try:
        store = root / "store"
        write = timed(lambda: (EmbeddingStore.create(store, args.nodes, args.dim, args.dim, args.partitions,
                                                     init_rows(0, 0.001, args.dim), threads=args.threads),
                               drop_cached_pages(store)))
        size = store_bytes(store)
        rows = {"nodes": args.nodes, "dim": args.dim, "device": args.device, "partitions": args.partitions, "bytes": size,
                "cpus": os.cpu_count(), "create_seconds": write}
        opened = EmbeddingStore(store)
        tables = [table.to(args.device) for table in opened.read_tables()]  # (GPU tables: a commit's copy out)
        # The in-memory commit's write (EmbeddingStore.write_all: ChunkFiles.write, hashing from memory
        # meanwhile), then its manifest from the remembered digests. The three writes take turns, best of
        # --repeats each (the page cache's state after one write shapes the next).
        variants = {"write": lambda: hashing_with(manifest.DIGEST_KEY),
                    "write_blake2b": lambda: hashing_with("blake2b_blocks"), "write_unhashed": hashing_nothing}
        for _ in range(args.repeats):
            for name, variant in variants.items():
                with variant():
                    seconds = timed(lambda: (opened.write_all(*tables), drop_cached_pages(store)))
                rows.setdefault(f"{name}_runs_seconds", []).append(seconds)
        for name in variants:
            rows[f"{name}_seconds"] = min(rows[f"{name}_runs_seconds"])
        opened.write_all(*tables)  # (remembered digests of the files as they are now)
        drop_cached_pages(store)
        rows["remembered_seconds"] = timed(lambda: manifest.write_manifest(store))
        (store / manifest.MANIFEST_FILE).unlink()
        manifest._written.clear()  # the digests below read the files back
        for name, key in (("whole_file", manifest.WHOLE_FILE_KEY), ("blake2b_blocks", "blake2b_blocks"),
                          ("crc32_blocks", "crc32_blocks")):
            drop_cached_pages(store)
            original = manifest.file_digest
            manifest.file_digest = lambda path, key=key: original(path, key)  # write_manifest's digest
            try:
                rows[f"{name}_seconds"] = timed(lambda: manifest.write_manifest(store))
            finally:
                manifest.file_digest = original
            (store / manifest.MANIFEST_FILE).unlink()
        gib = size / 2**30
        print(f"store {gib:.1f} GiB in {args.partitions} partitions, {os.cpu_count()} CPUs")
        for name in ("create", "write", "write_blake2b", "write_unhashed", "remembered", "whole_file",
                     "blake2b_blocks", "crc32_blocks"):
            runs = rows.get(f"{name}_runs_seconds", [])
            print(f"  {name:<14} {rows[f'{name}_seconds']:7.2f} s   {gib / rows[f'{name}_seconds']:6.2f} GiB/s"
                  + (f"   (runs: {', '.join(f'{run:.2f}' for run in runs)} s)" if len(runs) > 1 else ""))
        if args.json:
            Path(args.json).write_text(json.dumps(rows, indent=1))
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
