"""Creating an embedding store: raw chunk files on threads against zarr's array writes (issue 13).

    python bench/store_init.py --nodes 2000000 --dim 100 --partitions 8 --json bench/results/cpu-store-init.json

Times ``EmbeddingStore.create`` with the seeded initial rows for each thread count, and the same rows
written through zarr's array assignment (the previous method), in the same run. Prints GiB/s.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from pathlib import Path


from marius_py.trainer import init_rows  # noqa: E402
from marius_py.storage.embedding_store import EmbeddingStore  # noqa: E402


def timed(work) -> float:
    started = time.perf_counter()
    work()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=2_000_000)
    parser.add_argument("--dim", type=int, default=100)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--workdir", default=None)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    init = init_rows(0, 0.001, args.dim)
    gib = args.nodes * args.dim * 4 / 2**30
    rows = []
    with tempfile.TemporaryDirectory(dir=args.workdir) as work:
        path = Path(work) / "store"

        def through_zarr():
            store = EmbeddingStore.create(path, args.nodes, args.dim, 1, args.partitions)
            for part in range(args.partitions):
                start, end = store.bounds(part)
                store.embeddings[start:end] = init(start, end)
        methods = [("zarr array writes", through_zarr)] + [
            (f"chunk files, {t} thread{'s' if t > 1 else ''}",
             lambda t=t: EmbeddingStore.create(path, args.nodes, args.dim, 1, args.partitions, init=init, threads=t))
            for t in args.threads]
        for name, work_fn in methods:
            shutil.rmtree(path, ignore_errors=True)
            seconds = timed(work_fn)
            rows.append({"method": name, "seconds": seconds, "gib_per_s": gib / seconds})
            print(f"{name:24s} {seconds:7.2f} s  {gib / seconds:6.2f} GiB/s", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"cpus": os.cpu_count(), "nodes": args.nodes, "dim": args.dim,
                                               "partitions": args.partitions, "gib": gib, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
