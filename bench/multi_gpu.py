"""Several GPUs sharing host tables: bytes moved with and without dedup, throughput, accuracy.

    python bench/multi_gpu.py --parts bytes step processes --json bench/results/multi-gpu.json
    python bench/multi_gpu.py --parts fb15k disk --fb15k .data/fb15k-237

Part ``bytes``: one epoch's transfers through the routing alone (planning,
routing, reads and updates of zero gradients; no scores), per variant: the
baseline (every device reads and writes its own rows), inter-device sharing
(dedup), device caches of each owner's hottest rows, negatives shared by a
step's devices, step grouping, and tables split across the devices; on
FB15k-237 and on the synthetic power-law graph of ``bench/throughput.py``.
DistMult d=100, B=50k per device, 10 chunks x 1000 negatives per direction.
Runs anywhere: ``--devices cpu,cpu`` simulates the devices (the counts are the
same as on GPUs).

Part ``step``: edges/s of the training step alone (same settings, fused
DistMult), one GPU against two, tables in pinned host memory (zero copy) and
in GPU memory (one GPU) / split across the GPUs (two), at each ``--dims``;
GPU busy per device from NVML.

Part ``processes``: two single-GPU processes at once (one per GPU, sharing
nothing): the ceiling of one process per GPU for the host step.

Part ``disk``: epochs of ``marius-py train`` over an R-MAT graph on disk
(bench/throughput.py's disk part), one GPU against two.

Part ``rows``: the zero-copy row kernels alone: a gather and an Adagrad
read-modify-write of ``--row-count`` random rows of pinned host tables, from
each GPU alone and from both at once (the links' rate for the step's row sizes).

Part ``peaks``: copy bandwidth to hold those against: pinned host to one GPU,
to both at once, and GPU to GPU (1 GiB copies, best of 5).

Part ``fb15k``: the shipped ``fb15k-237`` config, one GPU against two
(``training.batch_size`` per device, and halved), filtered test MRR.
"""

from __future__ import annotations

import argparse
import copy
import itertools
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from throughput import (STEP_SETTINGS, UtilisationSampler, measure_disk, measure_step, power_law_edges,  # noqa: E402
                        row_recorder)

from marius_py.config import load_config  # noqa: E402
from marius_py.step.runners import build_multi_device_runner  # noqa: E402
from marius_py.step.model import Model  # noqa: E402
from marius_py.random_streams import epoch_generator  # noqa: E402
from marius_py.trainer import tf32_matmuls  # noqa: E402
from marius_py.pipeline import row_kernels  # noqa: E402

BYTES_VARIANTS = {
    "baseline (no dedup)": ["pipeline.dedup=false"],
    "dedup: sharing": ["pipeline.cache_rows=0"],
    "dedup: sharing + cache": ["pipeline.cache_rows={cache}"],
    "dedup: + shared negatives": ["pipeline.cache_rows=0", "training.shared_negatives=true"],
    "dedup: + shared negatives + cache": ["pipeline.cache_rows={cache}", "training.shared_negatives=true"],
    "dedup: + grouping + shared neg. + cache": ["pipeline.cache_rows={cache}", "training.shared_negatives=true",
                                                "pipeline.step_grouping=16"],
    "dedup: split across devices": ["pipeline.placement=device"],
}


class RoutingOnly:
    """A device's step that plans and routes like training but computes zero gradients (no scores)."""

    def __init__(self, model):
        self.model = model

    def negative_draws(self, *args, **kwargs):
        return self.model.negative_draws(*args, **kwargs)

    def plan_batch(self, *args, **kwargs):
        return self.model.plan_batch(*args, **kwargs)

    def gradients(self, plan, embeddings, generator):
        return torch.zeros_like(embeddings), [], torch.zeros((), device=embeddings.device)

    def step_relations(self, gradients):
        pass


def make_runner(overrides: list[str], devices: list[torch.device], num_nodes: int, num_relations: int,
                routing_only: bool = False):
    """(config, replicas, runner) for ``devices`` with the step settings and ``overrides``."""
    names = ",".join(str(d) for d in devices)
    placed = f"training.devices={names}" if len(devices) > 1 else f"training.device={devices[0].type}"
    config = load_config(None, [*STEP_SETTINGS, placed, *overrides])
    torch.manual_seed(0)
    replicas = [Model(config, num_nodes, num_relations, devices[0])]
    for device in devices[1:]:
        replica = Model(config, num_nodes, num_relations, device)
        replica.load_state_dict(copy.deepcopy(replicas[0].state_dict()))
        replicas.append(replica)
    placement = "device" if config.pipeline.placement == "device" else "host"
    row_bytes = 2 * config.model.dim * 4
    runner = build_multi_device_runner(replicas, placement, config, devices, row_bytes)
    if routing_only:  # eager: the counts are those of the graphed runner
        runner.steps, runner.graphs = [RoutingOnly(model) for model in replicas], None
    return config, replicas, runner


def host_tables(num_nodes: int, dim: int, pin: bool):
    nodes = torch.randn(num_nodes, dim) * 1e-3
    state = torch.zeros(num_nodes, dim)
    return (nodes.pin_memory(), state.pin_memory()) if pin else (nodes, state)


def generators(devices: list[torch.device], epoch: int = 1):
    return ([epoch_generator(0, epoch, d, stream=2 + g) for g, d in enumerate(devices)],
            [epoch_generator(0, epoch, d, stream=9 + g) for g, d in enumerate(devices)])


def transfer_bytes(name: str, edges: torch.Tensor, num_nodes: int, num_relations: int, args) -> list[dict]:
    """One epoch of ``edges`` through the routing per variant: bytes by direction, against the baseline."""
    devices = [torch.device(d) for d in args.devices.split(",")]
    cache = int(args.cache_fraction * num_nodes / len(devices))
    pin = devices[0].type == "cuda"
    nodes, state = host_tables(num_nodes, 100, pin)
    rows, baseline = [], None
    for variant, overrides in BYTES_VARIANTS.items():
        overrides = [o.format(cache=cache) for o in overrides] + ["model.dim=100"]
        config, _, runner = make_runner(overrides, devices, num_nodes, num_relations, routing_only=True)
        sampling, dropout = generators(devices)
        started = time.perf_counter()
        runner.run(edges, nodes, state, None, sampling, dropout, torch.zeros((), device=devices[0]),
                   lambda n: None)
        counts = runner.counters.snapshot(100 * 4, 200 * 4)
        baseline = baseline or counts
        h2d, base = counts["host_to_device"]["bytes"], baseline["host_to_device"]["bytes"]
        row = {"part": "bytes", "dataset": name, "variant": variant, "devices": args.devices,
               "cache_rows_per_device": cache if "cache" in variant else 0, "seconds": time.perf_counter() - started,
               "h2d_saving": 1 - h2d / base,
               "shared_fraction": counts["shared_rows"] / baseline["device_rows"],
               "reused_fraction": counts["cache_hits"] / baseline["device_rows"], **counts}
        rows.append(row)
        print(f"bytes {name:<12} {variant:<40} H2D {h2d / 2**20:9.1f} MiB ({row['h2d_saving']:+6.1%})  "
              f"D2D {counts['device_to_device']['bytes'] / 2**20:8.1f} MiB  "
              f"D2H {counts['device_to_host']['bytes'] / 2**20:8.1f} MiB  rho {counts['rho']:.3f}  "
              f"sharing {row['shared_fraction']:.1%}  reuse {row['reused_fraction']:.1%}", flush=True)
    return rows


def fb15k_edges(path: str):
    """FB15k-237's train edges (preprocessed once under the workdir) with its node and relation counts."""
    from marius_py.api import load_dataset
    dataset = load_dataset(path)
    return torch.from_numpy(dataset.train), dataset.num_nodes, dataset.num_relations


def measure_runner(dim: int, placement: str, dedup: bool, args, gpus: int = 2) -> dict:
    """Edges/s of the multi-device runner's step on the first ``gpus`` GPUs (fused DistMult, power-law edges,
    tables in host memory)."""
    devices = [torch.device("cuda", g) for g in range(gpus)]
    overrides = [f"model.dim={dim}", f"pipeline.dedup={str(dedup).lower()}", "training.score_dtype=float32",
                 f"pipeline.placement={placement}", "pipeline.cache_rows=0", *args.overrides]
    config, _, runner = make_runner(overrides, devices, args.nodes, args.relations)
    nodes, state = host_tables(args.nodes, dim, pin=True)
    step_edges = config.training.batch_size * len(devices)
    edges = power_law_edges(args.nodes, step_edges * 10, args.relations)
    loss = torch.zeros((), device=devices[0])

    issued = []

    def run(num_steps: int) -> float:
        span = edges.repeat(-(-num_steps // 10), 1)[:num_steps * step_edges].pin_memory()  # as a span is
        sampling, dropout = generators(devices)
        for device in devices:
            torch.cuda.synchronize(device)
        started = time.perf_counter()
        runner.run(span, nodes, state, None, sampling, dropout, loss, lambda n: None)
        issued.append(time.perf_counter() - started)  # the host's part: launching every step
        for device in devices:
            torch.cuda.synchronize(device)
        return time.perf_counter() - started

    with tf32_matmuls(True):
        run(args.warmup_batches)
        probe = run(10)
        num_steps = max(10, int(args.seconds / probe * 10))
        samplers = [UtilisationSampler(d) for d in devices]
        for sampler in samplers:
            sampler.__enter__()
        runner.counters.reset()
        seconds = run(num_steps)
        counts = runner.counters.snapshot(dim * 4, 2 * dim * 4)
        for sampler in samplers:
            sampler.__exit__(None, None, None)
        traced = args.trace and placement == "host" and dim == args.dims[0]
        if traced:
            from torch.profiler import ProfilerActivity, profile
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                run(10)
            path = f"{args.trace.removesuffix('.json')}-{'dedup' if dedup else 'no-dedup'}.json"
            prof.export_chrome_trace(path)
            trace = summarize_trace(path, 10)
            print(json.dumps(trace, indent=1), flush=True)
    return {"part": "step", "gpus": gpus, "runner": "multi-device", "placement": placement, "dim": dim, "dedup": dedup,
            "row_tiles": zero_copy_tiles(),
            "edges_per_s": num_steps * step_edges / seconds, "seconds": seconds, "host_issue_seconds": issued[2],
            "gpu_util": [s.mean for s in samplers], "staleness_bound": runner.staleness_bound,
            "h2d_gb_per_s": counts["host_to_device"]["bytes"] / 1e9 / seconds,
            "d2d_gb_per_s": counts["device_to_device"]["bytes"] / 1e9 / seconds, "transfers": counts,
            **({"trace": trace} if traced else {})}


def measure_one(dim: int, placement: str, args) -> dict:
    one_args = argparse.Namespace(**{**vars(args), "load_threads": 1, "profile": False})
    row = measure_step(dim, placement, "float32", one_args, "graph" if placement == "device" else "fused")
    return {**row, "gpus": 1, "gpu_util": [row["gpu_util"]], "row_tiles": zero_copy_tiles()}


def zero_copy_tiles() -> list[int]:
    """The program tiles (elements) of the zero-copy gather and read-modify-write in use."""
    return [row_kernels.ZERO_COPY_GATHER_TILE, row_kernels.ZERO_COPY_ADAGRAD_TILE]


def measure_processes(dim: int, args) -> dict:
    """Two processes, one per GPU, each running the one-GPU host step; sum of their edges/s."""
    script = Path(__file__).parent / "throughput.py"
    outputs, procs = [], []
    for gpu in range(2):
        out = Path(args.workdir) / f"process-{gpu}-d{dim}.json"
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": str(gpu)}
        procs.append(subprocess.Popen([sys.executable, str(script), "--parts", "step", "--placements", "host",
                                       "--dims", str(dim), "--seconds", str(args.seconds), "--load-threads", "1",
                                       "--steps", "fused", "--json", str(out)], env=env,
                                      stdout=subprocess.DEVNULL))
        outputs.append(out)
    for proc in procs:
        proc.wait()
    rates = [json.loads(out.read_text())["rows"][0]["edges_per_s"] for out in outputs]
    return {"part": "processes", "gpus": 2, "placement": "host", "dim": dim, "edges_per_s": sum(rates),
            "per_process": rates}


def measure_peaks() -> dict:
    """GB/s of 1 GiB copies: pinned host -> GPU 0, host -> both GPUs at once, GPU 0 -> GPU 1."""
    size = 1 << 30
    host = torch.empty(size, dtype=torch.uint8, pin_memory=True)
    gpus = [torch.empty(size, dtype=torch.uint8, device=f"cuda:{g}") for g in range(2)]

    def best(copies) -> float:
        times = []
        for _ in range(5):
            for g in range(2):
                torch.cuda.synchronize(g)
            started = time.perf_counter()
            for target, source in copies:
                target.copy_(source, non_blocking=True)
            for g in range(2):
                torch.cuda.synchronize(g)
            times.append(time.perf_counter() - started)
        return len(copies) * size / min(times) / 1e9

    return {"part": "peaks", "host_to_gpu_gb_s": best([(gpus[0], host)]),
            "host_to_both_gpus_gb_s": best([(gpus[0], host), (gpus[1], host)]),
            "gpu_to_gpu_gb_s": best([(gpus[1], gpus[0])]),
            "peer_access": torch.cuda.can_device_access_peer(0, 1)}


def measure_rows(dim: int, args) -> list[dict]:
    """ms of one gather and one Adagrad read-modify-write of ``--row-count`` random rows, per GPU alone and
    both at once (each GPU its own rows, ``row % 2 == g`` as owners hold them)."""
    defaults = dict(zip(("gather", "adagrad"), zero_copy_tiles()))
    nodes, state = host_tables(args.nodes, dim, pin=True)
    generator = torch.Generator().manual_seed(1)
    picked = torch.randperm(args.nodes // 2, generator=generator)[:args.row_count] * 2
    rows = [(picked + g).sort().values.to(f"cuda:{g}") for g in range(2)]
    outs = [torch.empty(args.row_count, dim, device=f"cuda:{g}") for g in range(2)]
    grads = [torch.full((args.row_count, dim), 1e-3, device=f"cuda:{g}") for g in range(2)]
    kernels = {"gather": lambda g: row_kernels.gather_rows(nodes, rows[g], outs[g]),
               "adagrad": lambda g: row_kernels.sparse_adagrad_(nodes, state, rows[g], grads[g], None, 0.1, 1e-10)}
    results = []
    for (name, kernel), tile in itertools.product(kernels.items(), args.tiles):
        setattr(row_kernels, f"ZERO_COPY_{name.upper()}_TILE", tile)
        for gpus in ([0], [1], [0, 1]):
            times = []
            for _ in range(20):
                for g in gpus:
                    torch.cuda.synchronize(g)
                started = time.perf_counter()
                for g in gpus:
                    with torch.cuda.device(g):
                        kernel(g)
                for g in gpus:
                    torch.cuda.synchronize(g)
                times.append(time.perf_counter() - started)
            seconds = float(np.median(times[5:]))
            moved = args.row_count * dim * 4 * (1 if name == "gather" else 4) * len(gpus)
            results.append({"part": "rows", "kernel": name, "tile": tile, "gpus_at_once": gpus, "dim": dim,
                            "rows_per_gpu": args.row_count, "ms": seconds * 1e3, "gb_per_s": moved / seconds / 1e9})
        setattr(row_kernels, f"ZERO_COPY_{name.upper()}_TILE", defaults[name])
    return results


def summarize_trace(path: str, steps: int) -> dict:
    """Per device: each stream's busy ms a step, all streams' union, and the heaviest kernels (ms a step)."""
    events = [e for e in json.loads(Path(path).read_text())["traceEvents"]
              if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    for e in events:  # a peer copy names fromDevice / toDevice instead
        e["args"].setdefault("device", e["args"].get("fromDevice", e.get("pid")))
    summary = {}
    for device in sorted({e["args"]["device"] for e in events}):
        mine = [e for e in events if e["args"]["device"] == device]
        streams = {s: _busy([e for e in mine if e["args"]["stream"] == s]) / steps / 1e3
                   for s in sorted({e["args"]["stream"] for e in mine})}
        kernels: dict[str, float] = {}
        for e in mine:
            kernels[e["name"][:90]] = kernels.get(e["name"][:90], 0.0) + e["dur"] / steps / 1e3
        span = (max(e["ts"] + e["dur"] for e in mine) - min(e["ts"] for e in mine)) / steps / 1e3
        summary[f"cuda:{device}"] = {"step_span_ms": span, "any_stream_busy_ms": _busy(mine) / steps / 1e3,
                                     "stream_busy_ms": streams,
                                     "top_kernels_ms": dict(sorted(kernels.items(), key=lambda kv: -kv[1])[:15])}
    return summary


def _busy(events: list[dict]) -> float:
    """Microseconds covered by at least one of ``events``."""
    total, end = 0.0, None
    for start, finish in sorted((e["ts"], e["ts"] + e["dur"]) for e in events):
        if end is None or start > end:
            total, end = total + finish - start, finish
        elif finish > end:
            total, end = total + finish - end, finish
    return total


def measure_fb15k(args, gpus: int, extra: list[str]) -> dict:
    """The shipped fb15k-237 config trained to the end; test MRR of the best-validation checkpoint."""
    import marius_py as mp
    from marius_py.api import make_config
    names = ",".join(f"cuda:{g}" for g in range(gpus))
    devices = ["training.device=cuda"] if gpus == 1 else [f"training.devices={names}"]
    config = make_config(args.quality_config, [f"dataset.path={args.fb15k}", *devices, *extra])
    run_dir = Path(args.workdir) / f"{args.quality_config}-{gpus}gpu-{'-'.join(extra) or 'shipped'}"
    subprocess.run(["rm", "-rf", str(run_dir)], check=True)
    samplers = [UtilisationSampler(torch.device("cuda", g)) for g in range(gpus)]
    for sampler in samplers:
        sampler.__enter__()
    model = mp.train(config, run_dir, progress=False)
    for sampler in samplers:
        sampler.__exit__(None, None, None)
    epochs = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    epochs = [r for r in epochs if r.get("event") == "epoch"]
    seconds = sum(r["seconds"] for r in epochs)
    return {"part": "fb15k", "config": args.quality_config, "gpus": gpus,
            "placement": epochs[-1]["pipeline"]["placement"],
            "dim": config.model.dim, "overrides": extra, "test_mrr": model.test_metrics["mrr"],
            "hits@10": model.test_metrics["hits@10"], "train_seconds": seconds,
            "edges_per_s": float(np.mean([r["edges_per_s"] for r in epochs[1:] or epochs])),  # past compilation
            "gpu_util": [s.mean for s in samplers], "devices": epochs[-1].get("devices")}


def print_row(row: dict) -> None:
    if row["part"] == "bytes":
        return
    if row["part"] == "rows":
        print(f"rows      {row['kernel']:<8} tile {row['tile']:<6} d={row['dim']:<4} GPUs {row['gpus_at_once']}  "
              f"{row['rows_per_gpu']} rows each  {row['ms']:.3f} ms  {row['gb_per_s']:.1f} GB/s", flush=True)
        return
    if row["part"] == "peaks":
        print(f"peaks     host->GPU {row['host_to_gpu_gb_s']:.1f} GB/s, host->both GPUs "
              f"{row['host_to_both_gpus_gb_s']:.1f} GB/s, GPU->GPU {row['gpu_to_gpu_gb_s']:.1f} GB/s "
              f"(peer access: {row['peer_access']})", flush=True)
        return
    util = "/".join("-" if u is None else f"{u:.0f}%" for u in row.get("gpu_util", []) or [])
    extra = ""
    if row.get("test_mrr") is not None:
        extra = f"  test MRR {row['test_mrr']:.4f}  {row['train_seconds']:.0f} s of training"
    if "dedup" in row:
        extra += (f"  dedup={row['dedup']}  H2D {row['h2d_gb_per_s']:.1f} GB/s  D2D {row['d2d_gb_per_s']:.1f} GB/s"
                  f"  host issue {row['host_issue_seconds'] / row['seconds']:.0%} of the time")
    if row.get("per_process"):
        extra += "  per process " + " + ".join(f"{r / 1e6:.2f}" for r in row["per_process"])
    print(f"{row['part']:<9} {row['gpus']} GPU  {row['placement']:<7} d={row['dim']:<4} "
          f"{row['edges_per_s'] / 1e6:8.2f} M edges/s  GPU {util}{extra}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", nargs="+", default=["bytes", "step", "processes"],
                        choices=["peaks", "rows", "bytes", "step", "processes", "disk", "fb15k"])
    parser.add_argument("--devices", default="cuda:0,cuda:1", help="bytes: the devices (cpu,cpu simulates two)")
    parser.add_argument("--fb15k", default=".data/fb15k-237", help="FB15k-237 directory (raw or preprocessed)")
    parser.add_argument("--cache-fraction", type=float, default=0.05,
                        help="bytes: cache rows per device as a fraction of the nodes")
    parser.add_argument("--bytes-batches", type=int, default=40, help="bytes: power-law batches per epoch")
    parser.add_argument("--dims", nargs="+", type=int, default=[100, 400])
    parser.add_argument("--placements", nargs="+", default=["host", "device"])
    parser.add_argument("--nodes", type=int, default=1_000_000)
    parser.add_argument("--relations", type=int, default=100)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--warmup-batches", type=int, default=10)
    parser.add_argument("--set", dest="overrides", nargs="*", action="extend", default=[],
                        help="step: extra config overrides (repeatable)")
    parser.add_argument("--quality-config", default="fb15k-237",
                        help="fb15k: the shipped config to train (its dataset at --fb15k), e.g. codex-m")
    parser.add_argument("--row-tiles", nargs=2, type=int, metavar=("GATHER", "ADAGRAD"),
                        help="step: elements of the zero-copy kernels' program tiles (row_kernels.ZERO_COPY_*_TILE)")
    parser.add_argument("--one-gpu-again", action="store_true",
                        help="step: measure one GPU again after the two-GPU rows (a second baseline)")
    parser.add_argument("--one-gpu-runner", action="store_true",
                        help="step: also the multi-device runner (graphed) on one GPU, host tables, no dedup")
    parser.add_argument("--two-gpu-variants", nargs="*", default=["dedup", "no-dedup"], choices=["dedup", "no-dedup"],
                        help="step: which two-GPU rows to measure with host tables (none: only one GPU with host "
                        "tables; the device placement always measures two GPUs with dedup)")
    parser.add_argument("--fb15k-variants", nargs="+", default=["1", "2", "2:training.batch_size=500"],
                        help="fb15k: GPUS[:override,...] per run")
    parser.add_argument("--row-count", type=int, default=20_000, help="rows: rows per GPU")
    parser.add_argument("--tiles", nargs="+", type=int, default=[4096],
                        help="rows: elements of a zero-copy kernel program's tile (row_kernels.ZERO_COPY_*_TILE) "
                        "to compare")
    parser.add_argument("--partitions", type=int, default=16)
    parser.add_argument("--disk-edges", type=int, default=8_000_000)
    parser.add_argument("--score-dtype", default="float32")
    parser.add_argument("--workdir", default="/tmp/multi-gpu")
    parser.add_argument("--json", default=None)
    parser.add_argument("--trace", help="step: Chrome traces of ten two-GPU host steps at the first d, one per "
                        "variant (NAME-dedup.json, NAME-no-dedup.json), summarised into the JSON")
    args = parser.parse_args()
    Path(args.workdir).mkdir(parents=True, exist_ok=True)
    if args.row_tiles:
        row_kernels.ZERO_COPY_GATHER_TILE, row_kernels.ZERO_COPY_ADAGRAD_TILE = args.row_tiles
    record = row_recorder(args.json, print_row)

    if "peaks" in args.parts:
        record(measure_peaks())
    if "bytes" in args.parts:
        edges, nodes, relations = fb15k_edges(args.fb15k)
        shuffled = edges[torch.randperm(len(edges), generator=torch.Generator().manual_seed(0))]
        for row in transfer_bytes("fb15k-237", shuffled, nodes, relations, args):
            record(row)
        edges = power_law_edges(args.nodes, 50_000 * args.bytes_batches, args.relations)
        for row in transfer_bytes(f"power-law-{args.nodes // 1000}k", edges, args.nodes, args.relations, args):
            record(row)
    for dim in args.dims:
        if "rows" in args.parts:
            for row in measure_rows(dim, args):
                record(row)
        if "step" in args.parts:
            for placement in args.placements:
                record(measure_one(dim, placement, args))
                if args.one_gpu_runner and placement == "host":
                    record(measure_runner(dim, placement, False, args, gpus=1))
                for variant in args.two_gpu_variants if placement == "host" else ["dedup"]:
                    record(measure_runner(dim, placement, variant == "dedup", args))
                if args.one_gpu_again:  # the one-GPU figure moves most between processes: measured twice
                    record({**measure_one(dim, placement, args), "repeat": 2})
        if "processes" in args.parts:
            record(measure_processes(dim, args))
        if "disk" in args.parts:
            for extra in ((), ("--gpus", "2")):
                row = measure_disk(dim, argparse.Namespace(**vars(args)), extra)
                record({**row, "gpus": 2 if extra else 1, "gpu_util": [row["gpu_util"]]})
    if "fb15k" in args.parts:
        for variant in args.fb15k_variants:
            gpus, _, extra = variant.partition(":")
            record(measure_fb15k(args, int(gpus), [e for e in extra.split(",") if e]))


if __name__ == "__main__":
    main()
