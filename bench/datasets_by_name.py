"""Datasets by name, measured (issue 54): a registered dataset from one command, and OGB's layout against TSV.

    python bench/datasets_by_name.py --fb15k-237-archive FB15k-237.tar.gz --ogb-edges 10000000 \
        --json bench/results/datasets/cpu.json

``--fb15k-237-archive``: the bytes of FB15k-237's upstream archive (ConvE's ``FB15k-237.tar.gz``, the one the
registry names; this script never fetches it) served from a loopback HTTP server as ``$MARIUS_PY_MIRROR``,
with an empty cache. ``marius-py train fb15k-237`` (one small epoch: ``--train-overrides``) then fetches,
checks, prepares and trains in one command; a second run of the same command finds the prepared copy, and
its start-up record's ``dataset`` phase is what reusing it cost.

``--ogb-edges N``: a synthetic graph of N train edges written twice, as a zip in ogbl-wikikg2's layout
(``split/time/*.pt``, 500 given negatives per valid and test edge) and as TSV files of the same names; each
is prepared in a fresh process (the zip through the registry from a local copy, the TSV by ``preprocess``),
whose wall time and peak RSS are reported.
"""

from __future__ import annotations

import argparse
import gzip
import http.server
import io
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
from datetime import date
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
OGB_NEGATIVES = 500


class _QuietFiles(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


def serve(directory: Path) -> tuple[http.server.ThreadingHTTPServer, str]:
    handler = lambda *args: _QuietFiles(*args, directory=str(directory))  # noqa: E731
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


def run_train(environment: dict, run_dir: Path, overrides: list[str]) -> dict:
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "marius_py", "train", "fb15k-237", "--quiet", "--run-dir",
                           str(run_dir), *overrides], env=environment, capture_output=True, text=True)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"marius-py train failed:\n{done.stderr[-3000:]}")
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    startup = next(r for r in records if r["event"] == "startup")
    epoch = next(r for r in records if r["event"] == "epoch")
    return {"wall_seconds": wall, "dataset_seconds": startup["phases"].get("dataset"),
            "seconds_to_first_batch": startup["seconds_to_first_batch"], "epoch_seconds": epoch["seconds"],
            "stderr_tail": done.stderr[-400:]}


def fb15k_237_from_one_command(archive: Path, overrides: list[str]) -> dict:
    with tempfile.TemporaryDirectory() as work:
        work = Path(work)
        (work / "mirror" / "fb15k-237").mkdir(parents=True)
        (work / "mirror" / "fb15k-237" / "FB15k-237.tar.gz").write_bytes(archive.read_bytes())
        server, url = serve(work / "mirror")
        environment = dict(os.environ, MARIUS_PY_CACHE=str(work / "cache"), MARIUS_PY_MIRROR=url)
        environment.pop("MARIUS_PY_OFFLINE", None)
        try:
            first = run_train(environment, work / "run1", overrides)
            second = run_train(environment, work / "run2", overrides)
        finally:
            server.shutdown()
    return {"archive_bytes": archive.stat().st_size, "overrides": overrides, "first": first, "second": second}


# ---- OGB's layout against TSV

def synthetic_ogb(directory: Path, edges: int, seed: int = 0) -> dict:
    """A zip in ogbl-wikikg2's layout and TSV files of the same names; the counts."""
    rng = np.random.default_rng(seed)
    nodes, relations, held_out = max(1000, edges // 10), 500, max(100, edges // 1000)
    splits = {"train": edges, "valid": held_out, "test": held_out}
    arrays = {}
    for split, count in splits.items():
        arrays[split] = {"head": rng.integers(nodes, size=count), "relation": rng.integers(relations, size=count),
                         "tail": rng.integers(nodes, size=count)}
        if split != "train":
            arrays[split]["head_neg"] = rng.integers(nodes, size=(count, OGB_NEGATIVES))
            arrays[split]["tail_neg"] = rng.integers(nodes, size=(count, OGB_NEGATIVES))
    import torch
    with zipfile.ZipFile(directory / "wikikg-v2.zip", "w") as archive:
        for split, values in arrays.items():
            buffer = io.BytesIO()
            torch.save(values, buffer)
            archive.writestr(f"wikikg-v2/split/time/{split}.pt", buffer.getvalue())
        archive.writestr("wikikg-v2/raw/num-node-list.csv.gz", gzip.compress(f"{nodes}\n".encode()))
    for split, values in arrays.items():
        with open(directory / f"{split}.tsv", "w") as out:
            for start in range(0, len(values["head"]), 1 << 20):
                block = np.stack([values[k][start:start + (1 << 20)] for k in ("head", "relation", "tail")], 1)
                np.savetxt(out, block, fmt="%d", delimiter="\t")
    return {"nodes": nodes, "relations": relations, **splits}


def child_ogb(directory: Path, counts: dict) -> None:
    from marius_py.catalog import DATASETS, DatasetSource, Download, Stats
    from marius_py.ogb import OgbLayout
    from marius_py.registered_data import prepare
    entry = DatasetSource(
        task="link_prediction", downloads=(Download("http://127.0.0.1:9/wikikg-v2.zip"),),
        splits={s: f"wikikg-v2.zip!wikikg-v2/split/time/{s}.pt" for s in ("train", "valid", "test")},
        ogb=OgbLayout(num_nodes="wikikg-v2.zip!wikikg-v2/raw/num-node-list.csv.gz"),
        stats=Stats(train=counts["train"], valid=counts["valid"], test=counts["test"]), license="synthetic")
    DATASETS.register("ogb-bench", entry)
    started = time.perf_counter()
    prepare("ogb-bench", progress=False, offline=True, source=directory)
    report(time.perf_counter() - started)


def child_tsv(directory: Path) -> None:
    from marius_py.preprocess import PreprocessOptions, preprocess
    started = time.perf_counter()
    preprocess(directory / "tsv-dataset", *(directory / f"{s}.tsv" for s in ("train", "valid", "test")),
               PreprocessOptions(), progress=False)
    report(time.perf_counter() - started)


def report(seconds: float) -> None:
    print(json.dumps({"seconds": seconds, "peak_rss_bytes": peak_rss()}))


def peak_rss() -> int:
    """This process's peak RSS since its exec (VmHWM): getrusage's ru_maxrss survives an exec, so a child
    would report its parent's peak when that was higher."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def in_child(kind: str, directory: Path, counts: dict, cache: Path) -> dict:
    environment = dict(os.environ, MARIUS_PY_CACHE=str(cache))
    done = subprocess.run([sys.executable, __file__, "--child", kind, "--child-dir", str(directory),
                           "--child-counts", json.dumps(counts)], env=environment, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{kind} preparation failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def ogb_against_tsv(edges: int) -> dict:
    with tempfile.TemporaryDirectory() as work:
        work = Path(work)
        started = time.perf_counter()
        counts = synthetic_ogb(work, edges)
        written = time.perf_counter() - started
        tsv = in_child("tsv", work, counts, work / "cache")
        ogb = in_child("ogb", work, counts, work / "cache")
    return {"counts": counts, "negatives_per_edge": OGB_NEGATIVES, "write_seconds": written, "tsv": tsv,
            "ogb": ogb, "ogb_over_tsv": ogb["seconds"] / tsv["seconds"]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fb15k-237-archive", type=Path)
    parser.add_argument("--train-overrides", nargs="*", default=[
        "model.dim=32", "training.epochs=1", "training.num_negatives=100", "training.device=cpu",
        "evaluation.every=0", "evaluation.protocol=sampled", "training.relation_prediction=0"])
    parser.add_argument("--ogb-edges", type=int)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--child", choices=("ogb", "tsv"), help=argparse.SUPPRESS)
    parser.add_argument("--child-dir", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--child-counts", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child == "ogb":
        child_ogb(args.child_dir, json.loads(args.child_counts))
        return 0
    if args.child == "tsv":
        child_tsv(args.child_dir)
        return 0
    result = {"date": date.today().isoformat(), "machine": platform.node(), "cpus": os.cpu_count(),
              "command": "python " + " ".join([str(Path(__file__).relative_to(REPO)), *(argv or sys.argv[1:])])}
    if args.fb15k_237_archive:
        one = result["fb15k_237"] = fb15k_237_from_one_command(args.fb15k_237_archive, args.train_overrides)
        first, second = one["first"], one["second"]
        print(f"fb15k-237, one command: {first['wall_seconds']:.1f} s to the end of its first epoch (dataset "
              f"{first['dataset_seconds']:.1f} s); again: dataset {second['dataset_seconds']:.2f} s, "
              f"{second['wall_seconds']:.1f} s in all")
    if args.ogb_edges:
        ogb = result["ogb_against_tsv"] = ogb_against_tsv(args.ogb_edges)
        print(f"{args.ogb_edges:,} edges: OGB's layout {ogb['ogb']['seconds']:.1f} s, peak RSS "
              f"{ogb['ogb']['peak_rss_bytes'] / 2**30:.2f} GiB; TSV {ogb['tsv']['seconds']:.1f} s, peak RSS "
              f"{ogb['tsv']['peak_rss_bytes'] / 2**30:.2f} GiB; ratio {ogb['ogb_over_tsv']:.2f}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
