"""A seeded graph shaped like Freebase86m, written straight into a preprocessed dataset.

    python bench/freebase_shape.py --out /data/fb86m-shape --partitions 16 --workers 16

Freebase86m as Marius trains it: 86,054,151 nodes, 14,824 relations, 304,727,650 train,
16,929,318 valid and 16,929,308 test edges (the defaults; ``--scale`` shrinks all counts).

Shape: each endpoint is, with probability ``--uniform`` (0.5), a uniform node, otherwise a node of
popularity rank r drawn with probability ~ 1 / (r + 10) (Zipf: the top node has ~0.3% of the
endpoints, most nodes a handful, a few percent none); relations follow Zipf over their ranks (the top
one ~7% of the edges). Ranks map to ids through a seeded affine bijection, so popular nodes are
spread over the partitions as preprocessing's random ids spread them.

Output: the layout of ``marius-py preprocess`` (metadata.json, nodes.txt, relations.txt,
edges.h5 with train sorted by bucket for ``--partitions``), usable as ``dataset.path``. Nothing
holds the edge list: pass 1 counts each chunk's edges per bucket, pass 2 regenerates every chunk
(seeded by its index), sorts it by bucket and writes each bucket's slice to its final place in
the HDF5 file's contiguous datasets (``os.pwrite`` at the offset HDF5 allocated; workers write in
parallel). Memory: ``--workers`` x one chunk (~100 bytes an edge) + p^2 counts per chunk. The
directory appears (renamed from a hidden sibling, ``storage.durable.staged_directory``) only when complete.
An existing ``--out`` is replaced only when empty or an earlier output of this script (kept aside until
the new one is in place); anything else there is refused, never removed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import h5py
import numpy as np


from marius_py.dataset import METADATA_FILE, DatasetMetadata, write_metadata  # noqa: E402
from marius_py.errors import MariusInputError  # noqa: E402
from marius_py.storage.durable import check_replaceable, staged_directory, staging_for  # noqa: E402
from marius_py.storage.edge_store import EDGE_FILE  # noqa: E402
from marius_py.storage.partitioning import partition_size  # noqa: E402

FREEBASE86M = {"nodes": 86_054_151, "relations": 14_824, "train": 304_727_650, "valid": 16_929_318,
               "test": 16_929_308}
SPLIT_CODES = {"train": 0, "valid": 1, "test": 2}
GENERATOR = "bench/freebase_shape.py"  # metadata.json's sources.generator: an output this script may replace
NODE_OFFSET, RELATION_OFFSET = 10.0, 1.0  # Zipf ranks r are drawn with weight 1 / (r + offset)


def zipf_ranks(rng: np.random.Generator, count: int, size: int, offset: float) -> np.ndarray:
    """``count`` ranks in [0, size) with P(r) ~ 1 / (r + offset): the inverse of the continuous CDF."""
    u = rng.random(count)
    ranks = offset * np.power((size + offset) / offset, u) - offset
    return np.minimum(ranks.astype(np.int64), size - 1)


class Shape:
    """Everything an edge draw depends on; picklable, so workers rebuild chunks from (split, index)."""

    def __init__(self, args):
        self.seed, self.uniform, self.chunk = args.seed, args.uniform, args.chunk
        self.num_nodes, self.num_relations = args.nodes, args.relations
        self.num_partitions = args.partitions
        self.rows = partition_size(self.num_nodes, self.num_partitions)
        self.counts = {split: getattr(args, split) for split in SPLIT_CODES}
        rng = np.random.default_rng([self.seed, 0xB1])
        self.multiplier = _coprime(rng, self.num_nodes)
        self.shift = int(rng.integers(self.num_nodes))

    def chunks(self, split: str) -> int:
        return -(-self.counts[split] // self.chunk)

    def edges(self, split: str, index: int) -> np.ndarray:
        """Chunk ``index`` of ``split``: int64 [count, 3] (head, relation, tail)."""
        count = min(self.chunk, self.counts[split] - index * self.chunk)
        rng = np.random.default_rng([self.seed, SPLIT_CODES[split], index])
        out = np.empty((count, 3), dtype=np.int64)
        for column in (0, 2):
            ranks = zipf_ranks(rng, count, self.num_nodes, NODE_OFFSET)
            uniform = rng.random(count) < self.uniform
            ranks[uniform] = rng.integers(self.num_nodes, size=int(uniform.sum()))
            out[:, column] = (ranks * self.multiplier + self.shift) % self.num_nodes
        out[:, 1] = zipf_ranks(rng, count, self.num_relations, RELATION_OFFSET)
        return out

    def buckets(self, edges: np.ndarray) -> np.ndarray:
        return (edges[:, 0] // self.rows) * self.num_partitions + edges[:, 2] // self.rows


def _coprime(rng: np.random.Generator, n: int) -> int:
    while True:
        candidate = int(rng.integers(1, max(2, n)))
        if math.gcd(candidate, n) == 1:
            return candidate


def count_chunk(shape: Shape, index: int) -> np.ndarray:
    return np.bincount(shape.buckets(shape.edges("train", index)), minlength=shape.num_partitions ** 2)


def write_chunk(shape: Shape, split: str, index: int, path: str, data_offset: int, starts: np.ndarray | None) -> int:
    """Regenerate a chunk and write it in place: train by bucket at ``starts`` (its first row per bucket),
    valid/test in order. Returns the bytes written."""
    edges = shape.edges(split, index)
    descriptor = os.open(path, os.O_WRONLY)
    try:
        if starts is None:
            return _pwrite_all(descriptor, edges.tobytes(), data_offset + index * shape.chunk * 24)
        keys = shape.buckets(edges)
        order = np.argsort(keys, kind="stable")
        edges, keys = edges[order], keys[order]
        bounds = np.searchsorted(keys, np.arange(shape.num_partitions ** 2 + 1))
        written = 0
        for bucket in np.flatnonzero(np.diff(bounds)):
            block = edges[bounds[bucket]:bounds[bucket + 1]]
            written += _pwrite_all(descriptor, block.tobytes(), data_offset + int(starts[bucket]) * 24)
        return written
    finally:
        os.close(descriptor)


def _pwrite_all(descriptor: int, data: bytes, offset: int) -> int:
    """``os.pwrite`` until every byte is written (one call writes at most ~2 GiB on Linux)."""
    view, done = memoryview(data), 0
    while done < len(view):
        done += os.pwrite(descriptor, view[done:], offset + done)
    return done


def _contiguous_dataset(file: h5py.File, name: str, rows: int) -> int | None:
    """An int64 [rows, 3] dataset whose storage is allocated now, unfilled; its byte offset in the file."""
    dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
    dcpl.set_layout(h5py.h5d.CONTIGUOUS)
    dcpl.set_alloc_time(h5py.h5d.ALLOC_TIME_EARLY)
    dcpl.set_fill_time(h5py.h5d.FILL_TIME_NEVER)
    space = h5py.h5s.create_simple((rows, 3))
    dataset = h5py.h5d.create(file.id, name.encode(), h5py.h5t.STD_I64LE, space, dcpl=dcpl)
    return dataset.get_offset()


def _write_names(path: Path, prefix: str, count: int) -> None:
    with open(path, "w", encoding="utf-8", newline="\n") as handle:
        for start in range(0, count, 1 << 20):
            handle.write("".join(f"{prefix}{i}\n" for i in range(start, min(count, start + (1 << 20)))))


def check_output(out: Path) -> None:
    """Refuse (``MariusInputError``) an existing ``out`` that is neither empty nor an earlier output of this
    generator: only such a one is replaced (and kept aside until the new one is in place)."""
    check_replaceable(out, METADATA_FILE)  # a file, or a directory holding something but no metadata.json
    if (out / METADATA_FILE).is_file():
        try:
            generator = json.loads((out / METADATA_FILE).read_text(encoding="utf-8"))["sources"]["generator"]
        except (OSError, ValueError, KeyError, TypeError):
            generator = None
        if generator != GENERATOR:
            raise MariusInputError("output holds a dataset that bench/freebase_shape.py did not write; it is "
                                   "not replaced", path=out,
                                   expected="a new path, an empty directory or an earlier output of "
                                            "bench/freebase_shape.py")


def generate(args, log=print) -> dict:
    shape = Shape(args)
    out = Path(args.out)
    check_output(out)  # (before the work; staged_directory checks again before it replaces anything)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        staging = staging_for(out, METADATA_FILE)
        staging.mkdir()
    except OSError as error:
        raise MariusInputError(f"cannot create the output directory ({error.strerror})", path=out,
                               expected="an output path in a writable directory") from None
    timings, started = {}, time.perf_counter()
    p = shape.num_partitions
    with staged_directory(out, staging, METADATA_FILE):
        with ProcessPoolExecutor(args.workers) as pool:
            names = [pool.submit(_write_names, staging / "nodes.txt", "n", shape.num_nodes),
                     pool.submit(_write_names, staging / "relations.txt", "r", shape.num_relations)]
            per_chunk = np.stack(list(pool.map(count_chunk, [shape] * shape.chunks("train"),
                                               range(shape.chunks("train")))))
            timings["count_seconds"] = time.perf_counter() - started
            totals = per_chunk.sum(0)
            offsets = np.concatenate([[0], np.cumsum(totals)])
            starts = offsets[:-1][None, :] + np.cumsum(per_chunk, 0) - per_chunk  # [chunk, bucket] first row
            path = staging / EDGE_FILE
            with h5py.File(path, "w") as file:
                data_offsets = {split: _contiguous_dataset(file, split, shape.counts[split]) for split in SPLIT_CODES}
                file.create_dataset("train_bucket_offsets", data=offsets.astype(np.int64))
            jobs = [pool.submit(write_chunk, shape, split, index, str(path), data_offsets[split],
                                starts[index] if split == "train" else None)
                    for split in SPLIT_CODES if shape.counts[split] for index in range(shape.chunks(split))]
            written = sum(job.result() for job in jobs)
            if written != 24 * sum(shape.counts.values()):
                raise RuntimeError(f"wrote {written:,} bytes of edges, expected {24 * sum(shape.counts.values()):,}")
            for job in names:
                job.result()
        with open(path, "rb+") as handle:
            os.fsync(handle.fileno())
        timings["write_seconds"] = time.perf_counter() - started - timings["count_seconds"]
        settings = json.dumps({k: v for k, v in vars(args).items() if k not in ("out", "json", "workers")},
                              sort_keys=True)
        metadata = DatasetMetadata(num_nodes=shape.num_nodes, num_relations=shape.num_relations, num_partitions=p,
                                   num_train=shape.counts["train"], num_valid=shape.counts["valid"],
                                   num_test=shape.counts["test"], seed=args.seed,
                                   sources={"generator": GENERATOR, "settings": settings},
                                   identity={"generated": _content_digest(args)})
        write_metadata(staging, metadata)  # last: marks the directory complete
    seconds = time.perf_counter() - started
    result = {"nodes": shape.num_nodes, "relations": shape.num_relations, **shape.counts, "partitions": p,
              "workers": args.workers, "seconds": seconds, "edge_bytes_written": written, **timings,
              "largest_bucket": int(totals.max()), "smallest_bucket": int(totals.min())}
    log(f"{shape.counts['train']:,} train edges over {shape.num_nodes:,} nodes, p={p}: {seconds:.1f} s "
        f"({timings['count_seconds']:.1f} s counting, {written / 2**30:.1f} GiB of edges written)")
    return result


def _content_digest(args) -> str:
    """The dataset's identity: the generator and the settings that define its edges (the bucketing for
    ``--partitions`` orders them, so copies for other partition counts are the same dataset)."""
    settings = {k: v for k, v in vars(args).items() if k not in ("out", "json", "workers", "partitions")}
    return hashlib.sha256(f"{GENERATOR}{json.dumps(settings, sort_keys=True)}".encode()).hexdigest()


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--partitions", type=int, default=16)
    parser.add_argument("--scale", type=float, default=1.0, help="multiply every count (1.0: Freebase86m's)")
    for name, value in FREEBASE86M.items():
        parser.add_argument(f"--{name}", type=int, default=None, help=f"default {value:,} x --scale")
    parser.add_argument("--uniform", type=float, default=0.5, help="fraction of endpoints drawn uniformly")
    parser.add_argument("--chunk", type=int, default=1 << 22, help="edges per chunk (a worker's unit)")
    parser.add_argument("--workers", type=int, default=os.cpu_count())
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    for name, value in FREEBASE86M.items():
        if getattr(args, name) is None:
            setattr(args, name, max(1, round(value * args.scale)))
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1")
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    try:
        result = generate(args)
    except MariusInputError as error:
        sys.exit(f"error: {error}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
