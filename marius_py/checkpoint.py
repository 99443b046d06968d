"""Run directories and atomically committed, versioned checkpoints.

    RUN_DIR/
      config.yaml              resolved config of the run
      metrics.jsonl            one JSON object per epoch / evaluation
      tensorboard/             the same metrics as TensorBoard events (training.tensorboard=true)
      store/                   the live EmbeddingStore training reads and writes
      checkpoints/
        v000003/               one version: a complete, consistent state
          nodes/               EmbeddingStore (zarr): node embeddings + Adagrad state, hard
                               links to the live store's files at the time of the commit
          model.pt             relation parameters and their optimizer state
          state.json           epoch (and buffer states of the next done), best validation MRR,
                               config fingerprint
          position.pt          mid-epoch versions (v000003.s000012: 12 buffer states of epoch 4
                               done) only: the epoch's walk, generator devices and states
          MANIFEST.json        size and checksum of every file above (storage/manifest.py)
        POINTERS.json          {"latest": newest committed version, "best": best validation MRR}

Commit: the version is written under a temporary name, every file is fsynced,
the directory is renamed into place, and only then is the one pointer file
replaced atomically (write, fsync, rename), so "latest" and "best" always move
together. A kill at any instant leaves the previous pointers naming complete
versions. Versions no pointer names are deleted after the bump. Loading a
version first checks its files against its manifest and names any file that
changed after the commit.
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
from marius_py.dataset import DatasetMetadata
from marius_py.errors import MariusInputError
from marius_py.storage import durable
from marius_py.storage.durable import fsync_directory, fsync_tree
from marius_py.storage.embedding_store import EmbeddingStore
from marius_py.storage.manifest import has_manifest, verify_manifest, write_manifest

CONFIG_FILE = "config.yaml"
METRICS_FILE = "metrics.jsonl"
CHECKPOINTS = "checkpoints"
POINTERS = "POINTERS.json"
LIVE_STORE = "store"
NODES = "nodes"
MODEL_FILE = "model.pt"
STATE_FILE = "state.json"
POSITION_FILE = "position.pt"


@dataclass
class TrainingState:
    """Where training stands: the next epoch to run and the best validation so far."""

    epoch: int = 0                 # epochs completed
    states_done: int = 0           # buffer states of the next epoch already trained (a mid-epoch version)
    partial_loss_sum: float = 0.0  # their summed loss (the epoch's loss x edges, so far)
    best_mrr: float = -1.0
    best_epoch: int = 0
    validations_without_improvement: int = 0
    stopped_early: bool = False
    config_fingerprint: str = ""


def config_fingerprint(config: Config, metadata: DatasetMetadata) -> str:
    """Hash of what a checkpoint's tensors depend on: the model's shapes and the dataset's ids."""
    shape = {"decoder": config.model.decoder, "dim": config.model.dim,
             "adagrad_variant": config.training.adagrad_variant,
             "relation_optimizer": config.training.relation_optimizer,
             "num_partitions": config.storage.num_partitions,
             "num_nodes": metadata.num_nodes, "num_relations": metadata.num_relations,
             "num_train": metadata.num_train, "preprocess_seed": metadata.seed}
    if config.storage.dtype != "float32":  # (absent for float32: earlier checkpoints keep their fingerprint)
        shape["storage_dtype"] = config.storage.dtype
    return hashlib.sha256(json.dumps(shape, sort_keys=True).encode()).hexdigest()[:16]


class RunDirectory:
    """A training run's directory: config, metrics log and checkpoints."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.checkpoints = self.path / CHECKPOINTS
        self.trackers: list = []  # objects with log(record), e.g. marius_py.trackers.TensorBoardTracker

    # ---- creation and logs ----
    def create(self, config: Config) -> None:
        self.checkpoints.mkdir(parents=True, exist_ok=True)
        self.write_config(config)

    def write_config(self, config: Config) -> None:
        durable.write_text_atomic(self.path / CONFIG_FILE, dump_config(config))

    def log(self, record: dict) -> None:
        with open(self.path / METRICS_FILE, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(record, sort_keys=True) + "\n")
        for tracker in self.trackers:
            tracker.log(record)

    def close(self) -> None:
        """Close the trackers (the metrics log itself is opened per record)."""
        for tracker in self.trackers:
            tracker.close()

    def read_metrics(self) -> list[dict]:
        path = self.path / METRICS_FILE
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]

    def truncate_metrics(self, epoch: int) -> None:
        """Drop log records of epochs after ``epoch`` (written before a crash cut their commit)."""
        kept = [r for r in self.read_metrics() if r.get("epoch", 0) <= epoch]
        durable.write_text_atomic(self.path / METRICS_FILE,
                                  "".join(json.dumps(r, sort_keys=True) + "\n" for r in kept))

    # ---- versions ----
    def _pointers(self) -> dict:
        path = self.checkpoints / POINTERS
        if not path.exists():
            return {}
        return json.loads(path.read_text(encoding="utf-8"))

    def latest_version(self) -> Path:
        name = self._pointers().get("latest")
        if name is None:
            raise MariusInputError("no committed checkpoint", path=self.path,
                                   expected="a run that has committed: `marius-py train` commits after its first "
                                            "epoch (or, out of core with training.checkpoint_interval, between "
                                            "buffer states)")
        return self.checkpoints / name

    def best_version(self) -> Path | None:
        name = self._pointers().get("best")
        return None if name is None else self.checkpoints / name

    def has_checkpoint(self) -> bool:
        return "latest" in self._pointers()

    def begin_version(self, epoch: int, states_done: int = 0) -> Path:
        """A fresh temporary directory to write version ``epoch`` (``states_done`` into the next) into."""
        tmp = self.checkpoints / f".{version_name(epoch, states_done)}.tmp"
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir(parents=True)
        return tmp

    def commit_version(self, tmp: Path, epoch: int, is_best: bool, states_done: int = 0) -> Path:
        """Checksum and fsync ``tmp``, rename it to its final name, then replace the pointer file atomically."""
        previous = self._pointers().get("latest")
        write_manifest(tmp, None if previous is None else self.checkpoints / previous)
        fsync_tree(tmp)
        final = self.checkpoints / version_name(epoch, states_done)
        pointers = self._pointers()
        if final.exists():  # never referenced: a leftover of a killed run
            assert final.name not in pointers.values(), f"{final} is committed"
            shutil.rmtree(final)
        os.replace(tmp, final)
        fsync_directory(self.checkpoints)
        pointers["latest"] = final.name
        if is_best:
            pointers["best"] = final.name
        durable.write_text_atomic(self.checkpoints / POINTERS, json.dumps(pointers) + "\n")
        self._delete_unreferenced(set(pointers.values()))
        return final

    def committed_versions(self) -> list[Path]:
        """The versions the pointers name (latest, best), oldest first."""
        return [self.checkpoints / name for name in sorted(set(self._pointers().values()))]

    def _delete_unreferenced(self, keep: set[str]) -> None:
        for child in self.checkpoints.iterdir():
            if child.is_dir() and child.name not in keep:
                shutil.rmtree(child, ignore_errors=True)


def version_name(epoch: int, states_done: int = 0) -> str:
    """``v000003`` after epoch 3; ``v000003.s000012`` after 12 buffer states of epoch 4 (sorts between)."""
    return f"v{epoch:06d}" + (f".s{states_done:06d}" if states_done else "")


def write_version_state(directory: Path, model_state: dict, training_state: TrainingState,
                        position: dict | None = None) -> None:
    """The non-embedding files of a version: model parameters, training position and, mid-epoch, where in
    the epoch (the walk it belongs to, the generators' devices and states)."""
    torch.save(model_state, directory / MODEL_FILE)
    (directory / STATE_FILE).write_text(json.dumps(training_state.__dict__, indent=2), encoding="utf-8")
    if position is not None:
        torch.save(position, directory / POSITION_FILE)


def load_position(directory: Path) -> dict | None:
    """The position a mid-epoch version saved, or None."""
    path = directory / POSITION_FILE
    if not path.exists():
        return None
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except (OSError, RuntimeError, ValueError) as error:
        raise MariusInputError(f"checkpoint position is damaged ({type(error).__name__}: {error})", path=path,
                               expected="a version committed by `marius-py train`") from None


def load_version(directory: Path, fingerprint: str | None = None, with_nodes: bool = True
                 ) -> tuple[np.ndarray | None, np.ndarray | None, dict, TrainingState]:
    """Node embeddings, node optimizer state, model state dict and training state of a version.

    With ``fingerprint``, refuse a version written for another model or dataset;
    without ``with_nodes`` the (possibly larger than memory) node arrays are not read.
    """
    check_version(directory)
    try:
        training_state = TrainingState(**json.loads((directory / STATE_FILE).read_text(encoding="utf-8")))
        if fingerprint is not None and training_state.config_fingerprint != fingerprint:
            raise MariusInputError("checkpoint was written with a different model or dataset", path=directory,
                                   expected="the model settings and dataset of the run's config.yaml")
        store = EmbeddingStore(directory / NODES, mode="r")
        nodes, state = store.read_all() if with_nodes else (None, None)
        model_state = torch.load(directory / MODEL_FILE, map_location="cpu", weights_only=True)
    except (OSError, ValueError, KeyError, TypeError, RuntimeError) as error:
        raise MariusInputError(f"checkpoint version is missing or damaged ({type(error).__name__}: {error})",
                               path=directory, expected="a version committed by `marius-py train`") from None
    return nodes, state, model_state, training_state


def check_version(directory: Path) -> None:
    """Refuse a version whose files differ from its manifest (versions from before manifests pass)."""
    if not has_manifest(directory):
        return
    problems = verify_manifest(directory)
    if problems:
        more = f" and {len(problems) - 1} more" if len(problems) > 1 else ""
        raise MariusInputError(f"checkpoint is corrupt: {problems[0]}{more}", path=directory,
                               expected="intact files: `marius-py verify RUN_DIR` lists every problem and "
                                        "the versions that are intact")
