"""Link-prediction quality and speed of shipped configs on real datasets.

Trains each (dataset, config, overrides) combination, evaluates the
best-validation checkpoint on test, prints a table and writes JSON.

    python bench/quality.py --runs codex-s:codex-s fb15k-237:fb15k-237 \
        --datasets-root ../shared/datasets --out bench/results/quality.json \
        --set model.reg_weight=0.01,0.05 --set training.epochs=40

``--runs DATASET:CONFIG``: DATASET is a folder under --datasets-root (raw
train/valid/test.txt, preprocessed into the cache on first use), CONFIG a
bundled config name or YAML path. ``--set key=v1,v2`` sweeps values
(cartesian product over all --set options).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import torch

import marius_py as mp
from marius_py.checkpoint import RunDirectory
from marius_py.devices import gpus_overrides


def sweep(settings: list[str]) -> list[list[str]]:
    axes = []
    for item in settings:
        key, values = item.split("=", 1)
        axes.append([f"{key}={v}" for v in values.split(",")])
    return [list(combo) for combo in itertools.product(*axes)] if axes else [[]]


def machine() -> str:
    if torch.cuda.is_available():
        return f"{torch.cuda.get_device_name(0)}, {os.cpu_count()} CPU cores"
    return f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} torch threads"


def run_one(dataset: Path, config_name: str, overrides: list[str], workdir: Path, inspect=None) -> dict:
    """Trains one run and returns its figures; ``inspect(model)``'s dict joins them."""
    config = mp.make_config(config_name, [f"dataset.path={dataset}"] + overrides)
    run_dir = Path(tempfile.mkdtemp(dir=workdir))
    mp.api.open_dataset(config, progress=False).close()  # preprocessing outside the timer
    started = time.perf_counter()
    model = mp.train(config, run_dir, progress=False)
    seconds = time.perf_counter() - started
    records = RunDirectory(run_dir).read_metrics()
    epochs = [r for r in records if r.get("event") == "epoch"]
    valid = [r for r in records if r.get("event") == "eval" and r.get("split") == "valid"]
    best_valid = max(valid, key=lambda r: r["mrr"]) if valid else None
    train_seconds = sum(r["seconds"] for r in epochs)
    edges = sum(r["edges_per_s"] * r["seconds"] for r in epochs)
    io = {key: sum(r["io"].get(key, 0) for r in epochs) for key in epochs[0]["io"]} if "io" in epochs[0] else None
    return {"dataset": dataset.name, "config": config_name, "overrides": overrides,
            "num_nodes": model.dataset.num_nodes,
            "test": model.test_metrics,
            "best_valid": {"epoch": best_valid["epoch"], "mrr": best_valid["mrr"]} if best_valid else None,
            "wall_seconds": seconds, "train_seconds": train_seconds,
            "edges_per_s": edges / max(train_seconds, 1e-9), "device": config.training.device, "io": io,
            "folded_commits": [r["epoch"] for r in epochs if r.get("commit_folded")],  # (commits behind training)
            "resolved_config": mp.api.load_run_config(run_dir).to_dict(),  # (as it trained: the plan's store pinned)
            **(inspect(model) if inspect else {})}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", nargs="+", required=True, help="DATASET:CONFIG pairs")
    parser.add_argument("--datasets-root", default="../shared/datasets")
    parser.add_argument("--set", action="append", default=[], help="key=v1,v2 (sweep)")
    parser.add_argument("--gpus", nargs="+", type=int, default=[],
                        help="GPU counts to sweep (as marius-py train --gpus N); default: the config's devices")
    parser.add_argument("--out", default="bench/results/quality.json")
    args = parser.parse_args()
    results = []
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as workdir:
        for spec in args.runs:
            dataset_name, config_name = spec.split(":", 1)
            for overrides in [[*gpus, *swept] for gpus in [gpus_overrides(n) for n in args.gpus] or [[]] for swept in sweep(args.set)]:
                result = run_one(Path(args.datasets_root) / dataset_name, config_name, overrides,
                                 Path(workdir))
                results.append(result)
                write_results(out, results)  # after every run: a sweep cut short keeps what finished
                t, v = result["test"], result["best_valid"]
                print(f"{dataset_name:10s} {config_name:12s} {' '.join(overrides):50s} "
                      f"valid {v['mrr'] if v else float('nan'):.4f} MRR {t['mrr']:.4f} H@1 {t['hits@1']:.3f} H@10 {t['hits@10']:.3f} "
                      f"train {result['train_seconds']:7.1f}s wall {result['wall_seconds']:7.1f}s "
                      f"{result['edges_per_s']:12,.0f} edges/s", flush=True)
    print(f"wrote {out}")


def write_results(out: Path, results: list[dict]) -> None:
    payload = {"machine": machine(), "date": time.strftime("%Y-%m-%d"), "command": " ".join(sys.argv),
               "results": results}
    out.write_text(json.dumps(payload, indent=2))


if __name__ == "__main__":
    main()
