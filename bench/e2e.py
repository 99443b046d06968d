"""End to end against the step alone: `marius-py train` epochs beside the training step at the same settings.

    python bench/e2e.py --graph /tmp/e2e/graph --json bench/results/e2e.json
    python bench/e2e.py --placements host --dims 100 --decoders complex --score-dtypes float32

Generates a Freebase-shaped graph once (bench/freebase_shape.py; default 4M nodes, 1,000 relations, 40M
train edges, bucketed for 64 partitions so the disk rows need no re-bucketing), then for every
placement (``device``: tables in GPU memory, ``host``: pinned host tables, ``disk``: partitions on disk
behind a 16:4 buffer), dimension, decoder and score dtype:

- runs the real command, ``marius-py train`` in a subprocess, for ``--epochs`` epochs and reads the
  edges/s of every epoch after the first from its metrics.jsonl (the first pays start-up and compiles),
  with the GPU's busy share (NVML) while those epochs ran;
- runs the step alone (bench/throughput.py's measure_step) in this process at exactly the settings
  the command ran (the same overrides, a random sample of the graph's train edges): for ``disk`` the step of
  the host placement, the bound IO cannot beat.

The ratio of the two is the share of an epoch the step gets. Each row is printed and written to
``--json`` as it completes.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import subprocess
import sys
import time
from pathlib import Path

import h5py
import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from throughput import UtilisationSampler, measure_step, row_recorder  # noqa: E402

# The command: ComplEx-style sampled training, as a Freebase86m user runs it.
COMMAND_SETTINGS = ["training.batch_size=50000", "training.num_chunks=10", "training.num_negatives=1000",
                    "training.degree_fraction=0.5", "training.adagrad_variant=rowwise", "model.reg_weight=0",
                    "model.loss=softmax_ce", "evaluation.protocol=sampled", "evaluation.every=0"]
PLACEMENT_SETTINGS = {"device": ["pipeline.placement=device"], "host": ["pipeline.placement=host"],
                      "disk": ["storage.num_partitions=16", "storage.buffer_capacity=4"]}
STEP_BATCHES = 200  # the step trains 200 batches of the graph's train edges over and over (a drain per 200)


def add_graph_arguments(parser: argparse.ArgumentParser) -> None:
    """The graph (generated once into --graph) and the command's run folders and epochs, for the benches
    that run ``marius-py train`` on it (this one and bench/scaling.py)."""
    parser.add_argument("--graph", default="/tmp/e2e/graph")
    parser.add_argument("--workdir", default="/tmp/e2e")
    parser.add_argument("--nodes", type=int, default=4_000_000)
    parser.add_argument("--relations", type=int, default=1000)
    parser.add_argument("--train", type=int, default=40_000_000)
    parser.add_argument("--epochs", type=int, default=3)


def make_graph(args) -> Path:
    graph = Path(args.graph)
    if not (graph / "metadata.json").exists():
        subprocess.run([sys.executable, str(Path(__file__).parent / "freebase_shape.py"), "--out", str(graph),
                        "--partitions", "64", "--nodes", str(args.nodes), "--relations", str(args.relations),
                        "--train", str(args.train), "--valid", "20000", "--test", "20000"], check=True)
    return graph


def graph_and_step_args(args, seconds: float, warmup_batches: int) -> tuple[Path, dict, argparse.Namespace]:
    """(the graph, made once; its metadata; the arguments ``measure_step`` takes for it) for a bench's run."""
    Path(args.workdir).mkdir(parents=True, exist_ok=True)
    graph = make_graph(args)
    metadata = json.loads((graph / "metadata.json").read_text())
    step_args = argparse.Namespace(nodes=metadata["num_nodes"], relations=metadata["num_relations"],
                                   load_threads=args.load_threads, seconds=seconds,
                                   warmup_batches=warmup_batches, profile=False)
    return graph, metadata, step_args


def step_settings(settings: list[str]) -> tuple[str, ...]:
    """The command's settings that the step alone takes: all but where the tables live (the step is given
    its placement: a disk run's step is the host placement's, the bound IO cannot beat)."""
    return tuple(s for s in settings if not s.startswith(("storage.", "pipeline.placement")))


def sample_train_edges(graph: Path, count: int) -> torch.Tensor:
    """``count`` of the dataset's train edges drawn at random (the file is bucket-sorted: its first edges
    would touch a few partitions' nodes only)."""
    with h5py.File(graph / "edges.h5", "r") as file:
        edges = np.asarray(file["train"][:], dtype=np.int64)
    return torch.from_numpy(edges[np.random.default_rng(0).choice(len(edges), count, replace=False)])


def run_command(graph: Path, settings: list[str], args, name: str, gpus: int = 1) -> dict:
    """``marius-py train`` for ``--epochs`` epochs: the edges/s of the epochs after the first (the first pays
    start-up and compiles), and each of the first ``gpus`` GPUs' busy share (NVML) during those epochs."""
    run_dir = Path(args.workdir) / f"run-{name}"
    subprocess.run(["rm", "-rf", str(run_dir)], check=True)
    command = [sys.executable, "-m", "marius_py", "train", f"dataset.path={graph}", *settings,
               f"training.epochs={args.epochs}", "training.device=cuda", "--run-dir", str(run_dir), "--quiet"]
    started = time.perf_counter()
    with contextlib.ExitStack() as stack:
        samplers = [stack.enter_context(UtilisationSampler(torch.device("cuda", g))) for g in range(gpus)]
        arrivals = watch_lines(subprocess.Popen(command), run_dir / "metrics.jsonl")
    wall = time.perf_counter() - started
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    epochs = [(arrived, record) for arrived, record in zip(arrivals, map(json.loads, lines))
              if record.get("event") == "epoch"]
    later = epochs[1:] or epochs
    windows = [epoch_window(arrived, record) for arrived, record in later]
    return {"edges_per_s": [r["edges_per_s"] for _, r in later], "epoch_seconds": [r["seconds"] for _, r in later],
            "first_epoch_seconds": epochs[0][1]["seconds"], "wall_seconds": wall,
            "gpu_busy": [sampler.mean_within(windows) for sampler in samplers],
            "placement_run": epochs[-1][1]["pipeline"]["placement"], "records": [r for _, r in epochs]}


def watch_lines(process: subprocess.Popen, path: Path, interval: float = 0.05) -> list[float]:
    """time.monotonic() at which each line of ``path`` appeared while ``process`` ran (to ``interval``);
    raises as ``check=True`` does when the process fails."""
    arrivals: list[float] = []
    while True:
        done = process.poll() is not None
        text = path.read_text() if path.exists() else ""
        arrivals += [time.monotonic()] * (text.count("\n") - len(arrivals))
        if done:
            break
        time.sleep(interval)
    if process.returncode:
        raise subprocess.CalledProcessError(process.returncode, process.args)
    return arrivals


def epoch_window(arrived: float, record: dict) -> tuple[float, float]:
    """The monotonic start and end of an epoch's training whose record was logged at ``arrived``: the
    trainer logs it after validating and committing (the record's ``time``)."""
    after = record.get("time", {})
    end = arrived - after.get("validate", 0.0) - after.get("commit", 0.0)
    return end - record["seconds"], end


def print_row(row: dict) -> None:
    e2e = row["e2e_edges_per_s"]
    print(f"{row['placement']:>6} d={row['dim']:<4} {row['decoder']:<9} scores={row['score_dtype']:<9} "
          f"end to end {min(e2e) / 1e6:6.2f}-{max(e2e) / 1e6:6.2f} M/s   step {row['step_edges_per_s'] / 1e6:6.2f} M/s"
          f"   share {row['share']:.0%}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_graph_arguments(parser)
    parser.add_argument("--placements", nargs="+", default=["device", "host", "disk"], choices=list(PLACEMENT_SETTINGS))
    parser.add_argument("--dims", nargs="+", type=int, default=[100, 400])
    parser.add_argument("--decoders", nargs="+", default=["complex", "distmult"])
    parser.add_argument("--score-dtypes", nargs="+", default=["float32", "bfloat16"], choices=["float32", "bfloat16"])
    parser.add_argument("--load-threads", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=3.0, help="step: seconds timed after the warm-up")
    parser.add_argument("--warmup-batches", type=int, default=10)
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="more overrides for both")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    graph, metadata, step_args = graph_and_step_args(args, args.seconds, args.warmup_batches)
    edges = sample_train_edges(graph, 50_000 * STEP_BATCHES)
    record = row_recorder(args.json, print_row)
    for placement, dim, decoder, score_dtype in itertools.product(args.placements, args.dims, args.decoders,
                                                                 args.score_dtypes):
        settings = [*COMMAND_SETTINGS, f"model.decoder={decoder}", f"model.dim={dim}",
                    f"training.score_dtype={score_dtype}", f"pipeline.load_threads={args.load_threads}",
                    *PLACEMENT_SETTINGS[placement], *args.set]
        name = f"{placement}-d{dim}-{decoder}-{score_dtype}"
        command = run_command(graph, settings, args, name)
        step_placement = "device" if placement == "device" else "host"
        step = measure_step(dim, step_placement, score_dtype, step_args, decoder=decoder,
                            extra=step_settings(settings), edges=edges)
        e2e = command.pop("edges_per_s")
        record({"part": "e2e", "placement": placement, "dim": dim, "decoder": decoder, "score_dtype": score_dtype,
                "settings": settings, "e2e_edges_per_s": e2e, "step_edges_per_s": step["edges_per_s"],
                "share": min(e2e) / step["edges_per_s"], "step": step, **command})


if __name__ == "__main__":
    main()
