"""Peer baselines: PyKEEN and PyTorch-BigGraph on FB15k-237 under a time budget.

Trains each peer for about ``--budget-seconds`` of training time, then reports
its mode (cpu/cuda), epochs, training seconds, training edges/s
(epochs * num_train / training seconds), and filtered test MRR and Hits@10
(both directions, train+valid+test filtering, realistic ties = mean of the
optimistic and pessimistic rank).

    python bench/peers.py --data /work/shared/datasets/fb15k-237 \
        --budget-seconds 60 --peers pykeen pbg --json out.json

``--data DIR`` holds train/valid/test as ``.txt`` or ``.txt.gz`` (tab-separated
head, relation, tail). Each peer runs in its own child process (GPU memory is
released in between, and a crash of one peer is reported as
``{"peer": ..., "error": ...}`` without stopping the other); ``--in-process``
runs them in this process instead.

PyKEEN and torchbiggraph are never dependencies of marius-py: they are
imported lazily, so this module imports without them. Install them on the
offline GPU machine from the wheels in ``.whl-peers/`` (pykeen, torchbiggraph
and their dependencies missing there):

    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
        --upgrade --target /tmp/peers .whl-peers/*.whl
    PYTHONPATH=/tmp/peers python3 bench/peers.py --data .data/fb15k-237 \
        --budget-seconds 120 --json /tmp/peers.json

Settings:

* PyKEEN: DistMult d=200, sLCWA with 256 uniform negatives per positive
  (BasicNegativeSampler), CrossEntropyLoss, Adagrad lr 0.1, batch 1024;
  evaluation with PyKEEN's filtered RankBasedEvaluator
  (``both.realistic.inverse_harmonic_mean_rank``).
* PBG: the settings of PBG's FB15k example config: one relation config with
  ``complex_diagonal`` operator and dynamic relations, dimension 400, dot
  comparator, 1 partition, batch 10000, 1000 uniform negatives (plus PBG's
  default 50 batch negatives), softmax loss, lr 0.1, no regularization,
  eval_fraction 0. GPU training (``num_gpus=1``) is used only when CUDA is
  available and the installed PBG has a GPU trainer and its ``_C`` extension;
  otherwise PBG trains on CPU with one Hogwild worker per available core. The
  PyPI release (1.0.0) has no GPU trainer, so it always runs on CPU. PBG's own
  evaluation is not the filtered protocol, so the checkpoint's embeddings and
  relation operators are loaded and ranked here (``filtered_ranks``).

Time budget: each peer first trains one epoch to measure the epoch time, then
continues (PyKEEN: ``continue_training``; PBG: resuming from its checkpoint)
for as many epochs as fit the rest of the budget, re-estimating the epoch time
after each call (at most ``MAX_TRAIN_CALLS`` calls). Training seconds are the
wall time of those training calls only; data loading and evaluation are
excluded. PBG's calls also include its per-call worker-pool start-up and
checkpoint writes, so its record adds ``compute_seconds``, the sum of PBG's own
logged per-epoch compute times (the budget fill also uses them to plan around
the start-up cost).
"""

from __future__ import annotations

import argparse
import gzip
import json
import logging
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Callable

import numpy as np
import torch

SPLITS = ("train", "valid", "test")
MAX_TRAIN_CALLS = 4
PEERS = ("pykeen", "pbg")


# ----------------------------------------------------------------- data


def read_split(data_dir: Path, split: str) -> list[list[str]]:
    """Labeled triples of one split, from ``split.txt`` or ``split.txt.gz``."""
    plain, packed = data_dir / f"{split}.txt", data_dir / f"{split}.txt.gz"
    if plain.exists():
        opener = open(plain, encoding="utf-8")
    elif packed.exists():
        opener = gzip.open(packed, "rt", encoding="utf-8")
    else:
        raise FileNotFoundError(f"neither {plain} nor {packed} exists")
    with opener as lines:
        return [line.rstrip("\n").split("\t") for line in lines if line.strip()]


class Dataset:
    """FB15k-237-style splits mapped to ids shared by all splits.

    Ids come from the sorted labels of all three splits, so every test entity
    has a row in every peer's embedding table.
    """

    def __init__(self, data_dir: Path):
        labeled = {split: read_split(data_dir, split) for split in SPLITS}
        every = [t for split in SPLITS for t in labeled[split]]
        self.entity_to_id = _index({t[0] for t in every} | {t[2] for t in every})
        self.relation_to_id = _index({t[1] for t in every})
        self.triples = {split: self._map(labeled[split]) for split in SPLITS}

    def _map(self, labeled: list[list[str]]) -> np.ndarray:
        ent, rel = self.entity_to_id, self.relation_to_id
        return np.array([(ent[h], rel[r], ent[t]) for h, r, t in labeled], dtype=np.int64).reshape(
            -1, 3
        )

    @property
    def num_entities(self) -> int:
        return len(self.entity_to_id)

    @property
    def num_relations(self) -> int:
        return len(self.relation_to_id)

    @property
    def num_train(self) -> int:
        return len(self.triples["train"])

    def all_triples(self) -> np.ndarray:
        return np.concatenate([self.triples[split] for split in SPLITS])


def _index(labels: set[str]) -> dict[str, int]:
    return {label: i for i, label in enumerate(sorted(labels))}


# ------------------------------------------------------ filtered ranking


class KnownAnswers:
    """For a (anchor, relation) query, the entities known to complete it.

    Stored as answers sorted by the key anchor * num_relations + relation, so a
    batch of queries becomes a few searchsorted calls instead of Python sets.
    """

    def __init__(
        self, anchors: np.ndarray, relations: np.ndarray, answers: np.ndarray, num_relations: int
    ):
        self.num_relations = num_relations
        keys = anchors * num_relations + relations
        order = np.argsort(keys, kind="stable")
        self.keys, self.answers = keys[order], answers[order]

    def batch_pairs(
        self, anchors: np.ndarray, relations: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """(row in batch, known answer) pairs for a batch of queries."""
        keys = anchors * self.num_relations + relations
        starts = np.searchsorted(self.keys, keys, side="left")
        counts = np.searchsorted(self.keys, keys, side="right") - starts
        rows = np.repeat(np.arange(len(keys)), counts)
        # Position inside each query's run of answers, added to its start.
        offsets = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)
        return rows, self.answers[np.repeat(starts, counts) + offsets]


ScoreFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def filtered_ranks(
    score_tails: ScoreFn,
    score_heads: ScoreFn,
    test: np.ndarray,
    known: np.ndarray,
    num_relations: int,
    device: torch.device,
    batch_size: int = 512,
) -> torch.Tensor:
    """Realistic filtered ranks of the true tail and head of each test triple.

    ``score_tails(heads, relations)`` and ``score_heads(tails, relations)``
    return (batch, num_entities) scores, higher is better. Other true answers
    from ``known`` are removed before ranking; ties count half
    (mean of optimistic and pessimistic rank).
    """
    h, r, t = test[:, 0], test[:, 1], test[:, 2]
    tail_answers = KnownAnswers(known[:, 0], known[:, 1], known[:, 2], num_relations)
    head_answers = KnownAnswers(known[:, 2], known[:, 1], known[:, 0], num_relations)
    ranks = []
    for anchors, targets, score, answers in (
        (h, t, score_tails, tail_answers),
        (t, h, score_heads, head_answers),
    ):
        for start in range(0, len(test), batch_size):
            part = slice(start, start + batch_size)
            scores = score(
                torch.as_tensor(anchors[part], device=device),
                torch.as_tensor(r[part], device=device),
            )
            filter_pairs = answers.batch_pairs(anchors[part], r[part])
            ranks.append(
                _realistic_ranks(
                    scores.float(), torch.as_tensor(targets[part], device=device), filter_pairs
                )
            )
    return torch.cat(ranks).cpu()


def _realistic_ranks(scores: torch.Tensor, targets: torch.Tensor, filter_pairs) -> torch.Tensor:
    rows = torch.arange(len(targets), device=scores.device)
    true_scores = scores[rows, targets].unsqueeze(1)
    filter_rows, filter_cols = (torch.as_tensor(a, device=scores.device) for a in filter_pairs)
    # The true answer is among the known ones, so it drops out here too and
    # the +1 below counts it back in.
    scores = scores.index_put(
        (filter_rows, filter_cols), torch.tensor(float("-inf"), device=scores.device)
    )
    optimistic = 1 + (scores > true_scores).sum(1)
    pessimistic = 1 + (scores >= true_scores).sum(1)
    return (optimistic + pessimistic).double() / 2


def rank_metrics(ranks: torch.Tensor) -> dict:
    return {"mrr": float((1 / ranks).mean()), "hits_at_10": float((ranks <= 10).double().mean())}


# ---------------------------------------------------------- time budget


def train_within_budget(
    train_to_epoch: Callable[[int], float | None], budget_seconds: float
) -> tuple[int, float, list]:
    """Call ``train_to_epoch(total_epochs)`` until the budget is about spent.

    The first call trains one epoch; each later one adds as many epochs as the
    last call's epoch time says fit in what is left (rounded, so the total
    lands within half an epoch of the budget). ``train_to_epoch`` may return
    the seconds its epochs themselves took; the rest of the call is then taken
    as a fixed per-call cost (PBG starts a worker pool on every call), which
    the next call will pay again. Returns epochs, seconds and the per-call log.
    """
    epochs, spent, calls = 0, 0.0, []
    target = 1
    while True:
        started = time.perf_counter()
        epoch_part = train_to_epoch(target)
        seconds = time.perf_counter() - started
        overhead = seconds - epoch_part if epoch_part else 0.0
        calls.append({"to_epoch": target, "seconds": round(seconds, 3)})
        if epoch_part:
            calls[-1]["epoch_seconds"] = round(epoch_part, 3)
        epoch_seconds = (seconds - overhead) / (target - epochs)
        epochs, spent = target, spent + seconds
        more = round((budget_seconds - spent - overhead) / epoch_seconds)
        if more <= 0 or len(calls) >= MAX_TRAIN_CALLS:
            return epochs, spent, calls
        target = epochs + more


def summary(
    peer: str, mode: str, dataset: Dataset, epochs: int, seconds: float, metrics: dict, **extra
) -> dict:
    return {
        "peer": peer,
        "mode": mode,
        "epochs": epochs,
        "train_seconds": round(seconds, 3),
        "edges_per_second": round(epochs * dataset.num_train / seconds, 1),
        "mrr": round(metrics["mrr"], 4),
        "hits_at_10": round(metrics["hits_at_10"], 4),
        **extra,
    }


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(name)


# --------------------------------------------------------------- PyKEEN


def run_pykeen(data_dir, budget_seconds: float, device: str = "auto", workdir=None) -> dict:
    """Train PyKEEN DistMult for about ``budget_seconds`` and evaluate it.

    ``workdir`` is unused (PyKEEN keeps everything in memory); it is there so
    both runners share one signature.
    """
    from pykeen.evaluation import RankBasedEvaluator
    from pykeen.losses import CrossEntropyLoss
    from pykeen.models import DistMult
    from pykeen.training import SLCWATrainingLoop
    from pykeen.triples import TriplesFactory

    torch_device = resolve_device(device)
    dataset = Dataset(Path(data_dir))
    factories = {
        split: TriplesFactory(
            mapped_triples=torch.as_tensor(dataset.triples[split]),
            entity_to_id=dataset.entity_to_id,
            relation_to_id=dataset.relation_to_id,
        )
        for split in SPLITS
    }
    train = factories["train"]
    torch.manual_seed(0)
    model = DistMult(
        triples_factory=train, embedding_dim=200, loss=CrossEntropyLoss(), random_seed=0
    ).to(torch_device)
    loop = SLCWATrainingLoop(
        model=model,
        triples_factory=train,
        optimizer="adagrad",
        optimizer_kwargs={"lr": 0.1},
        negative_sampler="basic",
        negative_sampler_kwargs={"num_negs_per_pos": 256},
        # A fixed batch size; the memory probe would add untimed-looking work.
        automatic_memory_optimization=False,
    )

    def train_to_epoch(total: int) -> None:
        loop.train(
            triples_factory=train,
            num_epochs=total,
            batch_size=1024,
            continue_training=total > 1,  # the first call trains epoch 1 only
            use_tqdm=False,
        )

    epochs, seconds, calls = train_within_budget(train_to_epoch, budget_seconds)
    eval_started = time.perf_counter()
    results = RankBasedEvaluator(filtered=True).evaluate(
        model,
        factories["test"].mapped_triples,
        batch_size=1024 if torch_device.type == "cuda" else 256,
        additional_filter_triples=[
            factories["train"].mapped_triples,
            factories["valid"].mapped_triples,
        ],
        use_tqdm=False,
    )
    metrics = {
        "mrr": results.get_metric("both.realistic.inverse_harmonic_mean_rank"),
        "hits_at_10": results.get_metric("both.realistic.hits_at_10"),
    }
    return summary(
        "pykeen",
        torch_device.type,
        dataset,
        epochs,
        seconds,
        metrics,
        version=_distribution_version("pykeen"),
        model="DistMult d=200, sLCWA 256 negs, CrossEntropyLoss, Adagrad lr 0.1, batch 1024",
        train_calls=calls,
        eval_seconds=round(time.perf_counter() - eval_started, 3),
    )


# ------------------------------------------------------------------ PBG


def pbg_config(root: Path, workers: int, num_gpus: int) -> dict:
    """PBG's FB15k example settings, pointed at files under ``root``."""
    config = dict(
        entity_path=str(root / "data"),
        edge_paths=[str(root / "data" / "train_partitioned")],
        checkpoint_path=str(root / "model"),
        entities={"all": {"num_partitions": 1}},
        relations=[
            {"name": "all_edges", "lhs": "all", "rhs": "all", "operator": "complex_diagonal"}
        ],
        dynamic_relations=True,
        dimension=400,
        global_emb=False,
        comparator="dot",
        num_epochs=1,
        batch_size=10000,
        num_uniform_negs=1000,
        loss_fn="softmax",
        lr=0.1,
        eval_fraction=0,
        verbose=0,
    )
    if num_gpus:
        config["num_gpus"] = num_gpus
    else:
        config["workers"] = workers
    return config


def write_pbg_inputs(dataset: Dataset, root: Path) -> None:
    """Write the train split in PBG's on-disk format, keeping our entity ids.

    Writing the files directly (instead of PBG's TSV importer) keeps row i of
    PBG's embeddings equal to our entity i, which the filtered ranking needs.
    """
    import h5py

    entity_dir, edge_dir = root / "data", root / "data" / "train_partitioned"
    edge_dir.mkdir(parents=True, exist_ok=True)
    (entity_dir / "entity_count_all_0.txt").write_text(f"{dataset.num_entities}\n")
    (entity_dir / "dynamic_rel_count.txt").write_text(f"{dataset.num_relations}\n")
    train = dataset.triples["train"]
    with h5py.File(edge_dir / "edges_0_0.h5", "w") as edges:
        edges.attrs["format_version"] = 1
        edges.create_dataset("lhs", data=train[:, 0])
        edges.create_dataset("rel", data=train[:, 1])
        edges.create_dataset("rhs", data=train[:, 2])


def pbg_gpu_problem() -> str | None:
    """Why PBG cannot train on the GPU here, or None if it can."""
    import importlib.util

    if not torch.cuda.is_available():
        return "CUDA not available"
    if importlib.util.find_spec("torchbiggraph.train_gpu") is None:
        return "installed torchbiggraph has no GPU trainer (torchbiggraph.train_gpu)"
    try:
        import torchbiggraph._C  # noqa: F401  (GPU training needs it)
    except ImportError as err:
        return f"torchbiggraph._C extension missing: {err}"
    return None


class PbgComputeTimes(logging.Handler):
    """Collects PBG's own per-bucket "Processed N edges in X s" log lines.

    Their sum is PBG's compute time, without its per-call worker start-up and
    checkpoint I/O; the budget fill uses it to tell the two apart.
    """

    PATTERN = re.compile(r"Processed (\d+) edges in ([\d.]+) s")

    def __init__(self):
        super().__init__(logging.INFO)
        self.seconds = 0.0

    def emit(self, record: logging.LogRecord) -> None:
        match = self.PATTERN.search(record.getMessage())
        if match:
            self.seconds += float(match.group(2))

    def take(self) -> float:
        seconds, self.seconds = self.seconds, 0.0
        return seconds


def train_pbg(config_dict: dict, budget_seconds: float) -> tuple[int, float, list]:
    from torchbiggraph.config import parse_config
    from torchbiggraph.train import train

    compute = PbgComputeTimes()
    pbg_logger = logging.getLogger("torchbiggraph")
    pbg_logger.addHandler(compute)
    pbg_logger.setLevel(logging.INFO)
    pbg_logger.propagate = False  # keep PBG's chatter off our output

    def train_to_epoch(total: int) -> float:
        # PBG resumes from the checkpoint it finds, so each call only runs the
        # epochs between the saved one and ``total``.
        train(parse_config({**config_dict, "num_epochs": total}))
        return compute.take()

    threads = torch.get_num_threads()
    try:
        return train_within_budget(train_to_epoch, budget_seconds)
    finally:
        pbg_logger.removeHandler(compute)
        # PBG sets one thread in the parent too; our evaluation wants them all.
        torch.set_num_threads(threads)


def load_pbg_model(checkpoint: Path) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Entity embeddings and model parameters of PBG's latest checkpoint."""
    import h5py

    version = int((checkpoint / "checkpoint_version.txt").read_text().strip())
    with h5py.File(checkpoint / f"embeddings_all_0.v{version}.h5", "r") as stored:
        embeddings = torch.from_numpy(stored["embeddings"][...])
    params = {}
    with h5py.File(checkpoint / f"model.v{version}.h5", "r") as stored:

        def collect(name, item):
            if isinstance(item, h5py.Dataset):
                # The attribute holds the state_dict key, e.g. "lhs_operators.0.real".
                key = item.attrs.get("state_dict_key", name)
                params[key.decode() if isinstance(key, bytes) else key] = torch.from_numpy(
                    item[...]
                )

        stored["model"].visititems(collect)
    return embeddings, params


def complex_diagonal(
    embeddings: torch.Tensor, real: torch.Tensor, imag: torch.Tensor
) -> torch.Tensor:
    """PBG's complex_diagonal operator: elementwise complex product.

    The first half of each vector is the real part, the second the imaginary.
    """
    re, im = embeddings.chunk(2, dim=-1)
    return torch.cat((re * real - im * imag, re * imag + im * real), dim=-1)


def pbg_score_functions(embeddings: torch.Tensor, params: dict) -> tuple[ScoreFn, ScoreFn]:
    """Scorers matching PBG's dynamic-relation training.

    PBG scores a corrupted tail as dot(g_r(head), tail') with the "lhs"
    operator g, and a corrupted head as dot(head', h_r(tail)) with the "rhs"
    operator h, so ranking uses the same pairing.
    """
    lhs_real, lhs_imag = params["lhs_operators.0.real"], params["lhs_operators.0.imag"]
    rhs_real, rhs_imag = params["rhs_operators.0.real"], params["rhs_operators.0.imag"]

    def score_tails(heads, relations):
        return (
            complex_diagonal(embeddings[heads], lhs_real[relations], lhs_imag[relations])
            @ embeddings.T
        )

    def score_heads(tails, relations):
        return (
            complex_diagonal(embeddings[tails], rhs_real[relations], rhs_imag[relations])
            @ embeddings.T
        )

    return score_tails, score_heads


def evaluate_pbg(dataset: Dataset, checkpoint: Path, device: torch.device) -> dict:
    embeddings, params = load_pbg_model(checkpoint)
    params = {key: value.to(device) for key, value in params.items()}
    score_tails, score_heads = pbg_score_functions(embeddings.to(device), params)
    with torch.no_grad():
        ranks = filtered_ranks(
            score_tails,
            score_heads,
            dataset.triples["test"],
            dataset.all_triples(),
            dataset.num_relations,
            device,
        )
    return rank_metrics(ranks)


def available_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def run_pbg(data_dir, budget_seconds: float, device: str = "auto", workdir=None) -> dict:
    """Train PBG with its FB15k settings for about ``budget_seconds`` and evaluate it."""
    torch_device = resolve_device(device)
    dataset = Dataset(Path(data_dir))
    root = Path(workdir or tempfile.mkdtemp(prefix="peers-pbg-"))
    if torch_device.type == "cuda":
        gpu_problem = pbg_gpu_problem()
    else:
        gpu_problem = "CUDA not available" if not torch.cuda.is_available() else "--device cpu"
    attempts = [("cuda", 1)] if gpu_problem is None else []
    attempts.append(("cpu", 0))
    for mode, num_gpus in attempts:
        run_root = root / f"pbg-{mode}"
        write_pbg_inputs(dataset, run_root)
        config = pbg_config(run_root, available_cores(), num_gpus)
        try:
            epochs, seconds, calls = train_pbg(config, budget_seconds)
            break
        except Exception as err:  # GPU path broken: fall back to CPU below.
            if mode == "cpu":
                raise
            gpu_problem = f"GPU training failed: {err!r}"
    eval_started = time.perf_counter()
    metrics = evaluate_pbg(dataset, Path(config["checkpoint_path"]), torch_device)
    return summary(
        "pbg",
        mode,
        dataset,
        epochs,
        seconds,
        metrics,
        version=_distribution_version("torchbiggraph"),
        model="complex_diagonal d=400, dynamic rels, batch 10000, 1000 uniform negs, softmax, lr 0.1",
        workers=None if mode == "cuda" else config["workers"],
        # PBG's own timing of its epochs, without per-call start-up and I/O.
        compute_seconds=round(sum(call.get("epoch_seconds", 0.0) for call in calls), 3),
        checkpoint_version=int(
            (Path(config["checkpoint_path"]) / "checkpoint_version.txt").read_text()
        ),
        gpu_unavailable_reason=gpu_problem if mode == "cpu" else None,
        train_calls=calls,
        eval_seconds=round(time.perf_counter() - eval_started, 3),
    )


def _distribution_version(name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None


# ------------------------------------------------------------------ CLI

RUNNERS = {"pykeen": run_pykeen, "pbg": run_pbg}


def run_isolated(peer: str, args: argparse.Namespace, workdir: Path) -> dict:
    """Run one peer in a child process; any failure becomes an error record."""
    out = workdir / f"{peer}.json"
    command = [
        sys.executable, str(Path(__file__).resolve()), "--in-process",
        "--data", str(args.data), "--budget-seconds", str(args.budget_seconds),
        "--device", args.device, "--peers", peer, "--workdir", str(workdir), "--json", str(out),
    ]  # fmt: skip
    child = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if child.returncode == 0 and out.exists():
        result = json.loads(out.read_text())["results"][0]
    else:
        result = {"peer": peer, "error": f"exit {child.returncode}: {child.stdout[-2000:]}"}
    if "error" in result:
        sys.stdout.write(child.stdout)  # the peer's own log says what went wrong
    return result


def run_in_process(peer: str, args: argparse.Namespace, workdir: Path) -> dict:
    try:
        return RUNNERS[peer](args.data, args.budget_seconds, args.device, workdir / peer)
    except Exception as err:
        traceback.print_exc()
        return {"peer": peer, "error": repr(err)}


def print_table(results: list[dict]) -> None:
    columns = ("peer", "mode", "epochs", "train_seconds", "edges_per_second", "mrr", "hits_at_10")
    rows = [columns] + [tuple(str(r.get(c, "")) for c in columns) for r in results]
    widths = [max(len(row[i]) for row in rows) for i in range(len(columns))]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip())
    for r in results:
        if "error" in r:
            print(f"{r['peer']} failed: {r['error'][-500:]}")


def environment() -> dict:
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda_device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "cpu_cores": available_cores(),
        "host": platform.node(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--data", type=Path, required=True, help="folder with train/valid/test .txt or .txt.gz"
    )
    parser.add_argument("--budget-seconds", type=float, default=60.0, help="training time per peer")
    parser.add_argument("--peers", nargs="+", choices=PEERS, default=list(PEERS))
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    parser.add_argument(
        "--workdir", type=Path, help="scratch folder (default: a new temporary one)"
    )
    parser.add_argument("--json", type=Path, help="write results here")
    parser.add_argument(
        "--in-process", action="store_true", help="run peers in this process, not in children"
    )
    args = parser.parse_args(argv)

    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="peers-"))
    workdir.mkdir(parents=True, exist_ok=True)
    run = run_in_process if args.in_process else run_isolated
    results = [run(peer, args, workdir) for peer in args.peers]
    print_table(results)
    if args.json:
        report = {
            "budget_seconds": args.budget_seconds,
            "data": str(args.data),
            "environment": environment(),
            "results": results,
        }
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
