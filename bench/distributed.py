"""Edges/s of 1, 2, 4 ... torchrun trainers on this machine, the partitions they hand over against the
scheduler's plan, and what trainers on several machines need of their network.

    python bench/distributed.py --dataset ../shared/datasets/codex-s --trainers 1 2 4 --partitions 8 \
        --json bench/results/cpu-distributed-handover.json
    python bench/distributed.py --device cuda --dataset DIR --trainers 1 2 4 --partitions 16 \
        --json bench/results/gpu-distributed-handover.json     # one GPU per trainer (NCCL), 4 GPUs
    python bench/distributed.py --project-only                  # the projection alone

Measured, per row: one ``torchrun --nproc-per-node K -m marius_py train`` of the same config (the
distributed path also for K = 1, the baseline): the group's edges/s (edges over the slowest trainer's
time), each trainer's edges/s and idle seconds (waiting for grants, hand-overs, write-backs, the
others), the partition bytes handed over per epoch over torch.distributed, and the bytes the scheduler's
grants imply (``scheduler.jsonl``: each read from another trainer is one partition): the two must be
equal. Epochs after the first (start-up) are averaged.

Projected: Freebase86m and a 1B-edge graph on N machines, one trainer per GPU, the scheduler's grants
played out in simulated time (``orderings.grant_simulation``; partitions of random nodes, so buckets of
equal expected size): the partitions a trainer receives from trainers on other machines per epoch, times
a partition's bytes (d = 100, row-wise Adagrad, float32), are its bytes over the network per epoch; over
the epoch's time at ``--edges-per-second`` per trainer (with ``--device cuda``: this run's one-trainer
figure), the network rate it needs for hand-overs to keep pace with training. Evaluation adds one gather
of the partitions held elsewhere to the leader per validation (not counted).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from marius_py.orderings.grant_simulation import simulate_epoch


GIB = 1 << 30
ROW_BYTES = (100 + 1) * 4  # d = 100 float32 and one row-wise Adagrad sum
# Graphs projected: (nodes, train edges, partitions). Freebase86m: Marius' split (304.7M of 338.6M edges).
PROJECTED = {"freebase86m": (86_054_151, 304_727_650, 16), "1B edges": (300_000_000, 1_000_000_000, 32)}
ISSUE_41_ONE_H200 = 14.2e6  # edges/s of one torchrun trainer on one H200, the 4M-node graph (issue 41, 2026-11-27)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(trainers: int, args, run_dir: Path) -> dict:
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(trainers),
               "--master-addr", "127.0.0.1", "--master-port", str(free_port()), "-m", "marius_py", "train",
               f"dataset.path={args.dataset}", f"training.device={args.device}", f"model.dim={args.dim}",
               f"training.epochs={args.epochs}", f"training.num_negatives={args.negatives}",
               f"storage.num_partitions={args.partitions}", "evaluation.every=0",
               f"distributed.partitions_per_trainer={args.per_trainer}",
               *args.set, "--run-dir", str(run_dir), "--quiet"]
    env = {**os.environ, "OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // trainers))}
    started = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{trainers} trainer(s) failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}")
    wall = time.perf_counter() - started
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    all_epochs = [r for r in records if r.get("event") == "epoch"]
    epochs = all_epochs[1:] or all_epochs  # the first epoch includes process start-up
    planned = planned_bytes(run_dir, partition_bytes(run_dir))
    handed = [r["handed_over_bytes"] for r in all_epochs]
    test = [r for r in records if r.get("split") == "test"][-1]
    return {"trainers": trainers, "partitions": args.partitions, "wall_seconds": wall,
            "partitions_per_trainer": all_epochs[0]["partitions_per_trainer"],
            "edges_per_s": mean(r["edges_per_s"] for r in epochs),
            "handed_over_bytes_per_epoch": handed, "planned_bytes_per_epoch": planned,
            "handed_over_as_planned": handed == planned,
            "idle_share": mean(t["idle_seconds"] / t["seconds"] for r in epochs for t in r["trainers"]),
            "per_trainer": epochs[-1]["trainers"], "test_mrr": test["mrr"],
            "partition_bytes": partition_bytes(run_dir)}


def mean(values) -> float:
    values = list(values)
    return sum(values) / len(values)


def partition_bytes(run_dir: Path) -> int:
    from marius_py.storage.embedding_store import EmbeddingStore
    return sum(f.chunk_bytes for f in EmbeddingStore(run_dir / "store", mode="r").chunk_files())


def planned_bytes(run_dir: Path, nbytes: int) -> list[int]:
    """Bytes the scheduler's grants imply, per epoch: a partition per read from another trainer."""
    grants = [json.loads(line) for line in (run_dir / "distributed" / "scheduler.jsonl").read_text().splitlines()]
    epochs = sorted({g["epoch"] for g in grants})
    return [nbytes * sum(1 for g in grants if g["epoch"] == epoch and g.get("bucket")
                         for source in g["sources"] if source != g["trainer"]) for epoch in epochs]


def project(machines: list[int], gpus_per_machine: int, edges_per_second: float, seed: int = 0) -> list[dict]:
    """Network bytes and rate per trainer per epoch, from a simulated epoch of the scheduler's grants."""
    rows = []
    for graph, (nodes, edges, partitions) in PROJECTED.items():
        partition = -(-nodes // partitions) * ROW_BYTES
        bucket_edges = np.random.default_rng(seed).multinomial(edges, np.full(partitions ** 2, partitions ** -2.0))
        for count in machines:
            trainers = count * gpus_per_machine
            capacity = max(2, partitions // (2 * trainers))
            sim = simulate_epoch(partitions, trainers, capacity, bucket_edges.reshape(partitions, partitions),
                                 seed=seed, edges_per_second=edges_per_second)
            machine = [t // gpus_per_machine for t in range(trainers)]
            received = [sum(n for source, n in tally.received_from.items() if machine[source] != machine[t])
                        for t, tally in enumerate(sim.trainers)]
            per_trainer = max(received) * partition
            rows.append({"graph": graph, "machines": count, "gpus_per_machine": gpus_per_machine,
                         "trainers": trainers, "partitions": partitions, "partitions_per_trainer": capacity,
                         "partition_bytes": partition, "epoch_seconds": sim.seconds, "idle_share": sim.idle_share,
                         "network_bytes_per_trainer": per_trainer,
                         "network_gbit_per_s": 8 * per_trainer / sim.seconds / 1e9})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset")
    parser.add_argument("--trainers", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--per-trainer", type=int, default=0, help="distributed.partitions_per_trainer (0: auto)")
    parser.add_argument("--dim", type=int, default=100)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--negatives", type=int, default=500)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="cuda: one GPU per trainer (NCCL), as many GPUs as the largest --trainers")
    parser.add_argument("--set", nargs="*", action="extend", default=[], metavar="KEY=VALUE",
                        help="more config overrides (repeatable)")
    parser.add_argument("--machines", type=int, nargs="+", default=[2, 4, 8], help="projected machine counts")
    parser.add_argument("--gpus-per-machine", type=int, default=1, help="projected trainers per machine")
    parser.add_argument("--edges-per-second", type=float, default=ISSUE_41_ONE_H200,
                        help="one trainer's edges/s in the projection (with --device cuda: this run's)")
    parser.add_argument("--project-only", action="store_true", help="the projection alone, no runs")
    parser.add_argument("--json", default="bench/results/cpu-distributed-handover.json")
    args = parser.parse_args()
    if not args.project_only and not args.dataset:
        parser.error("--dataset is required unless --project-only")
    rows = [] if args.project_only else measure(args)
    rate = rows[0]["edges_per_s"] if rows and args.device == "cuda" and rows[0]["trainers"] == 1 \
        else args.edges_per_second
    projection = project(args.machines, args.gpus_per_machine, rate)
    print(f"\nprojection: one trainer per GPU at {rate / 1e6:.1f}M edges/s, d=100 row-wise float32; "
          "network bytes = partitions received from other machines' trainers")
    print(f"  {'graph':12s} {'machines':>8s} {'trainers':>8s} {'held':>5s} {'epoch':>8s} {'idle':>6s} "
          f"{'GiB/trainer/epoch':>18s} {'Gbit/s each':>12s}")
    for p in projection:
        print(f"  {p['graph']:12s} {p['machines']:8d} {p['trainers']:8d} {p['partitions_per_trainer']:5d} "
              f"{p['epoch_seconds']:7.1f}s {p['idle_share']:6.1%} {p['network_bytes_per_trainer'] / GIB:18.1f} "
              f"{p['network_gbit_per_s']:12.1f}")
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"date": time.strftime("%Y-%m-%d"), "command": " ".join(sys.argv),
                               "cpu_count": os.cpu_count(), "device": args.device, "rows": rows,
                               "projection": {"edges_per_second": rate, "row_bytes": ROW_BYTES,
                                              "rows": projection}}, indent=2))
    print(f"wrote {out}")


def measure(args) -> list[dict]:
    rows = []
    with tempfile.TemporaryDirectory() as work:
        for trainers in args.trainers:
            rows.append(run(trainers, args, Path(work) / f"run{trainers}"))
            r = rows[-1]
            print(f"{trainers} trainer(s): {r['edges_per_s']:10,.0f} edges/s "
                  f"({r['edges_per_s'] / rows[0]['edges_per_s']:.2f}x)  test MRR {r['test_mrr']:.4f}  "
                  f"idle {r['idle_share']:.0%}  handed over {mean(r['handed_over_bytes_per_epoch']) / 2**20:.1f} "
                  f"MiB/epoch ({'as' if r['handed_over_as_planned'] else 'NOT as'} the grants planned)", flush=True)
            for t in r["per_trainer"]:
                print(f"    trainer {t['rank']}: {t['buckets']} buckets in {t['seconds']:.1f} s, idle "
                      f"{t['idle_seconds']:.1f} s, received {t['bytes_received'] / 2**20:.1f} MiB, sent "
                      f"{t['bytes_sent'] / 2**20:.1f} MiB")
    return rows


if __name__ == "__main__":
    main()
