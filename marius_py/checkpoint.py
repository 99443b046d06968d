"""Run directories and atomically committed, versioned checkpoints.

    RUN_DIR/
      config.yaml              resolved config of the run
      metrics.jsonl            one JSON object per epoch / evaluation
      checkpoints/
        v000003/               one version: a complete, consistent state
          nodes/               EmbeddingStore (zarr): node embeddings + Adagrad state
          model.pt             relation parameters and their optimizer state
          state.json           epoch, best validation MRR, config fingerprint
        LATEST                 name of the newest committed version
        BEST                   name of the version with the best validation MRR

Commit: the version is written under a temporary name, every file is fsynced,
the directory is renamed into place, and only then is LATEST replaced
atomically (write, fsync, rename). A kill at any instant leaves the previous
LATEST pointing at a complete version. Old versions are deleted after the bump,
keeping LATEST and BEST.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from marius_py.config import Config, dump_config
from marius_py.errors import MariusInputError
from storage.embedding_store import EmbeddingStore

CONFIG_FILE = "config.yaml"
METRICS_FILE = "metrics.jsonl"
CHECKPOINTS = "checkpoints"
LATEST = "LATEST"
BEST = "BEST"
NODES = "nodes"
MODEL_FILE = "model.pt"
STATE_FILE = "state.json"


@dataclass
class TrainingState:
    """Where training stands: the next epoch to run and the best validation so far."""

    epoch: int = 0                 # epochs completed
    best_mrr: float = -1.0
    best_epoch: int = 0
    validations_without_improvement: int = 0
    config_fingerprint: str = ""


def config_fingerprint(config: Config) -> str:
    """Hash of the settings a checkpoint depends on (shapes and the model)."""
    shape = {"dataset": config.dataset.path, "decoder": config.model.decoder, "dim": config.model.dim,
             "adagrad_variant": config.training.adagrad_variant,
             "relation_optimizer": config.training.relation_optimizer}
    return hashlib.sha256(json.dumps(shape, sort_keys=True).encode()).hexdigest()[:16]


def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_text_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
    _fsync_path(path.parent)


class RunDirectory:
    """A training run's directory: config, metrics log and checkpoints."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.checkpoints = self.path / CHECKPOINTS

    # ---- creation and logs ----
    def create(self, config: Config) -> None:
        self.checkpoints.mkdir(parents=True, exist_ok=True)
        self.write_config(config)

    def write_config(self, config: Config) -> None:
        write_text_atomic(self.path / CONFIG_FILE, dump_config(config))

    def log(self, record: dict) -> None:
        with open(self.path / METRICS_FILE, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(record, sort_keys=True) + "\n")

    def read_metrics(self) -> list[dict]:
        path = self.path / METRICS_FILE
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]

    # ---- versions ----
    def _pointer(self, name: str) -> str | None:
        path = self.checkpoints / name
        return path.read_text(encoding="utf-8").strip() if path.exists() else None

    def latest_version(self) -> Path:
        name = self._pointer(LATEST)
        if name is None:
            raise MariusInputError("no committed checkpoint", path=self.path,
                                   expected="a run directory written by `marius-py train`")
        return self.checkpoints / name

    def best_version(self) -> Path | None:
        name = self._pointer(BEST)
        return None if name is None else self.checkpoints / name

    def has_checkpoint(self) -> bool:
        return self._pointer(LATEST) is not None

    def begin_version(self, epoch: int) -> Path:
        """A fresh temporary directory to write version ``epoch`` into."""
        tmp = self.checkpoints / f".v{epoch:06d}.tmp"
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir(parents=True)
        return tmp

    def commit_version(self, tmp: Path, epoch: int, is_best: bool) -> Path:
        """fsync ``tmp``, rename it to its final name, then bump LATEST (and BEST)."""
        for root, _, files in os.walk(tmp):
            for name in files:
                with open(os.path.join(root, name), "rb") as handle:
                    os.fsync(handle.fileno())
        final = self.checkpoints / f"v{epoch:06d}"
        if final.exists():  # an uncommitted leftover of a killed run
            shutil.rmtree(final)
        os.replace(tmp, final)
        _fsync_path(self.checkpoints)
        write_text_atomic(self.checkpoints / LATEST, final.name + "\n")
        if is_best:
            write_text_atomic(self.checkpoints / BEST, final.name + "\n")
        self._delete_unreferenced()
        return final

    def _delete_unreferenced(self) -> None:
        keep = {self._pointer(LATEST), self._pointer(BEST)}
        for child in self.checkpoints.iterdir():
            if child.is_dir() and child.name not in keep:
                shutil.rmtree(child, ignore_errors=True)


def save_version(directory: Path, nodes: torch.Tensor, state: torch.Tensor, num_partitions: int,
                 model_state: dict, training_state: TrainingState) -> None:
    """Write one checkpoint version's files into ``directory`` (not yet committed)."""
    store = EmbeddingStore.create(directory / NODES, nodes.shape[0], nodes.shape[1], state.shape[1],
                                  num_partitions)
    store.write_all(nodes.detach().cpu().numpy(), state.detach().cpu().numpy())
    write_version_state(directory, model_state, training_state)


def write_version_state(directory: Path, model_state: dict, training_state: TrainingState) -> None:
    """The non-embedding files of a version: model parameters and training position."""
    torch.save(model_state, directory / MODEL_FILE)
    (directory / STATE_FILE).write_text(json.dumps(training_state.__dict__, indent=2), encoding="utf-8")


def load_version(directory: Path) -> tuple[np.ndarray, np.ndarray, dict, TrainingState]:
    """Node embeddings, node optimizer state, model state dict and training state of a version."""
    store = EmbeddingStore(directory / NODES, mode="r")
    nodes, state = store.read_all()
    model_state = torch.load(directory / MODEL_FILE, map_location="cpu", weights_only=True)
    training_state = TrainingState(**json.loads((directory / STATE_FILE).read_text(encoding="utf-8")))
    return nodes, state, model_state, training_state
