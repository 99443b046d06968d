"""The Python API for research code.

    import marius_py as mp
    config = mp.make_config("codex-s", ["training.epochs=5"])   # or a YAML path, or None
    model = mp.train(config, run_dir="runs/demo")                # trains, returns the best model
    print(model.test_metrics)
    model = mp.load_checkpoint("runs/demo")                      # later: best checkpoint
    model.embedding("Q1041"); model.score([("Q1041", "P463", "Q7809")])
    model.predict(head="Q1041", relation="P463", k=5)
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import numpy as np
import torch

from marius_py.bundled import BUNDLED_CONFIGS, bundled_config, resolve_dataset
from marius_py.checkpoint import CONFIG_FILE, NODES, RunDirectory, config_fingerprint, load_version
from marius_py.config import Config, fit_comet_split, load_config
from marius_py.dataset import Dataset
from marius_py.errors import MariusInputError
from marius_py.evaluation import InMemoryNodes, KnownAnswers, NodeTable, StoredNodes, evaluate_split
from marius_py.devices import resolve_device
from marius_py.distributed import launched_by_torchrun, train_distributed
from marius_py.step.model import Model
from marius_py.trainer import Trainer
from marius_py.storage.embedding_store import EmbeddingStore


def load_dataset(path_or_name: str = "codex-m", progress: bool = False) -> Dataset:
    """Open a preprocessed dataset (preprocessing a raw or bundled one into the cache first)."""
    return Dataset(resolve_dataset(path_or_name, progress=progress))


def make_config(path_or_name: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    """A validated config: defaults, a YAML file or a bundled config name, then ``key=value`` overrides."""
    if path_or_name is not None and str(path_or_name) in BUNDLED_CONFIGS and not Path(path_or_name).exists():
        path_or_name = bundled_config(str(path_or_name))
    return load_config(path_or_name, overrides)


def default_run_dir(config: Config) -> Path:
    name = Path(config.dataset.path).name or "run"
    return Path("runs") / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"


class TrainedModel:
    """Node embeddings and decoder of a checkpoint, with name-level helpers.

    ``table`` holds the embeddings in memory, or reads them partition by
    partition from the checkpoint's store when the run was out of core.
    """

    def __init__(self, config: Config, dataset: Dataset, model: Model, table: NodeTable):
        self.config = config
        self.dataset = dataset
        self.model = model
        self.table = table
        self.device = table.device
        self.test_metrics: dict | None = None
        self.run_dir: Path | None = None
        self._known: dict[bool, KnownAnswers] = {}

    def known_answers(self, inverse: bool) -> KnownAnswers:
        """Known (train + valid + test) answers of tail queries, or of head queries when ``inverse``."""
        if inverse not in self._known:
            self._known[inverse] = KnownAnswers(self.dataset.all_known_edges(), self.dataset.num_relations,
                                                inverse)
        return self._known[inverse]

    @property
    def decoder(self):
        return self.model.decoder

    def embedding(self, name: str) -> np.ndarray:
        """Embedding vector of a node given its original name."""
        return self.table.gather(torch.tensor([self.dataset.node_id(name)]))[0].cpu().numpy()

    def embeddings(self) -> np.ndarray:
        """All node embeddings [num_nodes, dim], row i = node id i (``dataset.node_names[i]``).

        Out of core this reads every partition into one array; ``blocks()`` streams.
        """
        return np.concatenate([block.cpu().numpy() for _, block in self.table.blocks()])

    def blocks(self):
        """(first node id, embeddings) of consecutive id ranges, one partition at a time."""
        for start, block in self.table.blocks():
            yield start, block.cpu().numpy()

    def _ids(self, triples) -> torch.Tensor:
        rows = [(self.dataset.node_id(h), self._relation_id(r), self.dataset.node_id(t)) for h, r, t in triples]
        return torch.tensor(rows, dtype=torch.long, device=self.device).reshape(-1, 3)

    def _relation_id(self, name: str | None) -> int:
        if not self.dataset.metadata.has_relations:
            return 0
        if name is None:
            raise MariusInputError("a relation is required on a graph with relations",
                                   expected="--relation NAME (one of relations.txt)")
        return self.dataset.relation_id(name)

    @torch.no_grad()
    def score(self, triples) -> np.ndarray:
        """Scores of (head, relation, tail) name triples (relation ignored by ``dot``)."""
        ids = self._ids(triples)
        scores = self.decoder.score(self.table.gather(ids[:, 0]), ids[:, 1], self.table.gather(ids[:, 2]))
        return scores.cpu().numpy()

    @torch.no_grad()
    def predict(self, relation: str | None = None, head: str | None = None, tail: str | None = None,
                k: int = 10, filter_known: bool = False) -> list[tuple[str, float]]:
        """Top-k tails for (head, relation, ?) or heads for (?, relation, tail)."""
        if (head is None) == (tail is None):
            raise MariusInputError("give exactly one of head and tail", expected="--head NAME or --tail NAME")
        if k < 1:
            raise MariusInputError(f"k must be at least 1, got {k}", expected="-k 10")
        inverse = head is None
        anchor = self.dataset.node_id(tail if inverse else head)
        rel = torch.tensor([self._relation_id(relation)], device=self.device)
        query = self.decoder.query(self.table.gather(torch.tensor([anchor])), rel, inverse)
        known = self.known_answers(inverse).lookup(torch.tensor([anchor]), rel.cpu())[1].to(self.device) \
            if filter_known else None
        best_scores, best_ids = torch.empty(0, device=self.device), torch.empty(0, dtype=torch.long,
                                                                                 device=self.device)
        for start, block in self.table.blocks():  # a running top-k over partitions
            scores = self.decoder.compare_all(query[None], block[None])[0, 0]
            if known is not None:
                inside = known[(known >= start) & (known < start + len(block))]
                scores[inside - start] = float("-inf")
            best_scores = torch.cat([best_scores, scores])
            best_ids = torch.cat([best_ids, torch.arange(start, start + len(block), device=self.device)])
            top = torch.topk(best_scores, min(k, len(best_scores)))
            best_scores, best_ids = top.values, best_ids[top.indices]
        names = self.dataset.node_names
        return [(names[i], float(s)) for s, i in zip(best_scores.tolist(), best_ids.tolist())]

    def evaluate(self, split: str = "test") -> dict:
        """Link-prediction metrics on a split, with the config's evaluation protocol."""
        return evaluate_split(self.decoder, self.table, self.dataset, split, self.config.evaluation,
                              seed=self.config.training.seed)


def open_dataset(config: Config, progress: bool) -> Dataset:
    """The run's dataset as given; an automatic ``storage.comet_split`` is fitted to its nodes
    (``config.storage`` may change). Training re-buckets it for a split store (``Trainer``)."""
    s = config.storage
    dataset = Dataset(resolve_dataset(config.dataset.path, s.num_partitions // s.comet_split, progress))
    fit_comet_split(s, dataset.num_nodes)
    if s.comet_split > 1 and progress:
        print(f"storage: {s.num_partitions // s.comet_split} partitions stored as {s.num_partitions} "
              f"(storage.comet_split={s.comet_split}), the buffer as {s.buffer_capacity}: {s.ordering} over "
              f"groups of {s.comet_group_size} regrouped every epoch")
    return dataset


def _start(config: Config, run_dir: Path, progress: bool, resume: bool) -> tuple[Trainer, Dataset]:
    """The trainer of a run. A new run's directory and config come first, so a run killed while the dataset
    is prepared or the store initialised can be resumed; a user error while the dataset is opened or the
    trainer set up removes the directory it created (errors during training leave it, to resume)."""
    created = not resume and not run_dir.exists()
    if not resume:
        RunDirectory(run_dir).create(config)
    try:
        dataset = open_dataset(config, progress)
        if not resume:
            RunDirectory(run_dir).write_config(config)  # with the partitions the dataset allowed
        return Trainer(config, dataset, run_dir, progress=progress), dataset
    except MariusInputError:
        if created and not RunDirectory(run_dir).has_checkpoint():
            shutil.rmtree(run_dir, ignore_errors=True)
        raise


def train(config: Config, run_dir: str | Path | None = None, progress: bool = True,
          resume: bool = False) -> TrainedModel | None:
    """Train (or resume) a run and return its best (or last) model with test metrics.

    Under torchrun (several trainers, ``marius_py.distributed``) rank 0 returns it and the others None.
    """
    if launched_by_torchrun():
        return train_distributed(config, run_dir, progress, resume)
    run_dir = Path(run_dir) if run_dir is not None else default_run_dir(config)
    check_new_run_dir(run_dir, resume)
    trainer, dataset = _start(config, run_dir, progress, resume)
    try:
        trainer.train()
        return finish_training(trainer, config, dataset, run_dir)
    finally:
        trainer.close()
        trainer.run.close()


def check_new_run_dir(run_dir: Path, resume: bool) -> None:
    if not resume and (RunDirectory(run_dir).has_checkpoint() or (run_dir / CONFIG_FILE).exists()):
        # (a run in its first epoch has committed nothing yet: its config says it is there)
        raise MariusInputError("run directory already holds a run", path=run_dir,
                               expected="a new directory, or --resume to continue it")


def finish_training(trainer: Trainer, config: Config, dataset: Dataset, run_dir: Path) -> TrainedModel:
    """The trained run's best (or last) model, tested when the dataset has a test split."""
    if config.evaluation.select_best:
        trainer.load_best()
    trained = TrainedModel(config, dataset, trainer.model, trainer.node_table())
    trained.run_dir = run_dir
    if dataset.metadata.num_test > 0:
        metrics = trainer.evaluate("test")
        trainer.run.log(metrics)
        trained.test_metrics = metrics
    return trained


def load_run_config(run_dir: str | Path, overrides: list[str] | None = None) -> Config:
    path = Path(run_dir) / CONFIG_FILE
    if not path.exists():
        raise MariusInputError("not a run directory (no config.yaml)", path=run_dir,
                               expected="a directory written by `marius-py train`")
    return load_config(path, overrides)


def load_checkpoint(run_dir: str | Path, which: str = "best", device: str | None = None,
                    overrides: list[str] | None = None) -> TrainedModel:
    """Load the ``best`` (falls back to latest) or ``latest`` checkpoint of a run."""
    config = load_run_config(run_dir, overrides)
    if device is not None:
        config.training.device = device
    run = RunDirectory(run_dir)
    version = (run.best_version() if which == "best" else None) or run.latest_version()
    dataset = open_dataset(config, progress=False)
    target = resolve_device(config.training.device)
    model = Model(config, dataset.num_nodes, dataset.num_relations, target)
    out_of_core = config.storage.num_partitions > 1
    _, _, model_state, _ = load_version(version, config_fingerprint(config, dataset.metadata),
                                        with_nodes=not out_of_core)
    model.load_state_dict(model_state)
    store = EmbeddingStore(version / NODES, mode="r")
    table = StoredNodes(store, target) if out_of_core else InMemoryNodes(
        store.embedding_rows(0, store.num_nodes).to(target))
    trained = TrainedModel(config, dataset, model, table)
    trained.run_dir = Path(run_dir)
    return trained
