"""Where a shipped config's training epoch spends the GPU: epoch seconds and the heaviest kernels.

    python bench/epoch_kernels.py --runs fb15k-237:fb15k-237 codex-s:codex-s --datasets-root <dir> \
        [--set training.score_dtype=bfloat16] --json bench/results/epoch-kernels.json

Per ``DATASET:CONFIG``, trains ``--epochs`` epochs (no evaluation; the first
compiles kernels and captures graphs, so it is reported apart), profiles the
last one with torch.profiler, and prints the epoch times and the ``--top``
GPU kernels by total time in the profiled epoch. To compare with another
commit, copy this script into a git worktree of it and run it from there
(it imports the package of the tree it sits in), in the same call.
"""

from __future__ import annotations

import argparse
import collections
import json
import subprocess
import tempfile
from pathlib import Path

import torch


import marius_py as mp  # noqa: E402
from marius_py.bundled import resolve_dataset  # noqa: E402
from marius_py.dataset import Dataset  # noqa: E402
from marius_py.trainer import Trainer, tf32_matmuls  # noqa: E402


def gpu_kernels(profile) -> dict[str, tuple[int, float]]:
    """Kernel name -> (launches, milliseconds) over the profiled region."""
    totals = collections.defaultdict(lambda: [0, 0.0])
    for event in profile.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            microseconds = getattr(event, "device_time_total", None)
            if microseconds is None:  # torch < 2.4
                microseconds = event.cuda_time_total
            totals[event.name][0] += 1
            totals[event.name][1] += microseconds / 1e3
    return {name: (count, ms) for name, (count, ms) in totals.items()}


def measure(dataset_dir: Path, config_name: str, overrides: list[str], epochs: int, top: int) -> dict:
    from torch.profiler import ProfilerActivity, profile
    config = mp.make_config(config_name, [f"dataset.path={dataset_dir}", f"training.epochs={epochs}",
                                          "evaluation.every=0", *overrides])
    with tempfile.TemporaryDirectory() as run_dir:
        trainer = Trainer.of(config, Dataset(resolve_dataset(config.dataset.path)), run_dir, progress=False)
        seconds = []
        with tf32_matmuls(config.training.tf32):
            for epoch in range(1, epochs):
                seconds.append(trainer.train_epoch(epoch)["seconds"])
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as profiled:
                record = trainer.train_epoch(epochs)
        trainer.close()
    kernels = gpu_kernels(profiled)
    heaviest = sorted(kernels.items(), key=lambda item: -item[1][1])[:top]
    return {"dataset": dataset_dir.name, "config": config_name, "overrides": overrides,
            "first_epoch_seconds": seconds[0] if seconds else None, "epoch_seconds": seconds[1:],
            "profiled_epoch_seconds": record["seconds"], "edges_per_s": record["edges_per_s"],
            "gpu_kernel_ms": sum(ms for _, ms in kernels.values()),
            "kernels": [{"name": name, "launches": count, "ms": ms} for name, (count, ms) in heaviest]}


def commit() -> str:
    """The checkout's commit (``--label`` where the tree has no git metadata)."""
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=Path(mp.__file__).parent, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", nargs="+", required=True, help="DATASET:CONFIG pairs")
    parser.add_argument("--datasets-root", default="../shared/datasets")
    parser.add_argument("--set", dest="overrides", nargs="*", action="extend", default=[], metavar="KEY=VALUE")
    parser.add_argument("--epochs", type=int, default=4, help="epochs per run; the last is profiled")
    parser.add_argument("--top", type=int, default=12)
    parser.add_argument("--label", default=None, help="name of the code measured (default: its git commit)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    if args.epochs < 2:
        parser.error("--epochs must be at least 2: the first compiles kernels and captures graphs")
    if not torch.cuda.is_available():
        parser.error("needs a CUDA GPU")
    code = args.label or commit()
    rows = []
    for run in args.runs:
        dataset, config_name = run.split(":", 1)
        row = measure(Path(args.datasets_root) / dataset, config_name, args.overrides, args.epochs, args.top)
        row["commit"] = code
        rows.append(row)
        steady = row["epoch_seconds"] + [row["profiled_epoch_seconds"]]
        print(f"{dataset:12s} {config_name:14s} {' '.join(args.overrides):30s} commit {code}  first epoch "
              f"{row['first_epoch_seconds']:.2f} s, then {', '.join(f'{s:.3f}' for s in steady)} s  "
              f"({row['edges_per_s']:,.0f} edges/s); GPU kernels {row['gpu_kernel_ms']:.0f} ms in the last")
        for kernel in row["kernels"]:
            print(f"    {kernel['launches']:6d} launches {kernel['ms']:8.1f} ms  {kernel['name'][:100]}")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                                               "rows": rows}, indent=1))
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
