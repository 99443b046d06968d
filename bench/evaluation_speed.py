"""Filtered evaluation's speed on the CPU: the bundled job's test split, ranked against every node.

    python bench/evaluation_speed.py --json bench/results/cpu-evaluation-speed.json

Scores the test split of a dataset (default: the bundled CoDEx-M) with a seeded random ComplEx (d=256, as
the bundled config) through `evaluate_filtered`, ``--repeats`` times after one warm-up, and prints the
median seconds and the MRR (the same MRR from two versions of the code means the same ranks).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch


import marius_py as mp  # noqa: E402
from marius_py.evaluation import build_known_answers, evaluate_filtered  # noqa: E402
from marius_py.models import build_decoder  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="codex-m", help="bundled name or preprocessed directory")
    parser.add_argument("--decoder", default="complex")
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=1024, help="queries scored at a time")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    dataset = mp.load_dataset(args.dataset)
    torch.manual_seed(0)
    decoder = build_decoder(args.decoder, dataset.num_relations, args.dim, init_scale=0.1)
    nodes = torch.randn(dataset.num_nodes, args.dim) * 0.1
    known = build_known_answers(dataset.all_known_edges(), dataset.num_relations)
    seconds = []
    for _ in range(args.repeats + 1):  # the first is a warm-up
        start = time.perf_counter()
        metrics = evaluate_filtered(decoder, nodes, dataset.test, known, args.batch_size)
        seconds.append(time.perf_counter() - start)
    row = {"dataset": args.dataset, "decoder": args.decoder, "dim": args.dim, "queries": metrics["num_queries"],
           "median_s": statistics.median(seconds[1:]), "runs_s": seconds[1:], "mrr": metrics["mrr"],
           "torch_threads": torch.get_num_threads(), "cpus": os.cpu_count()}
    print(f"{row['dataset']}: {row['queries']} queries, {row['median_s']:.2f} s median of {args.repeats} "
          f"(MRR {row['mrr']:.6f}, {row['torch_threads']} threads)")
    if args.json:
        Path(args.json).write_text(json.dumps(row, indent=1))


if __name__ == "__main__":
    main()
