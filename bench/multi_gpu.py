"""Several GPUs of one host, G for each of ``--gpus``: the links, the row kernels, bytes routed, the step alone.

    python bench/multi_gpu.py --gpus 1 2 4 --parts peaks rows step processes --json bench/results/multi-gpu.json
    python bench/multi_gpu.py --gpus 2 4 --parts bytes --simulate     # simulated on the CPU: the same counts
    python bench/multi_gpu.py --gpus 1 2 4 --parts fb15k --fb15k .data/fb15k-237

End to end (``marius-py train --gpus G``, with each GPU's busy share, the waits and the bytes on each link
per trained edge) is bench/scaling.py's; beside each of its rows it runs this script's step alone
(``measure_devices_step``).

Part ``peaks``: copy bandwidth of 1 GiB copies (best of 5): pinned host to each GPU alone, to the first G
GPUs at once, and GPU to GPU for each ordered pair.

Part ``rows``: the zero-copy row kernels alone: a gather and an Adagrad read-modify-write of
``--row-count`` random rows of pinned host tables per GPU, from each GPU alone and from the first G at once
(GPU i of G its rows ``row % G == i``, as owners hold them), per tile size (``--tiles``).

Part ``bytes``: one epoch's transfers through the routing alone on G devices (planning, routing, reads and
updates of zero gradients; no scores), per variant: the baseline (every device reads and writes its own
rows), inter-device sharing (dedup), device caches of each owner's hottest rows, negatives shared by a
step's devices, step grouping, and tables split across the devices; bytes by direction and on each link,
on FB15k-237 and on the synthetic power-law graph of ``bench/throughput.py``. DistMult d=100, B=50k per
device, 10 chunks x 1000 negatives per direction. ``--simulate`` runs the devices on the CPU.

Part ``step``: edges/s of the training step alone (fused DistMult, power-law edges, the same settings),
one GPU against G, at each ``--dims``: one GPU with pinned host tables (``host``) or tables in its memory
(``device``), G GPUs with pinned host tables (``host``; dedup and not, ``--variants``), split across
their memory (``split``) or a copy on each (``replicated``; both against one GPU's ``device``). Beside
each: every GPU's busy share (NVML), the host's share spent enqueuing (replicated runners time it) and
the GB/s on each link (the runners' counters).

Part ``processes``: G single-GPU processes at once (one per GPU, sharing nothing), each running the one-GPU
host step: the ceiling of a process per GPU with host tables.

Part ``fb15k``: the shipped ``--quality-config`` (``fb15k-237``) trained to the end on G GPUs
(``training.batch_size`` per GPU; ``--fb15k-sets`` adds runs with overrides), filtered test MRR.

Retired (git keeps it): part ``disk`` (epochs with partitions on disk, one GPU against two), which
``python bench/scaling.py --placements disk`` now measures end to end for every G.
"""

from __future__ import annotations

import argparse
import contextlib
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

from throughput import STEP_SETTINGS, UtilisationSampler, measure_step, power_law_edges, row_recorder  # noqa: E402

from marius_py.config_loading import load_config  # noqa: E402
from marius_py.pipeline import row_kernels  # noqa: E402
from marius_py.random_streams import epoch_generator  # noqa: E402
from marius_py.step.model import StepModel  # noqa: E402
from marius_py.step.runners import build_multi_device_runner  # noqa: E402
from marius_py.trainer import tf32_matmuls  # noqa: E402

BYTES_VARIANTS = {  # (the dedup rows set pipeline.dedup=true: auto would time both modes on GPUs)
    "baseline (no dedup)": ["pipeline.dedup=false"],
    "dedup: sharing": ["pipeline.cache_rows=0"],
    "dedup: sharing + cache": ["pipeline.cache_rows={cache}"],
    "dedup: + shared negatives": ["pipeline.cache_rows=0", "training.shared_negatives=true"],
    "dedup: + shared negatives + cache": ["pipeline.cache_rows={cache}", "training.shared_negatives=true"],
    "dedup: + grouping + shared neg. + cache": ["pipeline.cache_rows={cache}", "training.shared_negatives=true",
                                                "pipeline.step_grouping=16"],
    "dedup: split across devices": ["pipeline.placement=split"],
}
ONE_GPU_PLACEMENT = {"host": "host", "split": "device", "replicated": "device"}  # G GPUs' -> one GPU's
DEVICES_VARIANTS = {"dedup": ["pipeline.dedup=true"], "no-dedup": ["pipeline.dedup=false"]}


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


def gpu_devices(count: int, simulate: bool = False) -> list[torch.device]:
    """The first ``count`` GPUs, or as many simulated devices on the CPU."""
    return [torch.device("cpu") if simulate else torch.device("cuda", g) for g in range(count)]


def make_runner(settings: list[str], devices: list[torch.device], num_nodes: int, num_relations: int):
    """(config, placement, replicas, runner): the runner the trainer builds on ``devices`` for ``settings``
    (``pipeline.placement`` replicated or split, else host tables), its replicas equal."""
    placed = "training.devices=" + ",".join(map(str, devices)) if len(devices) > 1 else \
        f"training.device={devices[0].type}"
    config = load_config(None, [*settings, placed])
    torch.manual_seed(0)
    replicas = [StepModel(config, num_nodes, num_relations, devices[0])]
    for device in devices[1:]:
        replica = StepModel(config, num_nodes, num_relations, device)
        replica.load_state_dict(copy.deepcopy(replicas[0].state_dict()))
        replicas.append(replica)
    placement = config.pipeline.placement if config.pipeline.placement in ("split", "replicated") else "host"
    dim = config.model.dim
    row_bytes = (dim + state_dim(replicas)) * 4
    return config, placement, replicas, build_multi_device_runner(replicas, placement, config, devices, row_bytes)


def state_dim(replicas: list[StepModel]) -> int:
    """Columns of the node optimizer's state (row-wise Adagrad: 1)."""
    return replicas[0].node_optimizer.state_dim(replicas[0].config.model.dim)


def make_tables(num_nodes: int, dim: int, width: int, where: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Node embeddings and optimizer state (``width`` columns) on ``where`` (pinned on the host: kernels on the
    GPUs read and write them in place)."""
    nodes = (torch.randn(num_nodes, dim) * 1e-3).to(where)
    state = torch.zeros(num_nodes, width, device=where)
    if where.type == "cpu" and torch.cuda.is_available():
        nodes, state = nodes.pin_memory(), state.pin_memory()
    return nodes, state


def generators(devices: list[torch.device], epoch: int = 1):
    return ([epoch_generator(0, epoch, d, stream=2 + g) for g, d in enumerate(devices)],
            [epoch_generator(0, epoch, d, stream=9 + g) for g, d in enumerate(devices)])


# ---- bytes on each link: a counters snapshot's ``links`` (bench/scaling.py reads the epoch record's) ----
def added(a, b):
    """Two snapshots' ``links`` (a dict of nested lists of bytes) added element by element."""
    if isinstance(a, dict):
        return {key: added(value, b[key]) for key, value in a.items()}
    return [added(x, y) for x, y in zip(a, b)] if isinstance(a, list) else a + b


def scaled(links, factor: float):
    """``links`` (a dict or nested lists of bytes) times ``factor`` (1 / edges: bytes per trained edge)."""
    if isinstance(links, dict):
        return {key: scaled(value, factor) for key, value in links.items()}
    return [scaled(x, factor) for x in links] if isinstance(links, list) else links * factor


def link_totals(links: dict) -> dict:
    """Bytes over all host links and over all pairs of devices."""
    return {"host_to_device": sum(links["host_to_device"]), "device_to_host": sum(links["device_to_host"]),
            "device_to_device": sum(map(sum, links["device_to_device"]))}


# ---- the step alone on G GPUs (bench/scaling.py runs it beside each row) ----
def measure_devices_step(gpus: int, placement: str, settings: list[str], edges: torch.Tensor, seconds: float,
                         num_nodes: int, num_relations: int, trace: str | None = None) -> dict:
    """The step alone on ``gpus`` GPUs: the runner of ``placement`` (replicated, split or host) training
    ``edges`` over and over from tables already in place; edges/s of ``seconds`` after a warm-up span, each
    GPU's busy share, the host's share enqueuing and the GB/s on each link. ``trace``: a Chrome trace of one
    more span there, summarised into the row."""
    devices = gpu_devices(gpus)
    config, placement, replicas, runner = make_runner([*settings, f"pipeline.placement={placement}"], devices,
                                                      num_nodes, num_relations)
    nodes, state = make_tables(num_nodes, config.model.dim, state_dim(replicas),
                               devices[0] if placement == "replicated" else torch.device("cpu"))
    edges, loss = edges.to(devices[0]), torch.zeros((), device=devices[0])

    def run() -> float:
        for d in devices:
            torch.cuda.synchronize(d)
        started = time.perf_counter()
        runner.run(edges, nodes, state, None, *generators(devices), loss, lambda n: None)
        return time.perf_counter() - started  # (run returns with every device synchronised)

    with tf32_matmuls(True):
        run()  # warm-up: kernels compiled, graphs captured
        runner.counters.reset()
        enqueued = getattr(runner, "host_seconds", None)  # (replicated runners time their enqueuing)
        timed, rounds, busy = timed_runs(run, devices, seconds)
        if enqueued is not None:
            enqueued = runner.host_seconds - enqueued
        counts = runner.counters.snapshot(config.model.dim * 4, (nodes.shape[1] + state.shape[1]) * 4)
        summary = trace_span(run, trace, len(edges) // (config.training.batch_size * gpus)) if trace else None
    if getattr(runner, "close", None) is not None:  # (a process per GPU: its workers and group end here)
        runner.close()
    return {"edges_per_s": rounds * len(edges) / timed, "seconds": timed,
            "host_share": None if enqueued is None else enqueued / timed, "gpu_busy": busy,
            "placement_run": placement, "staleness_bound": runner.effective_staleness, "transfers": counts,
            "links_gb_per_s": scaled(counts.get("links", {}), 1e-9 / timed),
            **({"trace": summary} if summary else {})}


def timed_runs(run, devices: list[torch.device], seconds: float) -> tuple[float, int, list]:
    """``run()`` (returning its seconds) again until ``seconds`` are timed: (seconds, runs, each device's busy
    share while they ran)."""
    timed, rounds = 0.0, 0
    with contextlib.ExitStack() as stack:
        samplers = [stack.enter_context(UtilisationSampler(d)) for d in devices]
        while timed < seconds:
            timed += run()
            rounds += 1
    return timed, rounds, [sampler.mean for sampler in samplers]


def trace_span(run, path: str, steps: int) -> dict:
    """Profile one span of ``run``: a Chrome trace at ``path``, summarised per device."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        run()
    prof.export_chrome_trace(path)
    return summarize_trace(path, steps)


def step_part_settings(dim: int, args) -> list[str]:
    """The step part's settings (fused DistMult, float32 scores, no row caches) at ``dim``."""
    return [*STEP_SETTINGS, f"model.dim={dim}", "training.score_dtype=float32", "pipeline.cache_rows=0",
            *args.overrides]


def measure_one(dim: int, placement: str, args) -> dict:
    """One GPU's step (the span runner; bench/throughput.py's measure_step) at ``placement``."""
    one_args = argparse.Namespace(**{**vars(args), "load_threads": 1, "profile": False})
    row = measure_step(dim, placement, "float32", one_args, "graph" if placement == "device" else "fused",
                       extra=tuple(args.overrides))
    return {**row, "gpus": 1, "variant": "", "gpu_busy": [row["gpu_util"]], "row_tiles": zero_copy_tiles()}


def measure_devices(dim: int, placement: str, variant: str, gpus: int, args, one: dict) -> dict:
    """G GPUs' step at ``placement`` against ``one`` (one GPU's row at its counterpart placement)."""
    step_edges = 50_000 * gpus
    edges = power_law_edges(args.nodes, step_edges * args.span_steps, args.relations)
    trace = f"{args.trace.removesuffix('.json')}-g{gpus}-{placement}-{variant}.json" \
        if args.trace and dim == args.dims[0] else None
    row = measure_devices_step(gpus, placement, [*step_part_settings(dim, args), *DEVICES_VARIANTS.get(variant, [])],
                               edges, args.seconds, args.nodes, args.relations, trace)
    return {"part": "step", "gpus": gpus, "placement": placement, "variant": variant, "dim": dim,
            "row_tiles": zero_copy_tiles(), "speedup": row["edges_per_s"] / one["edges_per_s"],
            "one_gpu_placement": one["placement"], **row}


def zero_copy_tiles() -> list[int]:
    """The program tiles (elements) of the zero-copy gather and read-modify-write in use."""
    return [row_kernels.ZERO_COPY_GATHER_TILE, row_kernels.ZERO_COPY_ADAGRAD_TILE]


def step_rows(dim: int, args):
    """The step part at ``dim``: per placement, one GPU's row, then each G's (variants of host tables)."""
    ones: dict[str, dict] = {}
    for placement in args.placements:
        single = ONE_GPU_PLACEMENT[placement]
        if single not in ones:
            ones[single] = measure_one(dim, single, args)
            yield ones[single]
        if args.one_gpu_runner and placement == "host":
            yield measure_devices(dim, "host", "no-dedup", 1, args, ones[single])
        for gpus in (g for g in args.gpus if g > 1):
            for variant in args.variants if placement == "host" else [""]:
                yield measure_devices(dim, placement, variant, gpus, args, ones[single])
        if args.one_gpu_again:  # the one-GPU figure moves most between processes: measured twice
            yield {**measure_one(dim, single, args), "repeat": 2}


# ---- bytes through the routing alone ----
def transfer_bytes(name: str, edges: torch.Tensor, num_nodes: int, num_relations: int, gpus: int, args) -> list[dict]:
    """One epoch of ``edges`` through the routing of ``gpus`` devices per variant: bytes by direction and
    on each link, against the baseline."""
    devices = gpu_devices(gpus, args.simulate)
    cache = int(args.cache_fraction * num_nodes / gpus)
    rows, baseline = [], None
    for variant, overrides in BYTES_VARIANTS.items():
        settings = [*STEP_SETTINGS, "model.dim=100", "pipeline.dedup=true", *(o.format(cache=cache) for o in overrides),
                    *args.overrides]
        config, _, replicas, runner = make_runner(settings, devices, num_nodes, num_relations)
        runner.steps, runner.graphs = [RoutingOnly(model) for model in replicas], None  # eager: the same counts
        nodes, state = make_tables(num_nodes, 100, state_dim(replicas), torch.device("cpu"))
        started = time.perf_counter()
        runner.run(edges, nodes, state, None, *generators(devices), torch.zeros((), device=devices[0]),
                   lambda n: None)
        counts = runner.counters.snapshot(100 * 4, (nodes.shape[1] + state.shape[1]) * 4)
        baseline = baseline or counts
        h2d, base = counts["host_to_device"]["bytes"], baseline["host_to_device"]["bytes"]
        row = {"part": "bytes", "dataset": name, "variant": variant, "gpus": gpus, "devices": list(map(str, devices)),
               "cache_rows_per_device": cache if "cache" in variant else 0, "seconds": time.perf_counter() - started,
               "h2d_saving": 1 - h2d / base, "shared_fraction": counts["shared_rows"] / baseline["device_rows"],
               "reused_fraction": counts["cache_hits"] / baseline["device_rows"],
               "links_per_edge": scaled(counts["links"], 1 / len(edges)), **counts}
        rows.append(row)
    return rows


def fb15k_edges(path: str):
    """FB15k-237's train edges (preprocessed once under the workdir) with its node and relation counts."""
    from marius_py.api import load_dataset
    dataset = load_dataset(path)
    return torch.from_numpy(dataset.train), dataset.num_nodes, dataset.num_relations


def bytes_rows(args):
    """The bytes part: FB15k-237 (shuffled) and the power-law graph on each G of at least two devices."""
    edges, nodes, relations = fb15k_edges(args.fb15k)
    shuffled = edges[torch.randperm(len(edges), generator=torch.Generator().manual_seed(0))]
    power_law = power_law_edges(args.nodes, 50_000 * args.bytes_batches, args.relations)
    for gpus in (g for g in args.gpus if g > 1):
        yield from transfer_bytes("fb15k-237", shuffled, nodes, relations, gpus, args)
        yield from transfer_bytes(f"power-law-{args.nodes // 1000}k", power_law, args.nodes, args.relations, gpus,
                                  args)


# ---- G processes, links and row kernels ----
def measure_processes(dim: int, gpus: int, args) -> dict:
    """``gpus`` processes, one per GPU, each running the one-GPU host step; the sum of their edges/s."""
    script = Path(__file__).parent / "throughput.py"
    outputs, procs = [], []
    for gpu in range(gpus):
        out = Path(args.workdir) / f"process-{gpu}-of-{gpus}-d{dim}.json"
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": str(gpu)}
        procs.append(subprocess.Popen([sys.executable, str(script), "--parts", "step", "--placements", "host",
                                       "--dims", str(dim), "--seconds", str(args.seconds), "--load-threads", "1",
                                       "--steps", "fused", "--json", str(out)], env=env,
                                      stdout=subprocess.DEVNULL))
        outputs.append(out)
    for proc in procs:
        if proc.wait():
            raise subprocess.CalledProcessError(proc.returncode, proc.args)
    rates = [json.loads(out.read_text())["rows"][0]["edges_per_s"] for out in outputs]
    return {"part": "processes", "gpus": gpus, "placement": "host", "dim": dim, "edges_per_s": sum(rates),
            "per_process": rates}


def synchronize(gpus) -> None:
    for g in gpus:
        torch.cuda.synchronize(g)


def best_seconds(work, gpus, repeats: int = 5) -> float:
    """The fastest of ``repeats`` runs of ``work`` (every GPU in ``gpus`` synchronised around each)."""
    times = []
    for _ in range(repeats):
        synchronize(gpus)
        started = time.perf_counter()
        work()
        synchronize(gpus)
        times.append(time.perf_counter() - started)
    return min(times)


def measure_peaks(counts: list[int]) -> list[dict]:
    """GB/s of 1 GiB copies: pinned host -> each GPU alone, -> the first G at once (each G of ``counts``),
    and GPU -> GPU for each ordered pair."""
    size, every = 1 << 30, range(max(counts))
    host = torch.empty(size, dtype=torch.uint8, pin_memory=True)
    memory = [torch.empty(size, dtype=torch.uint8, device=f"cuda:{g}") for g in every]

    def rate(copies: list[tuple[int, int | None]]) -> float:  # (target GPU, source GPU or None: the host)
        def work():
            for target, source in copies:
                memory[target].copy_(host if source is None else memory[source], non_blocking=True)
        return len(copies) * size / best_seconds(work, every) / 1e9

    rows = []
    for at_once in [[g] for g in every] + [list(range(g)) for g in counts if g > 1]:
        rows.append({"part": "peaks", "link": "host->GPU", "gpus_at_once": at_once,
                     "gb_per_s": rate([(g, None) for g in at_once])})
    for source, target in itertools.permutations(every, 2):
        rows.append({"part": "peaks", "link": "GPU->GPU", "gpus_at_once": [source, target],
                     "gb_per_s": rate([(target, source)]),
                     "peer_access": torch.cuda.can_device_access_peer(target, source)})
    return rows


def measure_rows(dim: int, counts: list[int], args) -> list[dict]:
    """ms of one gather and one Adagrad read-modify-write of ``--row-count`` random rows per GPU, from each GPU
    alone and from the first G at once (each G of ``counts``; GPU i of G its rows ``row % G == i``)."""
    defaults = dict(zip(("gather", "adagrad"), zero_copy_tiles()))
    nodes, state = make_tables(args.nodes, dim, dim, torch.device("cpu"))  # (full Adagrad's state)
    every = range(max(counts))
    sets = [[g] for g in every] + [list(range(g)) for g in counts if g > 1]
    results = []
    for name, tile in itertools.product(("gather", "adagrad"), args.tiles):
        setattr(row_kernels, f"ZERO_COPY_{name.upper()}_TILE", tile)
        for gpus in sets:
            kernels = [row_kernel(name, nodes, state, owned_rows(args, i, len(gpus)), g) for i, g in enumerate(gpus)]
            times = []
            for _ in range(20):
                times.append(best_seconds(lambda: [kernel() for kernel in kernels], gpus, repeats=1))
            seconds = float(np.median(times[5:]))
            moved = args.row_count * dim * 4 * (1 if name == "gather" else 4) * len(gpus)
            results.append({"part": "rows", "kernel": name, "tile": tile, "gpus_at_once": gpus, "dim": dim,
                            "rows_per_gpu": args.row_count, "ms": seconds * 1e3, "gb_per_s": moved / seconds / 1e9})
        setattr(row_kernels, f"ZERO_COPY_{name.upper()}_TILE", defaults[name])
    return results


def owned_rows(args, owner: int, owners: int) -> torch.Tensor:
    """``--row-count`` distinct random rows of ``owner`` among ``owners`` (``row % owners == owner``), sorted."""
    generator = torch.Generator().manual_seed(1)
    picked = torch.randperm(args.nodes // owners, generator=generator)[:args.row_count] * owners + owner
    return picked.sort().values


def row_kernel(name: str, nodes: torch.Tensor, state: torch.Tensor, rows: torch.Tensor, gpu: int):
    """A function running kernel ``name`` (gather or adagrad) on ``rows`` of the host tables from ``gpu``."""
    device = torch.device("cuda", gpu)
    rows = rows.to(device)
    out = torch.empty(len(rows), nodes.shape[1], device=device)
    grads = torch.full((len(rows), nodes.shape[1]), 1e-3, device=device)

    def gather():
        with torch.cuda.device(device):
            row_kernels.gather_rows(nodes, rows, out)

    def adagrad():
        with torch.cuda.device(device):
            row_kernels.sparse_adagrad_(nodes, state, rows, grads, None, 0.1, 1e-10)
    return gather if name == "gather" else adagrad


# ---- traces ----
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


# ---- accuracy ----
def measure_fb15k(args, gpus: int, extra: list[str]) -> dict:
    """The shipped config trained to the end on ``gpus`` GPUs; test MRR of the best-validation checkpoint."""
    import marius_py as mp
    from marius_py.api import make_config
    names = ",".join(map(str, gpu_devices(gpus)))
    devices = ["training.device=cuda"] if gpus == 1 else [f"training.devices={names}"]
    config = make_config(args.quality_config, [f"dataset.path={args.fb15k}", *devices, *extra])
    run_dir = Path(args.workdir) / f"{args.quality_config}-{gpus}gpu-{'-'.join(extra) or 'shipped'}"
    subprocess.run(["rm", "-rf", str(run_dir)], check=True)
    with contextlib.ExitStack() as stack:
        samplers = [stack.enter_context(UtilisationSampler(d)) for d in gpu_devices(gpus)]
        model = mp.train(config, run_dir, progress=False)
    epochs = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    epochs = [r for r in epochs if r.get("event") == "epoch"]
    return {"part": "fb15k", "config": args.quality_config, "gpus": gpus, "variant": ",".join(extra),
            "placement": epochs[-1]["pipeline"]["placement"],
            "dim": config.model.dim, "overrides": extra, "test_mrr": model.test_metrics["mrr"],
            "hits@10": model.test_metrics["hits@10"], "train_seconds": sum(r["seconds"] for r in epochs),
            "edges_per_s": float(np.mean([r["edges_per_s"] for r in epochs[1:] or epochs])),  # past compilation
            "gpu_busy": [s.mean for s in samplers], "devices": epochs[-1].get("devices")}


# ---- output ----
def print_row(row: dict) -> None:
    part = row["part"]
    if part == "bytes":
        totals = link_totals(row["links"])
        print(f"bytes     {row['dataset']:<14} {row['gpus']} devices  {row['variant']:<40} "
              f"H2D {totals['host_to_device'] / 2**20:9.1f} MiB ({row['h2d_saving']:+6.1%})  "
              f"D2D {totals['device_to_device'] / 2**20:8.1f} MiB  D2H {totals['device_to_host'] / 2**20:8.1f} MiB  "
              f"rho {row['rho']:.3f}  sharing {row['shared_fraction']:.1%}  reuse {row['reused_fraction']:.1%}",
              flush=True)
    elif part == "rows":
        print(f"rows      {row['kernel']:<8} tile {row['tile']:<6} d={row['dim']:<4} GPUs {row['gpus_at_once']}  "
              f"{row['rows_per_gpu']} rows each  {row['ms']:.3f} ms  {row['gb_per_s']:.1f} GB/s", flush=True)
    elif part == "peaks":
        print(f"peaks     {row['link']:<10} GPUs {row['gpus_at_once']}  {row['gb_per_s']:.1f} GB/s"
              + (f"  (peer access: {row['peer_access']})" if "peer_access" in row else ""), flush=True)
    else:
        print(f"{part:<9} {row['gpus']} GPU  {row['placement']:<10} {row.get('variant', ''):<8} d={row['dim']:<4} "
              f"{row['edges_per_s'] / 1e6:8.2f} M edges/s  {_details(row)}", flush=True)


def _details(row: dict) -> str:
    """A step, processes or fb15k row's figures beside its edges/s."""
    busy = "/".join("-" if u is None else f"{u:.0f}%" for u in row.get("gpu_busy") or [])
    text = f"GPU busy {busy}" if busy else ""
    if "speedup" in row:
        text += f"  x{row['speedup']:.2f} of one GPU's {row['one_gpu_placement']}"
    if row.get("host_share") is not None:
        text += f"  host enqueuing {row['host_share']:.0%}"
    if row.get("links_gb_per_s"):
        rates = row["links_gb_per_s"]
        text += f"  host->GPU {'/'.join(f'{r:.1f}' for r in rates['host_to_device'])} GB/s" \
                f"  GPU->GPU {sum(map(sum, rates['device_to_device'])):.1f} GB/s"
    if row.get("test_mrr") is not None:
        text += f"  test MRR {row['test_mrr']:.4f}  {row['train_seconds']:.0f} s of training"
    if row.get("per_process"):
        text += "  per process " + " + ".join(f"{r / 1e6:.2f}" for r in row["per_process"])
    return text


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", nargs="+", type=int, default=[1, 2, 4],
                        help="G: GPU counts to measure (every part; one GPU is the step part's baseline)")
    parser.add_argument("--parts", nargs="+", default=["bytes", "step", "processes"],
                        choices=["peaks", "rows", "bytes", "step", "processes", "fb15k"])
    parser.add_argument("--simulate", action="store_true", help="bytes: simulate the devices on the CPU")
    parser.add_argument("--fb15k", default=".data/fb15k-237", help="FB15k-237 directory (raw or preprocessed)")
    parser.add_argument("--cache-fraction", type=float, default=0.05,
                        help="bytes: cache rows per device as a fraction of the nodes")
    parser.add_argument("--bytes-batches", type=int, default=40, help="bytes: power-law batches per epoch")
    parser.add_argument("--dims", nargs="+", type=int, default=[100, 400])
    parser.add_argument("--placements", nargs="+", default=["host", "split", "replicated"],
                        choices=list(ONE_GPU_PLACEMENT), help="step: G GPUs' placements")
    parser.add_argument("--variants", nargs="+", default=list(DEVICES_VARIANTS), choices=list(DEVICES_VARIANTS),
                        help="step: G GPUs with host tables, with dedup and without")
    parser.add_argument("--nodes", type=int, default=1_000_000)
    parser.add_argument("--relations", type=int, default=100)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--span-steps", type=int, default=50, help="step: steps of a span, trained over and over")
    parser.add_argument("--warmup-batches", type=int, default=10, help="step: one GPU's warm-up batches")
    parser.add_argument("--set", dest="overrides", nargs="*", action="extend", default=[],
                        help="step and bytes: extra config overrides (repeatable)")
    parser.add_argument("--quality-config", default="fb15k-237",
                        help="fb15k: the shipped config to train (its dataset at --fb15k), e.g. codex-m")
    parser.add_argument("--fb15k-sets", nargs="*", default=[""], metavar="KEY=VALUE,...",
                        help="fb15k: one run per set of overrides on each G ('': the shipped config)")
    parser.add_argument("--row-tiles", nargs=2, type=int, metavar=("GATHER", "ADAGRAD"),
                        help="step: elements of the zero-copy kernels' program tiles (row_kernels.ZERO_COPY_*_TILE)")
    parser.add_argument("--one-gpu-again", action="store_true",
                        help="step: measure one GPU again after the G-GPU rows (a second baseline)")
    parser.add_argument("--one-gpu-runner", action="store_true",
                        help="step: also the multi-device runner on one GPU, host tables, no dedup")
    parser.add_argument("--row-count", type=int, default=20_000, help="rows: rows per GPU")
    parser.add_argument("--tiles", nargs="+", type=int, default=[4096],
                        help="rows: elements of a zero-copy kernel program's tile (row_kernels.ZERO_COPY_*_TILE) "
                        "to compare")
    parser.add_argument("--workdir", default="/tmp/multi-gpu")
    parser.add_argument("--json", default=None)
    parser.add_argument("--trace", help="step: Chrome traces of one G-GPU span at the first d, one per row "
                        "(NAME-gG-PLACEMENT-VARIANT.json), summarised into the JSON")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    Path(args.workdir).mkdir(parents=True, exist_ok=True)
    if args.row_tiles:
        row_kernels.ZERO_COPY_GATHER_TILE, row_kernels.ZERO_COPY_ADAGRAD_TILE = args.row_tiles
    record = row_recorder(args.json, print_row)
    if "peaks" in args.parts:
        for row in measure_peaks(args.gpus):
            record(row)
    if "bytes" in args.parts:
        for row in bytes_rows(args):
            record(row)
    for dim in args.dims:
        if "rows" in args.parts:
            for row in measure_rows(dim, args.gpus, args):
                record(row)
        if "step" in args.parts:
            for row in step_rows(dim, args):
                record(row)
        if "processes" in args.parts:
            for gpus in args.gpus:
                record(measure_processes(dim, gpus, args))
    if "fb15k" in args.parts:
        for gpus, extra in itertools.product(args.gpus, args.fb15k_sets):
            record(measure_fb15k(args, gpus, [e for e in extra.split(",") if e]))


if __name__ == "__main__":
    main()
