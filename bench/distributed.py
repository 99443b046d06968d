"""Edges/s of 1, 2, 4 ... trainers under torchrun (one machine), and what a deployment needs.

    python bench/distributed.py --dataset ../shared/datasets/codex-s --trainers 1 2 4 --partitions 8 \
        --json bench/results/cpu-distributed-codex-s.json
    python bench/distributed.py --device cuda --dataset DIR --trainers 1 2 ...   # one GPU each, NCCL

Each row is one ``torchrun --nproc-per-node K -m marius_py train`` of the same
config (the distributed path also for K = 1, the baseline). From the epoch
records: edges/s of the group (edges over the slowest trainer's time), each
trainer's edges/s, partition bytes each trainer read and wrote through the
shared store, and test MRR. The projection scales the measured store passes
per epoch (partition bytes moved / store bytes) to Freebase86m's store and a
1B-edge graph's: the network (or shared file system) traffic per trainer per
epoch.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
GIB = 1 << 30
# Graphs the projection scales to: (nodes, partitions); stores of d = 100 with row-wise Adagrad state.
PROJECTED = {"freebase86m, P=16": (86_054_151, 16), "1B edges (300M nodes), P=32": (300_000_000, 32)}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(trainers: int, args, run_dir: Path) -> dict:
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(trainers),
               "--master-addr", "127.0.0.1", "--master-port", str(free_port()), "-m", "marius_py", "train",
               f"dataset.path={args.dataset}", f"training.device={args.device}", f"model.dim={args.dim}",
               f"training.epochs={args.epochs}", f"training.num_negatives={args.negatives}",
               f"storage.num_partitions={args.partitions}", "storage.buffer_capacity=2", "evaluation.every=0",
               f"distributed.partitions_per_trainer={args.per_trainer}",
               *args.set, "--run-dir", str(run_dir), "--quiet"]
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // trainers))}
    started = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{trainers} trainer(s) failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}")
    wall = time.perf_counter() - started
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    epochs = [r for r in records if r.get("event") == "epoch"][1:] or \
        [r for r in records if r.get("event") == "epoch"]  # the first epoch includes process start-up
    test = [r for r in records if r.get("split") == "test"][-1]
    store_bytes = sum(f.stat().st_size for f in (run_dir / "store").rglob("*") if f.is_file())
    moved = sum(r["io"]["bytes_read"] + r["io"]["bytes_written"] for r in epochs) / len(epochs)
    reads = sum(r["io"]["partitions_read"] for r in epochs) / len(epochs)
    return {"trainers": trainers, "partitions_per_trainer": args.per_trainer, "wall_seconds": wall, "reads_per_bucket": reads / args.partitions ** 2,
            "edges_per_s": sum(r["edges_per_s"] for r in epochs) / len(epochs),
            "per_trainer": epochs[-1]["trainers"], "test_mrr": test["mrr"], "store_bytes": store_bytes,
            "bytes_moved_per_epoch": moved, "store_passes_per_epoch": moved / store_bytes}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", required=True)
    parser.add_argument("--trainers", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--per-trainer", type=int, default=2, help="distributed.partitions_per_trainer")
    parser.add_argument("--dim", type=int, default=100)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--negatives", type=int, default=500)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="cuda: one GPU per trainer (NCCL), as many GPUs as the largest --trainers")
    parser.add_argument("--set", nargs="*", action="extend", default=[], metavar="KEY=VALUE",
                        help="more config overrides (repeatable)")
    parser.add_argument("--json", default="bench/results/cpu-distributed.json")
    parser.add_argument("--logs", help="copy each run's metrics and scheduler/trainer logs under this folder")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as work:
        for trainers in args.trainers:
            rows.append(run(trainers, args, Path(work) / f"run{trainers}"))
            if args.logs:
                keep = Path(args.logs) / f"run{trainers}"
                shutil.copytree(Path(work) / f"run{trainers}" / "distributed", keep / "distributed")
                shutil.copy(Path(work) / f"run{trainers}" / "metrics.jsonl", keep)
            r = rows[-1]
            print(f"{trainers} trainer(s): {r['edges_per_s']:10,.0f} edges/s "
                  f"({r['edges_per_s'] / rows[0]['edges_per_s']:.2f}x)  test MRR {r['test_mrr']:.4f}  "
                  f"partition IO {r['bytes_moved_per_epoch'] / 2**20:.1f} MiB/epoch "
                  f"({r['reads_per_bucket']:.2f} partition reads per bucket)", flush=True)
            for t in r["per_trainer"]:
                waits = ", ".join(f"{k.removesuffix('_seconds')} {v:.1f} s" for k, v in t["waits"].items())
                io = "O_DIRECT" if t["direct_io"] else "page cache"
                print(f"    trainer {t['rank']}: {t['buckets']} buckets in {t['seconds']:.1f} s ({io}), "
                      f"waiting: {waits}")
    print("\nprojection (partition bytes read + written per epoch, all trainers; d=100, row-wise state):")
    projection = {}
    for row in rows:
        for name, (nodes, partitions) in PROJECTED.items():
            store = nodes * 101 * 4
            per_epoch = 2 * row["reads_per_bucket"] * partitions * store
            projection[f"{name}, {row['trainers']} trainers"] = per_epoch
            print(f"  {name:30s} {row['trainers']} trainers: {per_epoch / GIB:8.0f} GiB per epoch, "
                  f"{per_epoch / row['trainers'] / GIB:8.0f} GiB per trainer")
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"date": time.strftime("%Y-%m-%d"), "command": " ".join(sys.argv),
                               "cpu_count": os.cpu_count(), "rows": rows, "projection_bytes": projection},
                              indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
