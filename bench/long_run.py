"""A long run: `marius-py train` for many epochs, its RSS and open file descriptors sampled every epoch.

    python bench/long_run.py --dataset ../shared/datasets/codex-s --epochs 200 --partitions 8 --buffer 3 \
        --json bench/results/cpu-long-run-codex-s-p8.json

The training process is watched from outside (Linux /proc): whenever its
metrics log gains an epoch, its resident set and open descriptors are read.
Reported: both at epoch 10 and at the end, and their growth in between.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def resident_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def open_descriptors(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def epochs_logged(metrics: Path) -> int:
    if not metrics.exists():
        return 0
    return sum('"event": "epoch"' in line for line in metrics.read_text().splitlines())


def watch(command: list[str], metrics: Path, poll: float = 0.05) -> list[dict]:
    """Run ``command``; one sample (epoch, RSS, descriptors) each time ``metrics`` gains an epoch."""
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL)
    samples, seen = [], 0
    while process.poll() is None:
        epochs = epochs_logged(metrics)
        if epochs > seen:
            try:
                samples.append({"epoch": epochs, "rss": resident_bytes(process.pid),
                                "fds": open_descriptors(process.pid)})
            except (OSError, RuntimeError):  # the process ended between the check and the read
                break
            seen = epochs
        time.sleep(poll)
    if process.wait() != 0:
        raise SystemExit(f"training failed with status {process.returncode}")
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", required=True, help="a raw directory with train/valid/test.txt (CoDEx-S)")
    parser.add_argument("--epochs", type=int, default=200)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--buffer", type=int, default=3)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as workdir:
        run_dir = Path(workdir) / "run"
        command = [sys.executable, "-m", "marius_py.cli", "train", "--quiet", "codex-s",
                   f"dataset.path={Path(args.dataset).resolve()}", "training.device=cpu", f"model.dim={args.dim}",
                   f"training.epochs={args.epochs}", "training.num_negatives=200", "evaluation.every=10",
                   "training.lr=0.01", "model.dropout=0",  # as first recorded, whatever codex-s ships
                   "training.checkpoint_interval=0", f"storage.num_partitions={args.partitions}",
                   f"storage.buffer_capacity={args.buffer}", "--run-dir", str(run_dir)]
        started = time.perf_counter()
        samples = watch(command, run_dir / "metrics.jsonl")
        seconds = time.perf_counter() - started
    at_10 = next(s for s in samples if s["epoch"] >= 10)
    last = samples[-1]
    summary = {"epochs": last["epoch"], "seconds": seconds, "rss_at_10": at_10["rss"], "rss_last": last["rss"],
               "rss_growth": last["rss"] / at_10["rss"] - 1, "fds_at_10": at_10["fds"], "fds_last": last["fds"],
               "fds_max_after_10": max(s["fds"] for s in samples if s["epoch"] >= 10)}
    print(f"{summary['epochs']} epochs in {seconds:.0f} s: RSS {at_10['rss'] / 2**20:.1f} MiB at epoch "
          f"{at_10['epoch']} -> {last['rss'] / 2**20:.1f} MiB at epoch {last['epoch']} "
          f"({100 * summary['rss_growth']:+.2f}%); open fds {at_10['fds']} -> {last['fds']} "
          f"(max {summary['fds_max_after_10']} after epoch 10)")
    if args.json:
        payload = {"date": time.strftime("%Y-%m-%d"), "command": " ".join(sys.argv), "summary": summary,
                   "samples": samples}
        Path(args.json).write_text(json.dumps(payload, indent=1) + "\n")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
