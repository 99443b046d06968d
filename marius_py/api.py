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

import numbers
import os
import reprlib
import secrets
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
import torch

from marius_py.bundled import BUNDLED_CONFIGS, BUNDLED_DATASETS, bundled_config, resolve_dataset
from marius_py.callbacks import as_callbacks
from marius_py.checkpoint import CONFIG_FILE, NODES, RunDirectory, RunFingerprint
from marius_py.checkpointer import read_version
from marius_py.config import Config
from marius_py.config_loading import load_config
from marius_py.config_migration import run_config_migrations
from marius_py.layout import run_layout
from marius_py.memory_data import Dataset, is_edge_data, write_triples
from marius_py.errors import PATH_TYPES, MariusInputError, check_type
from marius_py.run_setup import claim_run_dir, closing_on_failure, not_a_run
from marius_py.timeline import Startup
from marius_py.evaluation import (InMemoryNodes, KnownAnswers, NodeTable, StoredNodes, evaluate_edges,
                                  evaluate_split, top_answers)
from marius_py.export import relation_rows
from marius_py.process_settings import restored_process_settings
from marius_py.devices import resolve_device, resolve_devices
from marius_py.distributed import RunSteps, launched_by_torchrun, train_distributed
from marius_py.plan import Machine
from marius_py.step.model import StepModel
from marius_py.prepared_run import prepare_run
from marius_py.trainer import Trainer
from marius_py.storage.embedding_store import EmbeddingStore


FLAG = (bool, np.bool_)    # what switches take (a string such as "false" would be true)
CONFIG_EXPECTED = "a Config: mp.make_config(...), or mp.api.load_run_config(RUN_DIR) to resume"


def load_dataset(path_or_name: str = "codex-m", progress: bool = False, **options) -> Dataset:
    """Open a preprocessed dataset (preprocessing a raw or bundled one into the cache first), or make one from
    edges held in memory: then ``path_or_name`` is train's and ``options`` are ``Dataset.from_triples``'s."""
    if is_edge_data(path_or_name):
        return Dataset(write_triples(path_or_name, progress=progress, argument="load_dataset: path_or_name",
                                     **options))
    check_type(path_or_name, PATH_TYPES, "load_dataset: path_or_name",
               "a dataset's path or a bundled dataset's name, a str or pathlib.Path, or edges held in memory "
               "(a NumPy array, a pandas DataFrame or a list of name triples)")
    check_type(progress, FLAG, "load_dataset: progress", "True or False")
    if options:
        raise MariusInputError(f"load_dataset: {', '.join(options)} given with a path",
                               expected="options only with edges held in memory (Dataset.from_triples's)")
    return Dataset(resolve_dataset(path_or_name, progress=progress))


def make_config(path_or_name: str | Path | None = None, overrides: list[str] | str | None = None,
                source: str = "overrides") -> Config:
    """A validated config: defaults, a YAML file or a bundled config name, then ``key=value`` overrides
    (a list of them, or one string). ``source`` is how errors in an override name where it came from."""
    if path_or_name is not None and not isinstance(path_or_name, (str, os.PathLike)):
        raise MariusInputError(f"make_config: config {path_or_name!r} is a {type(path_or_name).__name__}",
                               expected=f"a YAML file's path, one of {', '.join(sorted(BUNDLED_CONFIGS))}, or None "
                                        f"(the defaults)")
    overrides = _override_list(overrides)
    if path_or_name is not None and str(path_or_name) in BUNDLED_CONFIGS and not Path(path_or_name).exists():
        path_or_name = bundled_config(str(path_or_name))
    return load_config(path_or_name, overrides, source)


def _override_list(overrides) -> list[str]:
    """``key=value`` overrides as a list: None is none, one string is one override; anything but strings is
    refused (a string iterated would be its characters)."""
    if overrides is None:
        return []
    if isinstance(overrides, str):
        return [overrides]
    expected = "a list of 'section.key=value' strings or one such string, e.g. ['training.epochs=5']"
    if isinstance(overrides, (bytes, dict)) or not isinstance(overrides, Iterable):
        raise MariusInputError(f"overrides: a {type(overrides).__name__}", expected=expected)
    items = list(overrides)
    wrong = [item for item in items if not isinstance(item, str)]
    if wrong:
        raise MariusInputError(f"overrides: {wrong[0]!r} is a {type(wrong[0]).__name__}", expected=expected)
    return items


def _check_run_dir(run_dir, argument: str) -> None:
    check_type(run_dir, PATH_TYPES, argument, "a run directory's path, a str or pathlib.Path")


_GIVEN_RUN_DIRS: set[Path] = set()  # the names default_run_dir gave in this process


def default_run_dir(config: Config) -> Path:
    """A new run's directory, ``runs/<dataset>-<date>-<time>-<process id>-<random>``: no two runs of one
    machine get the same, even in the same second (another machine on a shared disk would need the same
    process id and random suffix; the run lock would refuse it). It is not made here: the run makes it, and
    removes it when its setup fails (``run_setup.claim_run_dir``). Under torchrun every trainer must name
    the same directory, so there it is ``runs/<dataset>-<date>-<time>``."""
    check_type(config, Config, "default_run_dir: config", CONFIG_EXPECTED)
    name = Path(config.dataset.path).name or "run"
    started = Path("runs") / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"
    if launched_by_torchrun():
        return started
    while True:
        run_dir = started.with_name(f"{started.name}-{os.getpid()}-{secrets.token_hex(2)}")
        if run_dir not in _GIVEN_RUN_DIRS and not run_dir.exists():
            _GIVEN_RUN_DIRS.add(run_dir)
            return run_dir


NAMES = (list, tuple, np.ndarray)  # what predict takes for a batch of queries


class TrainedModel:
    """Node embeddings and decoder of a checkpoint, with name-level helpers.

    ``table`` holds the embeddings in memory, or reads them partition by
    partition from the checkpoint's store when the run was out of core.
    """

    def __init__(self, config: Config, dataset: Dataset, model: StepModel, table: NodeTable):
        self.config = config
        self.dataset = dataset
        self.model = model
        self.table = table
        self.device = table.device
        self.test_metrics: dict | None = None
        self.run_dir: Path | None = None
        self.version: Path | None = None  # the checkpoint version loaded (load_checkpoint)
        self._known: dict[bool, KnownAnswers] = {}

    def known_answers(self, inverse: bool) -> KnownAnswers:
        """Known (train + valid + test) answers of tail queries, or of head queries when ``inverse``."""
        check_type(inverse, FLAG, "known_answers: inverse", "True or False")
        inverse = bool(inverse)
        if inverse not in self._known:
            self._known[inverse] = KnownAnswers(self.dataset.all_known_edges(), self.dataset.num_relations,
                                                inverse)
        return self._known[inverse]

    @property
    def decoder(self):
        return self.model.decoder

    def embedding(self, name: str) -> np.ndarray:
        """Embedding vector of a node given its original name."""
        check_type(name, str, "embedding: name", "a node name, a str")
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

    def node_table(self) -> torch.Tensor:
        """The node embeddings [num_nodes, dim] the model holds in memory (row i = node id i; storage.dtype,
        where the run kept them): the tensor itself, not a copy, so writing to it changes the model."""
        if not isinstance(self.table, InMemoryNodes):
            raise MariusInputError("node_table: this model's embeddings are out of core, read from the "
                                   "checkpoint's store a partition at a time",
                                   expected="blocks() to stream them, or embeddings() to read them all into "
                                            "one array")
        return self.table.nodes

    def relation_embeddings(self) -> tuple[list[str], np.ndarray]:
        """(names, vectors [2R, d]) of every relation row: the forward ones by relation id, then the inverse
        ones (what head queries apply), named ``<name>__inverse`` as export names them; none on a plain
        graph. A copy: the model's own is ``decoder.relations``."""
        names = self.dataset.relation_names if self.dataset.metadata.has_relations else []
        return relation_rows(self.decoder.relations.detach().cpu().numpy().copy(), names)

    def relation_embedding(self, name: str, inverse: bool = False) -> np.ndarray:
        """The vector of relation ``name``, or of its inverse (what head queries apply) when ``inverse``."""
        check_type(name, str, "relation_embedding: name", "a relation name, a str")
        check_type(inverse, FLAG, "relation_embedding: inverse", "True or False")
        if not self.dataset.metadata.has_relations:
            raise _plain_graph_relation(self.dataset, name, "relation_embedding: ")
        row = self.dataset.relation_id(name) + (self.dataset.num_relations if inverse else 0)
        return self.decoder.relations[row].detach().cpu().clone().numpy()

    def _ids(self, triples, argument: str = "score") -> torch.Tensor:
        """Node and relation ids of name triples; a graph without relations also takes (head, tail) pairs.
        ``argument``: what errors name."""
        relations = self.dataset.metadata.has_relations
        expected = ("a list of (head, relation, tail) name triples: this graph has relations" if relations else
                    "a list of (head, tail) name pairs, or of (head, relation, tail) triples with the relation "
                    "ignored: this graph has none")
        one_item = isinstance(triples, tuple) and triples and all(isinstance(name, str) for name in triples)
        scalar = isinstance(triples, np.ndarray) and triples.ndim == 0
        if isinstance(triples, (str, bytes, dict)) or one_item or scalar or not isinstance(triples, Iterable):
            raise MariusInputError(f"{argument}: {reprlib.repr(triples)} is not a list of tuples", expected=expected)
        rows = []
        for index, item in enumerate(triples):
            size = len(item) if isinstance(item, (tuple, list, np.ndarray)) else None
            if size != 3 and not (size == 2 and not relations):
                raise MariusInputError(f"{argument}: item {index} is {reprlib.repr(item)}", expected=expected)
            head, relation, tail = item if size == 3 else (item[0], None, item[1])
            names = {"head": head, "tail": tail, **({"relation": relation} if relation is not None else {})}
            for part, name in names.items():
                check_type(name, str, f"{argument}: item {index}'s {part}", "names, each a str")
            rows.append((self.dataset.node_id(head), self._relation_id(relation), self.dataset.node_id(tail)))
        return torch.tensor(rows, dtype=torch.long, device=self.device).reshape(-1, 3)

    def _relation_id(self, name: str | None) -> int:
        if not self.dataset.metadata.has_relations:
            return 0
        if name is None:
            raise _relation_required(self.dataset)
        return self.dataset.relation_id(name)

    @staticmethod
    def check_query(head: str | None, tail: str | None, k: int, relation: str | None = None,
                    dataset: Dataset | None = None, source: object = None) -> None:
        """The arguments of ``predict``: exactly one of head and tail, k a whole number of at least 1 and,
        given the ``dataset``, a relation exactly where the graph has relations. Needs nothing loaded (the
        command line checks before it loads a checkpoint); ``source``: where the arguments came from, as
        errors name it."""
        for argument, name in (("head", head), ("tail", tail), ("relation", relation)):
            check_type(name, (str, type(None)), f"predict: {argument}", "a name, a str")
        if (head is None) == (tail is None):
            raise MariusInputError("give exactly one of head and tail", path=source,
                                   expected="a head name or a tail name (--head NAME or --tail NAME)")
        if not isinstance(k, numbers.Integral) or isinstance(k, bool):
            raise MariusInputError(f"k must be a whole number, got {k!r}", path=source,
                                   expected="a whole number of at least 1, e.g. 10 (-k 10)")
        if k < 1:
            raise MariusInputError(f"k must be at least 1, got {k!r}", path=source,
                                   expected="a whole number, e.g. 10 (-k 10)")
        if dataset is None:
            return
        if relation is None and dataset.metadata.has_relations:
            raise _relation_required(dataset, source)
        if relation is not None and not dataset.metadata.has_relations:
            raise _plain_graph_relation(dataset, relation)

    @torch.no_grad()
    def score(self, triples) -> np.ndarray:
        """Scores of (head, relation, tail) name triples (relation ignored by ``dot``)."""
        ids = self._ids(triples)
        scores = self.decoder.score(self.table.gather(ids[:, 0]), ids[:, 1], self.table.gather(ids[:, 2]))
        return scores.cpu().numpy()

    @torch.no_grad()
    def predict(self, relation=None, head=None, tail=None, k: int = 10, filter_known: bool = False):
        """Top-k tails for (head, relation, ?) or heads for (?, relation, tail): a list of (name, score), best
        first (fewer than k where ``filter_known`` leaves fewer).

        Given lists or 1-D arrays of names (one name standing for every query), every query at once:
        (names, scores), [Q, k] arrays of str and float, a row ending in "" and -inf where ``filter_known``
        leaves fewer than k answers."""
        columns, batched = _query_columns(relation=relation, head=head, tail=tail)
        self.check_query(columns["head"][0], columns["tail"][0], k, columns["relation"][0], self.dataset)
        check_type(filter_known, FLAG, "predict: filter_known", "True or False")
        inverse = head is None
        anchors = torch.tensor([self.dataset.node_id(name) for name in columns["tail" if inverse else "head"]])
        relations = torch.tensor([self._relation_id(name) for name in columns["relation"]])
        queries = self.decoder.query(self.table.gather(anchors), relations.to(self.device), inverse)
        excluded = None
        if filter_known:
            excluded = tuple(ids.to(self.device) for ids in self.known_answers(inverse).lookup(anchors, relations))
        scores, ids = top_answers(self.decoder, self.table, queries, int(k), excluded)
        names = self.dataset.node_names
        if batched:
            return (np.array([[names[i] if s != float("-inf") else "" for s, i in zip(row_scores, row_ids)]
                              for row_scores, row_ids in zip(scores.tolist(), ids.tolist())], dtype=str),
                    scores.cpu().numpy())
        return [(names[i], s) for s, i in zip(scores[0].tolist(), ids[0].tolist()) if s != float("-inf")]

    def evaluate(self, triples_or_split="test", *, filtered: bool = True) -> dict:
        """Link-prediction metrics of a split, "valid" or "test", or of name triples (a list or array of
        (head, relation, tail); (head, tail) pairs on a graph without relations): every edge ranked both ways
        with the config's evaluation protocol (by default against every node, the dataset's other known
        edges filtered out), or with ``filtered=False`` against every node with nothing filtered."""
        check_type(filtered, FLAG, "evaluate: filtered", "True or False")
        protocol = (self.decoder, self.table, self.dataset)
        options = {"config": self.config.evaluation, "seed": self.config.training.seed, "filtered": bool(filtered)}
        if not isinstance(triples_or_split, str):
            edges = self._ids(triples_or_split, "evaluate: triples_or_split").cpu().numpy()
            if len(edges) == 0:
                raise MariusInputError("evaluate: triples_or_split is empty: nothing to rank",
                                       expected="at least one (head, relation, tail) name triple")
            return evaluate_edges(*protocol, edges, **options)
        if triples_or_split not in ("valid", "test"):
            raise MariusInputError(f"evaluate: split {triples_or_split!r}",
                                   expected="'valid' or 'test', or a list of (head, relation, tail) name triples")
        return evaluate_split(*protocol, triples_or_split, **options)


def _query_columns(**arguments) -> tuple[dict[str, list], bool]:
    """``predict``'s names as columns of one length, one name per query (a single name or None repeated),
    and whether any was given as a list."""
    lists = {argument: _name_list(value, f"predict: {argument}")
             for argument, value in arguments.items() if isinstance(value, NAMES)}
    counts = {argument: len(names) for argument, names in lists.items()}
    if len(set(counts.values())) > 1:
        raise MariusInputError("predict: " + ", ".join(f"{argument} has {count} names" for argument, count
                                                       in counts.items()),
                               expected="lists of one length, one name per query (or one name for every query)")
    count = next(iter(counts.values()), 1)
    if count == 0:
        raise MariusInputError(f"predict: {next(iter(counts))} is empty: no queries",
                               expected="at least one name")
    return {argument: lists.get(argument, [value] * count) for argument, value in arguments.items()}, bool(lists)


def _name_list(names, argument: str) -> list[str]:
    """A list or 1-D array of names, each checked to be a str."""
    if isinstance(names, np.ndarray) and names.ndim != 1:
        raise MariusInputError(f"{argument} is a {names.ndim}-D array", expected="a name, or a list or 1-D "
                                                                                  "array of names")
    for index, name in enumerate(names):
        check_type(name, str, f"{argument}[{index}]", "names, each a str")
    return [str(name) for name in names]


def _relation_required(dataset: Dataset, source: object = None) -> MariusInputError:
    return MariusInputError("a relation is required on a graph with relations", path=source,
                            expected=f"a relation name (--relation NAME), a line of "
                                     f"{dataset.directory / 'relations.txt'}")


def _plain_graph_relation(dataset: Dataset, relation: str, argument: str = "") -> MariusInputError:
    return MariusInputError(f"{argument}relation {relation!r}: the dataset is a plain graph (preprocessed with "
                            "--pairs), without relations", path=dataset.directory, expected="no relation")


def open_dataset(config: Config, progress: bool) -> Dataset:
    """The run's dataset as given (a raw or bundled one preprocessed once, unpartitioned). Training re-buckets
    it for a partitioned store (``prepared_run.prepare_run``)."""
    return Dataset(resolve_dataset(config.dataset.path, 1, progress))  # (one copy, whatever the plan chooses)


def probe_machine(config: Config, run_dir: str | Path | None = None) -> Machine:
    """This machine's memory for ``config``'s run: its training GPUs' free memory, host memory, disk."""
    check_type(config, Config, "probe_machine: config", CONFIG_EXPECTED)
    if run_dir is not None:
        _check_run_dir(run_dir, "probe_machine: run_dir")
    return Machine.probe(resolve_devices(config), run_dir)




def _start(config: Config, run_dir: Path, progress: bool, resume: bool,
           callbacks: Sequence = ()) -> tuple[Trainer, Dataset]:
    """The trainer of a run (set up under ``run_setup.claim_run_dir``). config.yaml has one owner, this setup:
    a new run's directory and config come first (a run killed while its dataset is prepared resumes), then its
    planned config (``PreparedRun.pinned_config``; one killed while its store is made resumes as planned); a
    resume writes the planned config once the trainer accepted the run's state (a refused resume leaves it)."""
    startup = Startup()
    startup.mark("imports_and_config")
    if not resume:
        RunDirectory(run_dir).create(config)
    dataset = open_dataset(config, progress)
    startup.mark("dataset")
    prepared = prepare_run(config, dataset, run_dir, progress, startup=startup)
    if not resume:
        RunDirectory(run_dir).write_config(prepared.pinned_config())
    trainer = Trainer(prepared, run_dir, progress=progress, startup=startup, callbacks=callbacks)
    if resume:  # (it may have extended training.epochs: record what runs)
        closing_on_failure(trainer, lambda: RunDirectory(run_dir).write_config(prepared.pinned_config()))
    startup.mark("trainer_other")  # (its model, bucketing, runner and tables are marked apart)
    return trainer, dataset


def train(config: Config, run_dir: str | Path | None = None, progress: bool = True,
          resume: bool = False, test: bool = True, callbacks: Sequence = (),
          trackers: Sequence = ()) -> TrainedModel | None:
    """Train (or resume) a run and return its best (or last) model with test metrics (none with
    ``test=False``: a search selects on validation alone).

    The run directory is locked while it trains (``run_lock.RunLock``): a second
    command into it is refused, naming the process that holds it.
    ``callbacks`` (``marius_py.callbacks``) watch training and may stop it; they run after those the config
    names (``training.callbacks``). ``trackers``, objects with ``log(record)`` and ``close()``, are taken as
    callbacks too (the argument of earlier versions).
    Under torchrun (several trainers, ``marius_py.distributed``) rank 0 returns it and the others None.
    """
    check_type(config, Config, "train: config", CONFIG_EXPECTED)
    if run_dir is not None:
        _check_run_dir(run_dir, "train: run_dir")
    for argument, value in (("progress", progress), ("resume", resume), ("test", test)):
        check_type(value, FLAG, f"train: {argument}", "True or False")
    callbacks = as_callbacks(callbacks, "train: callbacks") + as_callbacks(trackers, "train: trackers")
    if launched_by_torchrun():
        if callbacks:
            raise MariusInputError("train: callbacks given as objects reach one process; under torchrun each "
                                   "trainer makes its own", expected="training.callbacks=NAME,... naming "
                                                                     "registered callbacks (marius_py.callbacks)")
        return train_distributed(config, run_dir, progress, resume,
                                 RunSteps(default_run_dir, open_dataset, finish_training))
    run_dir = Path(run_dir) if run_dir is not None else default_run_dir(config)
    with restored_process_settings(), claim_run_dir(  # (threads, seeds, flags: the caller's again after)
            run_dir, resume, lambda: _start(config, run_dir, progress, resume, callbacks)) as (trainer, dataset):
        try:
            trainer.train()
            return finish_training(trainer, trainer.config, dataset, run_dir, test)  # (the plan's config)
        finally:
            trainer.close()  # (its callbacks' on_train_end too)


def finish_training(trainer: Trainer, config: Config, dataset: Dataset, run_dir: Path,
                    test: bool = True) -> TrainedModel:
    """The trained run's best (or last) model, tested when the dataset has a test split (and ``test``)."""
    if config.evaluation.select_best:
        trainer.load_best()
    trained = TrainedModel(config, dataset, trainer.model, trainer.node_table())
    trained.run_dir = run_dir
    if test and dataset.metadata.num_test > 0:
        metrics = trainer.evaluate("test")
        trainer.log(metrics)
        trained.test_metrics = metrics
    return trained


def load_run_config(run_dir: str | Path, overrides: list[str] | str | None = None,
                    source: str = "overrides") -> Config:
    """A run's config.yaml with ``key=value`` overrides (``source``: what errors in them name)."""
    _check_run_dir(run_dir, "run_dir")
    overrides = _override_list(overrides)
    path = Path(run_dir) / CONFIG_FILE
    if not path.is_file():
        raise not_a_run(run_dir)
    overrides = [*run_config_migrations(path), *overrides]  # (keys a run written by an older version lacks)
    return load_config(path, overrides, source)


def load_checkpoint(run_dir: str | Path, which: str = "best", device: str | None = None,
                    overrides: list[str] | str | None = None, source: str = "overrides") -> TrainedModel:
    """Load the ``best`` (the latest where no validation selected one) or ``latest`` checkpoint of a run
    onto ``device`` (default the run's training.device); ``TrainedModel.version`` is the one loaded.

    What commonly goes wrong is checked before anything is loaded, each with its own error: no run
    directory, no committed checkpoint, the dataset moved or deleted since training, a device this machine
    lacks. ``source``: where ``overrides`` and ``device`` came from, as errors name them ("command line":
    key=value items and --device)."""
    if which not in ("best", "latest"):
        raise MariusInputError(f"load_checkpoint: checkpoint {which!r}", expected="'best' or 'latest'")
    config = load_run_config(run_dir, overrides, source)
    run = RunDirectory(run_dir)
    latest = run.latest_version()  # (a clear error when nothing was committed)
    _check_run_dataset(config, Path(run_dir))
    target = _checkpoint_device(config, device, source, Path(run_dir))
    version = (run.best_version() if which == "best" else None) or latest
    dataset = open_dataset(config, progress=False)
    model = StepModel(config, dataset.num_nodes, dataset.num_relations, target)
    out_of_core = config.storage.num_partitions > 1
    layout = run_layout(config, dataset.num_nodes, torchrun=launched_by_torchrun())
    model_state, _ = read_version(version, RunFingerprint.of(config, dataset.metadata, layout), layout.dtype, 1)
    model.load_state_dict(model_state)
    try:
        store = EmbeddingStore(version / NODES, mode="r")
        table = StoredNodes(store, target) if out_of_core else InMemoryNodes(
            store.embedding_rows(0, store.num_nodes).to(target))
    except (OSError, ValueError, KeyError, TypeError, RuntimeError) as error:  # (as load_version words it)
        raise MariusInputError(f"checkpoint version is missing or damaged ({type(error).__name__}: {error})",
                               path=version, expected="a version committed by `marius-py train`") from None
    trained = TrainedModel(config, dataset, model, table)
    trained.run_dir, trained.version = Path(run_dir), version
    return trained


def _check_run_dataset(config: Config, run_dir: Path) -> None:
    """Refuse a run whose dataset is no longer where its config.yaml says (moved or deleted since training)."""
    dataset = config.dataset.path
    if dataset in BUNDLED_DATASETS or Path(dataset).expanduser().exists():
        return
    config_file = run_dir / CONFIG_FILE
    relative = "" if Path(dataset).expanduser().is_absolute() else \
        f" (a relative path, read from the current directory {Path.cwd()})"
    raise MariusInputError(f"the run's dataset is missing: dataset.path {dataset} does not exist{relative}",
                           path=config_file, expected=f"the dataset the run trained on back at {dataset}, or "
                                                      f"dataset.path in {config_file} set to where it is now")


def _checkpoint_device(config: Config, device: str | None, source: str, run_dir: Path) -> torch.device:
    """Where a checkpoint is loaded: ``device`` (the caller's; the command line's --device), else the run's
    training.device; refused, naming where it was given, when this machine lacks it."""
    if device is None:
        return resolve_device(config.training.device, "training.device", run_dir / CONFIG_FILE)
    setting, path = ("--device", source) if source == "command line" else ("load_checkpoint: device", None)
    target = resolve_device(device, setting, path)
    config.training.device = device
    return target
