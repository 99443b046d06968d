"""What a plug-in decoder costs and whether it learns the same: DistMult written as a user plug-in (a score
function in plain PyTorch, registered by this very file through model.plugins) against the built-in DistMult at
the same settings and seed, and the built-in SimplE beside them, each a ``marius-py train codex-s`` run of its
own process, on the CPU or (``--device cuda``) one GPU, where the built-in runs the fused step and the
plug-ins the autograd step.

    python bench/plugins.py --dataset ../shared/datasets/codex-s --epochs 30 --json bench/results/plugins/cpu-codex-s.json
    python bench/plugins.py --dataset DIR --device cuda --epochs 30 --json bench/results/plugins/gpu-codex-s.json

Rows: test MRR and Hits@10 (filtered, both directions), the median of the epochs' edges/s, and the run's
wall time. The shipped CoDEx-S config (ComplEx at d=2000 scored against every node, with relation prediction
and query dropout, 200 epochs) is far beyond a few minutes on two cores, so every row takes the same
overrides (``SETTINGS``): d=128, 256 sampled negatives, no relation prediction (neither SimplE nor a score
function is linear in one relation row), no dropout (a score function's query holds h and r: its mask would
differ), ``--epochs`` epochs (30: about two minutes in all on two cores), tested once at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import marius_py as mp

SETTINGS = ["model.dim=128", "training.num_negatives=256", "training.relation_prediction=0", "model.dropout=0",
            "evaluation.every=0", "training.seed=0"]
# name in the table -> (decoder, the form it is written in)
RUNS = {"plugin distmult": ("plain_distmult", "score function (plug-in)"),
        "plugin distmult, operator": ("operator_distmult", "operator + dot comparator (plug-in)"),
        "distmult": ("distmult", "operator + dot comparator"),
        "simple": ("simple", "operator + dot comparator")}


class PlainDistMult(mp.Decoder):
    """DistMult as research code writes it: the score of broadcast h, r, t, and nothing else."""

    def score_hrt(self, h, r, t):
        return (h * r * t).sum(-1)


class OperatorDistMult(mp.DotProductComparator):
    """DistMult as a plug-in that gives its operator: candidates are scored by matrix products."""

    def operator(self, nodes, relations):
        return nodes * relations


for _name, _decoder in (("plain_distmult", PlainDistMult), ("operator_distmult", OperatorDistMult)):
    if _name not in mp.DECODERS:  # (imported by model.plugins, and run as a script)
        mp.DECODERS.register(_name, _decoder)


def train(dataset: str, decoder: str, epochs: int, device: str, run_dir: Path) -> dict:
    """One run in its own process; its test metrics, median epoch edges/s and wall seconds."""
    command = [sys.executable, "-m", "marius_py", "train", "codex-s", f"dataset.path={dataset}",
               f"model.decoder={decoder}", f"training.epochs={epochs}", f"model.plugins={Path(__file__).resolve()}",
               *SETTINGS, f"training.device={device}", "--run-dir", str(run_dir), "--quiet"]
    start = time.perf_counter()
    subprocess.run(command, check=True)
    wall = time.perf_counter() - start
    records = mp.checkpoint.RunDirectory(run_dir).read_metrics()
    test = [r for r in records if r.get("event") == "eval" and r.get("split") == "test"][-1]
    speeds = [r["edges_per_s"] for r in records if r.get("event") == "epoch"]
    return {"test_mrr": test["mrr"], "test_hits@10": test["hits@10"], "edges_per_s": statistics.median(speeds),
            "wall_seconds": wall}


def _commit() -> str | None:
    """The checkout's commit (with ``+`` where its tracked files differ), or None outside git."""
    repo = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=repo, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "diff", "--quiet", "HEAD", "--", "marius_py", "pipeline", "storage",
                                "orderings", "bench/plugins.py"], cwd=repo).returncode != 0
    except (OSError, subprocess.CalledProcessError):
        return None
    return head + ("+" if dirty else "")


def _machine(device: str) -> str:
    if device.startswith("cuda"):
        import torch
        return f"{torch.cuda.get_device_name()}, {os.cpu_count()} CPU cores"
    return f"{platform.machine()}, {os.cpu_count()} CPU cores"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", required=True, help="a raw directory of train/valid/test.txt (CoDEx-S; on a GPU, FB15k-237 too)")
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--device", default="cpu", help="cpu, or cuda: one GPU")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)
    dataset = str(Path(args.dataset).resolve())
    rows = {}
    with tempfile.TemporaryDirectory() as root:
        for name, (decoder, form) in RUNS.items():
            rows[name] = {"decoder": decoder, "form": form,
                          **train(dataset, decoder, args.epochs, args.device, Path(root) / name)}
    gap = abs(rows["plugin distmult"]["test_mrr"] - rows["distmult"]["test_mrr"])
    where = "one GPU" if args.device.startswith("cuda") else "the CPU"
    print(f"{Path(dataset).name} on {where}, {args.epochs} epochs, {' '.join(SETTINGS)}")
    print(f"{'run':<27}{'form':<38}{'test MRR':>10}{'Hits@10':>9}{'edges/s':>11}{'wall s':>8}")
    for name, row in rows.items():
        print(f"{name:<27}{row['form']:<38}{row['test_mrr']:>10.4f}{row['test_hits@10']:>9.4f}"
              f"{row['edges_per_s']:>11.0f}{row['wall_seconds']:>8.1f}")
    print(f"plug-in DistMult against the built-in: test MRR gap {gap:.4f}")
    if args.json:
        result = {"bench": "plugins", "date": time.strftime("%Y-%m-%d"), "command": " ".join(["python", *sys.argv]),
                  "commit": _commit(), "cpus": os.cpu_count(), "machine": _machine(args.device),
                  "dataset": dataset, "device": args.device, "epochs": args.epochs, "settings": SETTINGS, "rows": rows,
                  "plugin_distmult_mrr_gap": gap}
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
