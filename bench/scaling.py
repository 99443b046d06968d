"""G GPUs against one, end to end: `marius-py train --gpus G` epochs on the graph of bench/e2e.py.

    python bench/scaling.py --gpus 1 2 4 --placements auto host --json bench/results/scaling.json
    python bench/scaling.py --gpus 1 4 --placements host --variants dedup no-dedup --dims 100 400

For every placement (``auto``: one GPU holds the tables, or several split them; ``host``: pinned host
tables), dimension, dedup variant and GPU count, runs the real command in a subprocess with bench/e2e.py's
settings (B=50k per GPU, 10 chunks x 1000 negatives, half by degree, row-wise Adagrad) for ``--epochs``
epochs, reads the edges/s of every epoch after the first from its metrics.jsonl, and prints it beside one
GPU's at the same placement and dimension (the first ``--gpus`` value) and beside the best one-GPU row of
that dimension (the issue's "one GPU at its best placement"). Each row is written to ``--json`` as it
completes.
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from e2e import COMMAND_SETTINGS, add_graph_arguments, make_graph, run_command  # noqa: E402
from throughput import row_recorder  # noqa: E402

VARIANTS = {"dedup": [], "no-dedup": ["--no-dedup"]}


def print_row(row: dict) -> None:
    edges = row["edges_per_s"]
    print(f"{row['placement']:>5} d={row['dim']:<4} {row['variant']:<9} {row['gpus']} GPU(s) "
          f"{min(edges) / 1e6:6.2f}-{max(edges) / 1e6:6.2f} M/s   ran {row['placement_run']:<7} "
          f"x{row['speedup']:.2f} of one GPU here, x{row['speedup_vs_best']:.2f} of one GPU's best", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_graph_arguments(parser)
    parser.add_argument("--gpus", nargs="+", type=int, default=[1, 2, 4])
    parser.add_argument("--placements", nargs="+", default=["auto", "host"], choices=["auto", "device", "host"])
    parser.add_argument("--variants", nargs="+", default=["dedup"], choices=list(VARIANTS))
    parser.add_argument("--dims", nargs="+", type=int, default=[100])
    parser.add_argument("--decoder", default="complex")
    parser.add_argument("--load-threads", type=int, default=4)
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="more overrides")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    Path(args.workdir).mkdir(parents=True, exist_ok=True)
    graph = make_graph(args)
    record = row_recorder(args.json, print_row)
    one_gpu: dict[tuple[str, int], float] = {}
    # GPU counts outermost: every placement's one-GPU row (the first count) is known before any other row.
    for gpus, dim, placement, variant in itertools.product(args.gpus, args.dims, args.placements, args.variants):
        if gpus == args.gpus[0] and variant != args.variants[0]:
            continue  # (dedup is a several-GPU setting: one variant of the baseline row)
        settings = [*COMMAND_SETTINGS, f"model.decoder={args.decoder}", f"model.dim={dim}",
                    f"pipeline.placement={placement}", f"pipeline.load_threads={args.load_threads}", *args.set]
        command = run_command(graph, [*settings, "--gpus", str(gpus), *VARIANTS[variant]], args,
                              f"{placement}-d{dim}-{variant}-g{gpus}")
        edges = command.pop("edges_per_s")
        if gpus == args.gpus[0]:
            one_gpu[(placement, dim)] = min(edges)  # (the baseline: the first --gpus value, 1 by default)
        best = max((value for (_, d), value in one_gpu.items() if d == dim), default=min(edges))
        record({"part": "scaling", "placement": placement, "dim": dim, "variant": variant, "gpus": gpus,
                "settings": settings, "edges_per_s": edges,
                "speedup": min(edges) / one_gpu.get((placement, dim), min(edges)),
                "speedup_vs_best": min(edges) / best, **command})


if __name__ == "__main__":
    main()
