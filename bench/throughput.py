"""Training throughput on a GPU: each placement at d=100 and d=400, then disk partitions.

    python bench/throughput.py --parts step disk --json bench/results/throughput.json

Part ``step``: the training step alone through the pipeline of a placement
(``device``: tables in GPU memory; ``host``: tables in host memory, the
five stages), on random power-law edges over ``--nodes`` nodes, DistMult,
batches of 50,000 edges, 10 chunks x 1,000 shared negatives per direction (the
setting of the issue's unfused baseline). Edges/s are timed over
``--seconds`` after a warm-up; GPU utilisation is sampled through NVML.

Part ``disk``: whole epochs of the trainer over a preprocessed R-MAT graph with
its embeddings on disk in ``--partitions`` partitions and a buffer of p/4
(BETA ordering).

``--table-dtypes float32 bfloat16``: step and disk rows with the node tables
stored in each (``storage.dtype``; bfloat16 tables take the gathered fused
step, without CUDA graphs).

Part ``fb15k``: FB15k-237 (``--fb15k``) for ``--budget`` seconds of training
each: our shipped 1-vs-all config and a sampled-negative one, then PyKEEN and
PyTorch-BigGraph with their recommended settings (bench/peers.py; install them
from wheels, never as project dependencies), each with its filtered test MRR.

Part ``stale``: the sampled FB15k-237 config with the host placement for
``--stale-epochs`` epochs at staleness bounds ``--bounds``: test MRR and edges/s.

Every row is printed as a table and written to ``--json`` as it completes.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import torch


from marius_py.step.runners import build_span_runner
from marius_py.config_loading import load_config
from marius_py.step.model import StepModel
from marius_py.random_streams import epoch_generator
from marius_py.trainer import tf32_matmuls

STEP_SETTINGS = ["model.decoder=distmult", "model.loss=softmax_ce", "training.batch_size=50000",
                 "training.num_chunks=10", "training.num_negatives=1000", "model.reg_weight=0"]
# --decoders names beyond the decoders' own: TransE's two distances, RotatE's L2 norm.
DECODER_SETTINGS = {"transe-l1": ["model.decoder=transe", "model.norm=1"],
                    "transe-l2": ["model.decoder=transe", "model.norm=2"],
                    "rotate-l2": ["model.decoder=rotate", "model.norm=2"]}


class UtilisationSampler:
    """Mean GPU utilisation (NVML, percent) while the block runs; None without NVML. NVML reads the whole
    GPU: another process's kernels count too (bench/e2e.py samples the command it runs)."""

    def __init__(self, device: torch.device, interval: float = 0.05):
        self.device, self.interval, self.samples = device, interval, []
        self.times: list[float] = []  # time.monotonic() of each sample
        self._stop = threading.Event()

    def __enter__(self):
        try:
            torch.cuda.utilization(self.device)
        except Exception:  # no NVML bindings: report no figure rather than fail the run
            return self
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self):
        while not self._stop.wait(self.interval):
            self.samples.append(torch.cuda.utilization(self.device))
            self.times.append(time.monotonic())

    def __exit__(self, *exc):
        self._stop.set()
        if hasattr(self, "_thread"):
            self._thread.join()

    @property
    def mean(self) -> float | None:
        return float(np.mean(self.samples)) if self.samples else None

    def mean_within(self, windows: list[tuple[float, float]]) -> float | None:
        """Mean of the samples taken within any of ``windows`` (time.monotonic() start and end)."""
        inside = [s for t, s in zip(self.times, self.samples) if any(a <= t <= b for a, b in windows)]
        return float(np.mean(inside)) if inside else None


def power_law_edges(num_nodes: int, num_edges: int, num_relations: int, seed: int = 0) -> torch.Tensor:
    """Edges whose endpoints follow a Zipf-like degree distribution (ids shuffled)."""
    rng = np.random.default_rng(seed)
    ranks = np.minimum((rng.pareto(1.2, size=2 * num_edges) * 10).astype(np.int64), num_nodes - 1)
    ids = rng.permutation(num_nodes)[ranks]
    relations = rng.integers(num_relations, size=num_edges)
    return torch.from_numpy(np.stack([ids[:num_edges], relations, ids[num_edges:]], axis=1))


STEP_VARIANTS = {"graph": ["training.fused_step=true", "training.cuda_graphs=true"],
                 "fused": ["training.fused_step=true", "training.cuda_graphs=false"],
                 "autograd": ["training.fused_step=false"]}


def measure_step(dim: int, placement: str, score_dtype: str, args, step: str = "graph",
                 decoder: str = "distmult", table_dtype: str = "float32", extra: tuple[str, ...] = (),
                 edges: torch.Tensor | None = None) -> dict:
    """The step alone; ``extra``: overrides applied last (bench/e2e.py passes the command's settings),
    ``edges``: the batches to train (default power-law edges over ``args.nodes``)."""
    device = torch.device("cuda")
    decoder_settings = DECODER_SETTINGS.get(decoder, [f"model.decoder={decoder}"])
    config = load_config(None, [*STEP_SETTINGS, *decoder_settings, f"model.dim={dim}", *STEP_VARIANTS[step],
                                f"pipeline.placement={placement}", "training.device=cuda",
                                f"training.score_dtype={score_dtype}", f"pipeline.load_threads={args.load_threads}",
                                *extra])
    model = StepModel(config, args.nodes, args.relations, device)
    table_device = device if placement == "device" else torch.device("cpu")
    dtype = getattr(torch, table_dtype)  # storage.dtype
    nodes = (torch.randn(args.nodes, dim) * 1e-3).to(table_device, dtype)
    state = torch.zeros(args.nodes, model.node_optimizer.state_dim(dim), device=table_device, dtype=dtype)  # (row-wise: 1)
    if placement == "host":
        nodes, state = nodes.pin_memory(), state.pin_memory()
    runner = build_span_runner(model, placement, config, device)
    batch = config.training.batch_size
    sampling = epoch_generator(0, 1, device if runner.zero_copy else table_device)  # where the trainer draws
    # Where the runner reads a span's edges from (it moves them there once per span, as the trainer does).
    if edges is None:
        edges = power_law_edges(args.nodes, batch * 40, args.relations)
    edges = edges.to(device if runner.fused_step is not None else sampling.device)
    dropout = epoch_generator(0, 1, device, stream=1)
    loss = torch.zeros((), device=device)

    def run(num_batches: int) -> float:
        torch.cuda.synchronize()
        started = time.perf_counter()
        done = 0
        while done < num_batches:
            count = min(num_batches - done, len(edges) // batch)
            runner.run(edges[:count * batch], nodes, state, None, sampling, dropout, loss, lambda n: None)
            done += count
        torch.cuda.synchronize()
        return time.perf_counter() - started

    with tf32_matmuls(True):
        warmup_started = time.perf_counter()
        run(args.warmup_batches)
        warmup = time.perf_counter() - warmup_started
        probe = run(5)
        num_batches = max(5, int(args.seconds / probe * 5))
        with UtilisationSampler(device) as utilisation:
            seconds = run(num_batches)
        if args.profile:
            print_profile(lambda: run(3), f"{placement} d={dim} scores={score_dtype}")
    step = "graph" if runner.graphed_step and dtype == torch.float32 else \
        "fused" if runner.fused_step else "autograd"  # (bfloat16 tables: the gathered fused step, no graph)
    return {"part": "step", "placement": placement, "dim": dim, "score_dtype": score_dtype, "step": step,
            "decoder": decoder, "table_dtype": table_dtype,
            "edges_per_s": num_batches * batch / seconds, "gpu_util": utilisation.mean,
            "batches": num_batches, "seconds": seconds, "warmup_seconds": warmup,
            "staleness_bound": runner.staleness_bound, "load_threads": args.load_threads}


def print_profile(work, title: str) -> None:
    """The kernels that take the GPU's time in ``work`` (torch.profiler)."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        work()
    print(f"--- profile: {title}")
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=18, max_name_column_width=60))
    print(prof.key_averages(group_by_input_shape=True).table(sort_by="cuda_time_total", row_limit=25,
                                                             max_name_column_width=40, max_shapes_column_width=80))


def measure_disk(dim: int, args, extra: tuple[str, ...] = ()) -> dict:
    """Epochs of the trainer with embeddings on disk: p partitions, a buffer of p/4 (``extra``: overrides)."""
    workdir = Path(args.workdir)
    dataset = workdir / f"rmat-p{args.partitions}"
    if not (dataset / "metadata.json").exists():
        edges_file = workdir / "rmat.tsv"
        subprocess.run([sys.executable, str(Path(__file__).parent / "rmat.py"), "--nodes", str(args.nodes),
                        "--edges", str(args.disk_edges), "--out", str(edges_file)], check=True)
        subprocess.run([sys.executable, "-m", "marius_py.cli", "preprocess", "--train", str(edges_file),
                        "--pairs", "--partitions", str(args.partitions), "--output", str(dataset)], check=True)
    run_dir = workdir / f"run-disk-d{dim}{'-'.join(extra)}"
    subprocess.run(["rm", "-rf", str(run_dir)], check=True)
    command = [sys.executable, "-m", "marius_py.cli", "train", "--run-dir", str(run_dir), "--quiet",
               "--partitions", str(args.partitions), "--buffer", str(args.partitions // 4),
               f"dataset.path={dataset}", f"model.dim={dim}", "training.epochs=2",
               "evaluation.every=0", "evaluation.protocol=sampled", "training.device=cuda",
               "storage.ordering=beta",  # the rows recorded so far; comet (the default) reads more per epoch
               *STEP_SETTINGS, f"training.score_dtype={args.score_dtype}", *extra]
    with UtilisationSampler(torch.device("cuda")) as utilisation:
        subprocess.run(command, check=True)
    epochs = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    last = [r for r in epochs if r.get("event") == "epoch"][-1]
    return {"part": "disk", "placement": last["pipeline"]["placement"], "dim": dim,
            "score_dtype": args.score_dtype,
            "edges_per_s": last["edges_per_s"], "gpu_util": utilisation.mean, "seconds": last["seconds"],
            "partitions": args.partitions, "buffer": args.partitions // 4, "io": last.get("io"),
            "table_dtype": next((o.split("=")[1] for o in extra if o.startswith("storage.dtype=")), "float32"),
            "devices": last.get("devices"), "overrides": list(extra)}


# Our FB15k-237 settings: the shipped 1-vs-all config, and a sampled-negative one made for speed.
FB15K_CONFIGS = {
    "1vsall": ("fb15k-237", []),
    "sampled": ("fb15k-237", ["training.batch_size=10000", "training.num_chunks=10",
                              "training.num_negatives=1000", "training.degree_fraction=0.5"]),
}
TARGET_MRR = 0.33


def train_for_budget(name: str, args, extra: list[str], budget: float, eval_every: int = 1) -> dict:
    """Train an FB15k-237 config for ``budget`` seconds of training; test MRR along the way.

    Test evaluations are not counted in the training time; ``seconds_to_target``
    is the training time of the first evaluated epoch at or above TARGET_MRR.
    """
    from marius_py.api import load_dataset, make_config
    from marius_py.trainer import Trainer
    config_name, overrides = FB15K_CONFIGS[name]
    config = make_config(config_name, [f"dataset.path={args.fb15k}", "evaluation.every=0", f"training.device={args.device}",
                                       f"training.epochs={args.max_epochs}", *overrides, *extra])
    dataset = load_dataset(config.dataset.path)
    run_dir = Path(args.workdir) / f"fb15k-{name}-{'-'.join(extra) or 'default'}"
    subprocess.run(["rm", "-rf", str(run_dir)], check=True)
    trainer = Trainer.of(config, dataset, run_dir, progress=False)
    curve, elapsed, epoch, reached = [], 0.0, 0, None
    with UtilisationSampler(torch.device("cuda")) as utilisation:
        while elapsed < budget and epoch < args.max_epochs:
            epoch += 1
            with tf32_matmuls(config.training.tf32):
                record = trainer.train_epoch(epoch)
            trainer.state.epoch = epoch
            elapsed += record["seconds"]
            if epoch % eval_every == 0 or elapsed >= budget:
                metrics = trainer.evaluate("test")
                curve.append({"epoch": epoch, "train_seconds": elapsed, "test_mrr": metrics["mrr"]})
                if reached is None and metrics["mrr"] >= TARGET_MRR:
                    reached = elapsed
    final = trainer.evaluate("test")
    trainer.close()
    return {"part": "fb15k", "placement": trainer.placement, "dim": config.model.dim,
            "score_dtype": config.training.score_dtype, "system": f"marius-py {name}",
            "edges_per_s": epoch * dataset.metadata.num_train / elapsed, "gpu_util": utilisation.mean,
            "epochs": epoch, "train_seconds": elapsed, "test_mrr": final["mrr"], "hits@10": final["hits@10"],
            "seconds_to_target": reached, "staleness_bound": trainer.runner.staleness_bound,
            "overrides": overrides + extra, "curve": curve}


def measure_peers(args) -> list[dict]:
    from peers import run_pbg, run_pykeen
    rows = []
    for peer, run in (("pykeen", run_pykeen), ("pbg", run_pbg)):
        if peer not in args.peers:
            continue
        try:
            result = run(args.fb15k, args.budget, "auto", Path(args.workdir) / peer)
        except Exception as error:  # a peer that fails is reported, not fatal to the table
            result = {"error": f"{type(error).__name__}: {error}"}
        rows.append({"part": "fb15k", "system": peer, "placement": result.get("mode", "failed"),
                     "dim": result.get("dim", 0), "score_dtype": "-",
                     "edges_per_s": result.get("edges_per_second", 0.0), "gpu_util": None,
                     "test_mrr": result.get("mrr"), "hits@10": result.get("hits_at_10"),
                     "train_seconds": result.get("train_seconds"), "peer": result})
    return rows


def print_row(row: dict) -> None:
    util = "-" if row.get("gpu_util") is None else f"{row['gpu_util']:.0f}%"
    extra = ""
    if row.get("test_mrr") is not None:
        extra = f"  test MRR {row['test_mrr']:.4f} after {row.get('train_seconds') or 0:.1f} s"
        if row.get("seconds_to_target") is not None:
            extra += f" (MRR {TARGET_MRR} at {row['seconds_to_target']:.1f} s)"
    if row.get("step"):
        extra += f"  {row['step']} step {row.get('decoder', '')}"
    if row.get("table_dtype", "float32") != "float32":
        extra += f"  tables {row['table_dtype']}"
    if row.get("staleness_bound") and row["part"] == "stale":
        extra += f"  bound {row['staleness_bound']}"
    print(f"{row['part']:<5} {row.get('system', 'marius-py'):<18} {row['placement']:<7} d={row['dim']:<4} "
          f"scores={row['score_dtype']:<8} "
          f"{row['edges_per_s'] / 1e6:8.3f} M edges/s  GPU {util}{extra}", flush=True)


def row_recorder(json_path: str | None, print_row):
    """A function that prints each row as it completes and rewrites ``json_path`` with the device names and
    every row so far (a run cut short keeps what it measured)."""
    rows = []
    names = [torch.cuda.get_device_name(g) for g in range(torch.cuda.device_count())] \
        if torch.cuda.is_available() else ["cpu"]

    def record(row: dict) -> None:
        rows.append(row)
        print_row(row)
        if json_path:
            Path(json_path).write_text(json.dumps({"devices": names, "rows": rows}, indent=1))
    return record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", nargs="+", default=["step", "disk", "fb15k", "stale"],
                        choices=["step", "disk", "fb15k", "stale"])
    parser.add_argument("--fb15k", default=".data/fb15k-237", help="FB15k-237 directory (raw or preprocessed)")
    parser.add_argument("--budget", type=float, default=60.0, help="fb15k: training seconds per system")
    parser.add_argument("--max-epochs", type=int, default=200)
    parser.add_argument("--eval-every", type=int, default=2, help="fb15k: test MRR every this many epochs")
    parser.add_argument("--fb15k-configs", nargs="+", default=list(FB15K_CONFIGS), choices=list(FB15K_CONFIGS))
    parser.add_argument("--peers", nargs="*", default=["pykeen", "pbg"])
    parser.add_argument("--bounds", nargs="+", type=int, default=[1, 4, 16, 64])
    parser.add_argument("--stale-epochs", type=int, default=20)
    parser.add_argument("--device", default="cuda", help="fb15k/stale: cpu for a smoke test")
    parser.add_argument("--dims", nargs="+", type=int, default=[100, 400])
    parser.add_argument("--placements", nargs="+", default=["device", "host"])
    parser.add_argument("--steps", nargs="+", default=["graph"], choices=list(STEP_VARIANTS),
                        help="step: the device placement's step (fused: hand-written gradients; graph: fused and "
                             "replayed as a CUDA graph; autograd)")
    parser.add_argument("--score-dtypes", nargs="+", default=["float32"], choices=["float32", "bfloat16"])
    parser.add_argument("--table-dtypes", nargs="+", default=["float32"], choices=["float32", "bfloat16"],
                        help="step and disk: node tables stored in these dtypes (storage.dtype)")
    parser.add_argument("--decoders", nargs="+", default=["distmult"],
                        help="step: decoders to time side by side (dot, distmult, complex, transe-l1, transe-l2, "
                             "rotate, rotate-l2)")
    parser.add_argument("--fb15k-set", nargs="*", default=[], metavar="KEY=VALUE",
                        help="fb15k: config overrides for every --fb15k-configs run")
    parser.add_argument("--nodes", type=int, default=1_000_000)
    parser.add_argument("--relations", type=int, default=100)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--warmup-batches", type=int, default=10)
    parser.add_argument("--load-threads", type=int, default=4, help="step: load threads")
    parser.add_argument("--partitions", type=int, default=16)
    parser.add_argument("--disk-edges", type=int, default=20_000_000)
    parser.add_argument("--workdir", default="/tmp/throughput")
    parser.add_argument("--json", default=None)
    parser.add_argument("--profile", action="store_true", help="print the top GPU kernels of each step row")
    args = parser.parse_args()
    Path(args.workdir).mkdir(parents=True, exist_ok=True)
    record = row_recorder(args.json, print_row)

    for dim in args.dims:
        if "step" in args.parts:
            for placement in args.placements:
                for score_dtype in args.score_dtypes:
                    steps = args.steps if placement == "device" else \
                        dict.fromkeys("fused" if step == "graph" else step for step in args.steps)  # no host graphs
                    for step in steps:
                        for decoder in args.decoders:
                            for table_dtype in args.table_dtypes:
                                record(measure_step(dim, placement, score_dtype, args, step, decoder, table_dtype))
        if "disk" in args.parts:
            disk_args = argparse.Namespace(**{**vars(args), "score_dtype": args.score_dtypes[-1]})
            for table_dtype in args.table_dtypes:
                record(measure_disk(dim, disk_args, (f"storage.dtype={table_dtype}",)))
    if "fb15k" in args.parts:
        for name in args.fb15k_configs:
            record(train_for_budget(name, args, args.fb15k_set, args.budget, eval_every=args.eval_every))
        for row in measure_peers(args):
            record(row)
    if "stale" in args.parts:
        stale_args = argparse.Namespace(**{**vars(args), "max_epochs": args.stale_epochs})
        for bound in args.bounds:
            row = train_for_budget("sampled", stale_args, ["pipeline.placement=host",
                                                          f"pipeline.staleness_bound={bound}"],
                                   budget=float("inf"), eval_every=args.stale_epochs)
            record({**row, "part": "stale"})


if __name__ == "__main__":
    main()
