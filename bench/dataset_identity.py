"""What knowing a dataset by its content costs: opening a run's dataset with its identity checks, against the
opening of the same files without them, and the one-time costs (the digests at preprocessing, a dataset from
before identities computing its own).

    python bench/dataset_identity.py --raw ../shared/datasets/fb15k-237 --json bench/results/dataset-identity/fb15k-237.json

Rows (median of ``--repeats`` runs, each in this process with the page cache warm, as a second command finds
it):
  open without checks    metadata.json read and edges.h5 opened: what opening cost before identities
  open, raw directory    ``api.open_dataset`` of a config naming the raw directory: the raw files' content key
                         (``dataset_cache.raw_content_key``), the cache hit, and ``Dataset`` (names files checked)
  open, preprocessed     ``Dataset`` of the preprocessed directory (names files checked)
  identity, once         ``identity.compute_identity``: what preprocessing adds, and what a dataset from before
                         identities pays on its first open
Per epoch nothing changes: the checks run when a dataset or a checkpoint is opened.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

from marius_py.bundled import resolve_dataset
from marius_py.dataset import Dataset, read_metadata
from marius_py.identity import compute_identity
from marius_py.storage.edge_store import EDGE_FILE, EdgeStore


def median_seconds(action, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        action()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def open_without_checks(directory: Path) -> None:
    read_metadata(directory)
    EdgeStore(directory / EDGE_FILE).close()


def open_checked(path: Path) -> None:
    Dataset(resolve_dataset(str(path), progress=False)).close()


def identity_once(directory: Path) -> None:
    with EdgeStore(directory / EDGE_FILE) as edges:
        compute_identity(directory, edges)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--raw", required=True, help="a directory of train/valid/test.txt")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)
    raw = Path(args.raw).resolve()
    with tempfile.TemporaryDirectory() as cache:
        os.environ["MARIUS_PY_CACHE"] = cache
        start = time.perf_counter()
        preprocessed = resolve_dataset(str(raw), progress=False)
        preprocess_seconds = time.perf_counter() - start
        rows = {"open without checks": median_seconds(lambda: open_without_checks(preprocessed), args.repeats),
                "open, raw directory": median_seconds(lambda: open_checked(raw), args.repeats),
                "open, preprocessed": median_seconds(lambda: open_checked(preprocessed), args.repeats),
                "identity, once": median_seconds(lambda: identity_once(preprocessed), args.repeats)}
        metadata = read_metadata(preprocessed)
    added = rows["open, raw directory"] - rows["open without checks"]
    print(f"{raw.name}: {metadata.num_nodes:,} nodes, {metadata.num_train + metadata.num_valid + metadata.num_test:,} "
          f"edges; preprocessing (identity included) {preprocess_seconds:.2f} s")
    print(f"{'step':<24}{'seconds':>10}")
    for name, seconds in rows.items():
        print(f"{name:<24}{seconds:>10.3f}")
    print(f"{'added by the checks':<24}{added:>10.3f}  (raw directory against no checks)")
    if args.json:
        result = {"dataset": raw.name, "command": " ".join(["python", *sys.argv]), "cpus": os.cpu_count(),
                  "machine": platform.machine(), "date": time.strftime("%Y-%m-%d"), "repeats": args.repeats,
                  "num_nodes": metadata.num_nodes, "preprocess_seconds": preprocess_seconds,
                  "seconds": rows, "added_seconds": added}
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
