"""G GPUs against one, end to end: `marius-py train --gpus G` epochs on the graph of bench/e2e.py.

    python bench/scaling.py --gpus 1 2 4 --placements auto host --json bench/results/scaling.json
    python bench/scaling.py --gpus 1 4 --placements host --variants auto dedup no-dedup --dims 100 400

For every placement (``auto``: what the command chooses; ``replicated`` and ``split``: tables in GPU
memory, a copy on each GPU or a share; ``host``: pinned host tables), dimension, dedup variant and GPU
count, runs the real command in a subprocess with bench/e2e.py's settings (B=50k per GPU, 10 chunks x 1000
negatives, half by degree, row-wise Adagrad) for ``--epochs`` epochs, reads the edges/s of every epoch after
the first from its metrics.jsonl, and prints it beside one GPU's at the same placement and dimension (the
first ``--gpus`` value) and beside the best one-GPU row of that dimension (the issue's "one GPU at its best
placement"). Beside each row, the step alone (``--step-seconds``, 0: skip): the same runner training the
graph's edges from tables already in place, in this process, at the same settings. Each row is written to
``--json`` as it completes.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from e2e import (COMMAND_SETTINGS, STEP_BATCHES, add_graph_arguments, graph_and_step_args, run_command,  # noqa: E402
                 sample_train_edges)
from throughput import UtilisationSampler, measure_step, row_recorder  # noqa: E402

VARIANTS = {"auto": [], "dedup": ["pipeline.dedup=true"], "no-dedup": ["--no-dedup"]}  # (auto: the default)


def print_row(row: dict) -> None:
    edges = row["edges_per_s"]
    step = row.get("step_edges_per_s")
    print(f"{row['placement']:>10} d={row['dim']:<4} {row['variant']:<9} {row['gpus']} GPU(s) "
          f"{min(edges) / 1e6:6.2f}-{max(edges) / 1e6:6.2f} M/s   ran {row['placement_run']:<10} "
          f"x{row['speedup']:.2f} of one GPU here, x{row['speedup_vs_best']:.2f} of one GPU's best"
          + (f"   step alone {step / 1e6:6.2f} M/s" if step else "")
          + (f" (host enqueuing {row['step_host_share']:.0%} of it; GPUs busy "
             f"{', '.join('?' if b is None else f'{b:.0f}%' for b in row['step_gpu_busy'])})"
             if "step_host_share" in row else ""), flush=True)


def measure_devices_step(gpus: int, placement: str, settings: list[str], edges, seconds: float,
                         metadata: dict) -> dict:
    """The step alone on ``gpus`` GPUs: the runner the command builds (``placement`` as it ran), training
    ``edges`` over and over from tables already in place; edges/s of a timed stretch after a warm-up."""
    import torch
    from marius_py.config import load_config
    from marius_py.random_streams import epoch_generator
    from marius_py.step.model import Model
    from marius_py.step.runners import build_multi_device_runner
    from marius_py.trainer import tf32_matmuls

    devices = [torch.device("cuda", g) for g in range(gpus)]
    config = load_config(None, [*settings, "training.devices=" + ",".join(map(str, devices))])
    nodes_count = metadata["num_nodes"]
    torch.manual_seed(0)
    replicas = [Model(config, nodes_count, metadata["num_relations"], d) for d in devices]
    for replica in replicas[1:]:
        replica.load_state_dict(replicas[0].state_dict())
    dim, state_dim = config.model.dim, replicas[0].node_optimizer.state_dim(config.model.dim)
    where = devices[0] if placement == "replicated" else torch.device("cpu")
    nodes = (torch.randn(nodes_count, dim) * 1e-3).to(where)
    state = torch.zeros(nodes_count, state_dim, device=where)
    if where.type == "cpu":
        nodes, state = nodes.pin_memory(), state.pin_memory()
    runner = build_multi_device_runner(replicas, placement, config, devices, (dim + state_dim) * 4)
    edges = edges.to(devices[0])
    loss = torch.zeros((), device=devices[0])

    def run() -> float:
        for d in devices:
            torch.cuda.synchronize(d)
        started = time.perf_counter()
        runner.run(edges, nodes, state, None, [epoch_generator(0, 1, d, stream=2 + g) for g, d in enumerate(devices)],
                   [epoch_generator(0, 1, d, stream=9 + g) for g, d in enumerate(devices)], loss, lambda n: None)
        return time.perf_counter() - started  # (run returns with every device synchronised)

    with tf32_matmuls(True):
        run()  # warm-up: kernels compiled, graphs captured
        timed, rounds = 0.0, 0
        host_before = getattr(runner, "host_seconds", 0.0)
        samplers = [UtilisationSampler(d) for d in devices]  # each GPU's busy share (NVML) while timed
        with contextlib.ExitStack() as stack:
            for sampler in samplers:
                stack.enter_context(sampler)
            while timed < seconds:
                timed += run()
                rounds += 1
    host = getattr(runner, "host_seconds", 0.0) - host_before
    close = getattr(runner, "close", None)
    if close is not None:  # (a process per GPU: its workers and group end here)
        close()
    return {"step_edges_per_s": rounds * len(edges) / timed, "step_seconds": timed, "step_host_share": host / timed,
            "step_gpu_busy": [sampler.mean for sampler in samplers]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_graph_arguments(parser)
    parser.add_argument("--gpus", nargs="+", type=int, default=[1, 2, 4])
    parser.add_argument("--placements", nargs="+", default=["auto", "host"],
                        choices=["auto", "device", "host", "replicated", "split"])
    parser.add_argument("--step-seconds", type=float, default=3.0, help="the step alone: seconds timed (0: skip)")
    parser.add_argument("--variants", nargs="+", default=["auto"], choices=list(VARIANTS))
    parser.add_argument("--dims", nargs="+", type=int, default=[100])
    parser.add_argument("--decoder", default="complex")
    parser.add_argument("--load-threads", type=int, default=4)
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="more overrides")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    graph, metadata, step_args = graph_and_step_args(args, args.step_seconds, 10)
    step_edges = 50_000 * STEP_BATCHES  # per GPU: 200 batches of the graph's train edges, over and over
    sample = sample_train_edges(graph, max(args.gpus) * step_edges) if args.step_seconds > 0 else None
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
        step = {}
        if args.step_seconds > 0:
            ran = command["placement_run"]
            if gpus == 1:
                step = measure_step(dim, ran, "float32", step_args, decoder=args.decoder, extra=tuple(
                    s for s in settings if not s.startswith("pipeline.placement")), edges=sample[:gpus * step_edges])
                step = {"step_edges_per_s": step["edges_per_s"], "step_seconds": step["seconds"]}
            else:
                dedup = {"dedup": ["pipeline.dedup=true"], "no-dedup": ["pipeline.dedup=false"]}.get(variant, [])
                step = measure_devices_step(gpus, ran, [*settings, *dedup], sample[:gpus * step_edges],
                                            args.step_seconds, metadata)
        if gpus == args.gpus[0]:
            one_gpu[(placement, dim)] = min(edges)  # (the baseline: the first --gpus value, 1 by default)
        best = max((value for (_, d), value in one_gpu.items() if d == dim), default=min(edges))
        record({"part": "scaling", "placement": placement, "dim": dim, "variant": variant, "gpus": gpus,
                "settings": settings, "edges_per_s": edges,
                "speedup": min(edges) / one_gpu.get((placement, dim), min(edges)),
                "speedup_vs_best": min(edges) / best, **step, **command})


if __name__ == "__main__":
    main()
