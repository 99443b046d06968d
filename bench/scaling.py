"""G GPUs against one, end to end: `marius-py train --gpus G` epochs on the graph of bench/e2e.py, and where
each GPU's time goes.

    python bench/scaling.py --gpus 1 2 4 --placements auto host --json bench/results/scaling.json
    python bench/scaling.py --gpus 1 4 --placements host --variants auto dedup no-dedup --dims 100 400

For every placement (``auto``: what the command chooses; ``replicated`` and ``split``: tables in GPU
memory, a copy on each GPU or a share; ``host``: pinned host tables; ``disk``: partitions on disk behind
bench/e2e.py's buffer), dimension, dedup variant and GPU count, runs the real command in a subprocess with
bench/e2e.py's settings (B=50k per GPU, 10 chunks x 1000 negatives, half by degree, row-wise Adagrad) for
``--epochs`` epochs, reads the edges/s of every epoch after the first from its metrics.jsonl, and prints
it beside one GPU's at the same placement and dimension (the first ``--gpus`` value) and beside the best
one-GPU row of that dimension (the issue's "one GPU at its best placement").

Where the time goes, from the same epochs: each GPU's busy share (NVML, sampled while the epochs ran),
the epoch's phases (``time``: waiting for a state's edges, preparing them, training, the final
synchronisation) and the host's seconds spent enqueuing (replicated runners), dedup as it ran (and
``dedup=auto``'s trial), and the bytes on each link per trained edge (``devices.links``: each GPU's host
link, each pair of GPUs) with rho.

Beside each row, the step alone (``--step-seconds``, 0: skip): the same runner training the graph's
edges from tables already in place, in this process, at the same settings (bench/multi_gpu.py's
``measure_devices_step``; one GPU: bench/throughput.py's ``measure_step``), with each GPU's busy share
and the host's share spent enqueuing. Each row is written to ``--json`` as it completes.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from e2e import (COMMAND_SETTINGS, PLACEMENT_SETTINGS, STEP_BATCHES, add_graph_arguments,  # noqa: E402
                 graph_and_step_args, run_command, sample_train_edges, step_settings)
from multi_gpu import DEVICES_VARIANTS, added, link_totals, measure_devices_step, scaled  # noqa: E402
from throughput import measure_step, row_recorder  # noqa: E402

VARIANTS = {"auto": [], "dedup": ["pipeline.dedup=true"], "no-dedup": ["--no-dedup"]}  # (auto: the default)


def print_row(row: dict) -> None:
    edges = row["edges_per_s"]
    step = row.get("step_edges_per_s")
    print(f"{row['placement']:>10} d={row['dim']:<4} {row['variant']:<9} {row['gpus']} GPU(s) "
          f"{min(edges) / 1e6:6.2f}-{max(edges) / 1e6:6.2f} M/s   ran {row['placement_run']:<10} "
          f"x{row['speedup']:.2f} of one GPU here, x{row['speedup_vs_best']:.2f} of one GPU's best"
          + (f"   step alone {step / 1e6:6.2f} M/s" if step else "")
          + (f" (GPUs busy {_percents(row['step_gpu_busy'])})" if "step_gpu_busy" in row else "")
          + (f" (host enqueuing {row['step_host_share']:.0%} of it)" if row.get("step_host_share") is not None
             else ""), flush=True)
    phases = ", ".join(f"{name} {seconds:.2f}" for name, seconds in row["epoch_phase_seconds"].items() if seconds)
    links = ""
    if "links_per_edge" in row:
        host = "/".join(f"{b:.0f}" for b in row["links_per_edge"]["host_to_device"])
        rho = f", rho {row['rho']:.2f}" if "rho" in row else ""
        links = (f"; host->GPU B/edge {host} (dedup {row['dedup_run']}{rho}), "
                 f"GPU->GPU B/edge {row['device_bytes_per_edge']:.0f}")
    print(f"{'':>10} GPUs busy {_percents(row['gpu_busy'])}; s/epoch: {phases}{links}", flush=True)


def _percents(values: list) -> str:
    return ", ".join("?" if value is None else f"{value:.0f}%" for value in values)


def where_time_goes(epochs: list[dict]) -> dict:
    """From a command's epoch records, over the epochs after the first (those whose edges/s a row keeps): the
    seconds of each phase per epoch, and with several GPUs the host's seconds enqueuing, dedup as it ran and
    auto's trial, rho and the bytes on each link per trained edge."""
    later = epochs[1:] or epochs
    names = dict.fromkeys(name for r in later for name in r["time"])  # (commits: not every epoch)
    phases = {name: sum(r["time"].get(name, 0.0) for r in later) / len(later) for name in names}
    found = {"epoch_phase_seconds": phases}
    devices = [r["devices"] for r in later if "devices" in r]
    if not devices:  # (one GPU)
        return found
    trained = sum(r["edges_per_s"] * r["seconds"] for r in later)
    links = scaled(functools.reduce(added, [d["links"] for d in devices]), 1 / trained)
    found.update(links_per_edge=links, host_bytes_per_edge=link_totals(links)["host_to_device"],
                 device_bytes_per_edge=link_totals(links)["device_to_device"], dedup_run=devices[-1]["dedup"],
                 dedup_trial=next((r["devices"]["dedup_trial"] for r in epochs
                                   if "dedup_trial" in r.get("devices", {})), None))
    if "device_rows" in devices[0]:  # (tables shared: rows routed)
        found["rho"] = sum(d["device_rows"] for d in devices) / max(1, sum(d["union_rows"] for d in devices))
    if "host_enqueue_seconds" in devices[0]:
        found["host_enqueue_seconds"] = sum(d["host_enqueue_seconds"] for d in devices) / len(devices)
    return found


def measure_step_alone(gpus: int, dim: int, ran: str, variant: str, settings: list[str], edges, args,
                       step_args, metadata: dict) -> dict:
    """The step alone beside a row, at the placement the command ran (a disk run's: host)."""
    extra = step_settings(settings)
    if gpus == 1:
        step = measure_step(dim, ran, "float32", step_args, decoder=args.decoder, extra=extra, edges=edges)
        step = {"edges_per_s": step["edges_per_s"], "seconds": step["seconds"], "gpu_busy": [step["gpu_util"]]}
    else:
        step = measure_devices_step(gpus, ran, [*extra, *DEVICES_VARIANTS.get(variant, [])], edges, args.step_seconds,
                                    metadata["num_nodes"], metadata["num_relations"])
        step = {key: step[key] for key in ("edges_per_s", "seconds", "host_share", "gpu_busy")}
    torch.cuda.empty_cache()  # the next command's auto placement sees the GPUs' memory free
    return {f"step_{key}": value for key, value in step.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_graph_arguments(parser)
    parser.add_argument("--gpus", nargs="+", type=int, default=[1, 2, 4])
    parser.add_argument("--placements", nargs="+", default=["auto", "host"],
                        choices=["auto", "device", "host", "replicated", "split", "disk"])
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
        where = PLACEMENT_SETTINGS["disk"] if placement == "disk" else [f"pipeline.placement={placement}"]
        settings = [*COMMAND_SETTINGS, f"model.decoder={args.decoder}", f"model.dim={dim}", *where,
                    f"pipeline.load_threads={args.load_threads}", *args.set]
        command = run_command(graph, [*settings, "--gpus", str(gpus), *VARIANTS[variant]], args,
                              f"{placement}-d{dim}-{variant}-g{gpus}", gpus=gpus)
        edges = command.pop("edges_per_s")
        step = {}
        if args.step_seconds > 0:
            ran = "host" if placement == "disk" else command["placement_run"]
            step = measure_step_alone(gpus, dim, ran, variant, settings, sample[:gpus * step_edges], args,
                                      step_args, metadata)
        if gpus == args.gpus[0]:
            one_gpu[(placement, dim)] = min(edges)  # (the baseline: the first --gpus value, 1 by default)
        best = max((value for (_, d), value in one_gpu.items() if d == dim), default=min(edges))
        record({"part": "scaling", "placement": placement, "dim": dim, "variant": variant, "gpus": gpus,
                "settings": settings, "edges_per_s": edges,
                "speedup": min(edges) / one_gpu.get((placement, dim), min(edges)),
                "speedup_vs_best": min(edges) / best, **step, **where_time_goes(command["records"]), **command})


if __name__ == "__main__":
    main()
