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
                               config fingerprint (its fields) and the dataset's identity
          position.pt          mid-epoch versions (v000003.s000012: 12 buffer states of epoch 4
                               done) only: the epoch's walk, generator devices and states
          MANIFEST.json        size and checksum of every file above (storage/manifest.py)
        POINTERS.json          {"latest": newest committed version, "best": best validation MRR}

Commit: the version is written under a temporary name, every file is fsynced,
the directory is renamed into place, and only then is the one pointer file
replaced atomically (write, fsync, rename), so "latest" and "best" always move
together. A kill at any instant leaves the previous pointers naming complete
versions. Versions no pointer names are deleted after the bump (only older
versions and leftovers of killed commits: version directories by name, never
anything else). Loading a version first checks its files against its manifest
and names any file that changed after the commit.

A pointer file that is missing, unreadable, of the wrong shape or names a
version that is gone is recovered from the versions themselves: the newest
version on disk whose files match its manifest becomes "latest" (its
state.json names the best epoch), and a resume rewrites the pointer file
atomically; when that newest version is damaged, nothing is guessed: the error
names the file. A run directory is used by one training command at a time: it
holds ``RUN_DIR/LOCK`` (``run_lock.RunLock``, an flock) while it runs
(``run_setup.claim_run_dir`` makes or checks the directory and locks it).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from marius_py.config import Config, dump_config
from marius_py.dataset import DatasetMetadata
from marius_py.errors import MariusInputError
from marius_py.identity import describe_change
from marius_py.layout import StorageLayout
from marius_py.run_log import read_json_lines
from marius_py.storage import durable
from marius_py.storage.durable import fsync_directory, fsync_tree
from marius_py.storage.embedding_store import EmbeddingStore
from marius_py.storage.manifest import MANIFEST_FILE, has_manifest, verify_manifest, write_manifest

CONFIG_FILE = "config.yaml"
METRICS_FILE = "metrics.jsonl"
CHECKPOINTS = "checkpoints"
POINTERS = "POINTERS.json"
LIVE_STORE = "store"
NODES = "nodes"
MODEL_FILE = "model.pt"
STATE_FILE = "state.json"
POSITION_FILE = "position.pt"
# state.json of a version written with a manifest says so: a version without MANIFEST.json is then damaged
# (versions from before manifests existed lack both and are loaded unchecked).
CHECKSUMMED = "checksummed"
_VERSION = re.compile(r"v(\d{6})(?:\.s(\d{6}))?")
TEMPORARY_VERSION = re.compile(r"\.v\d{6}(?:\.s\d{6})?\.tmp")  # a version being written


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
    holders: list[int] | None = None  # trainers of a group: partition -> the rank whose store has it
    fingerprint_fields: dict | None = None  # what config_fingerprint hashes (None: a version from before)
    dataset_identity: dict | None = None    # the dataset's content (marius_py.identity; None: from before)
    ended_with: list[int] | None = None     # out of core: the partitions the last completed epoch ended with,
    #                                         which the next epoch's ordering continues from (None: from before)


_DATASET_CHANGE = "the dataset differs"
# What the fingerprint's fields are called where a user sets them.
_FIELD_SOURCES = {"decoder": "model.decoder", "dim": "model.dim", "adagrad_variant": "training.adagrad_variant",
                  "relation_optimizer": "training.relation_optimizer",
                  "num_partitions": "storage.num_partitions (as stored)", "storage_dtype": "storage.dtype",
                  "num_nodes": "the dataset's nodes", "num_relations": "the dataset's relations",
                  "num_train": "the dataset's train edges", "preprocess_seed": "the dataset's preprocessing seed"}


@dataclass(frozen=True)
class RunFingerprint:
    """What a checkpoint's tensors depend on (``fields``: the model's shapes, the store's physical partitions
    and dtype, the dataset's counts) and the dataset's content (``dataset``: its identity)."""

    fields: dict
    dataset: dict

    @classmethod
    def of(cls, config: Config, metadata: DatasetMetadata, layout: StorageLayout) -> "RunFingerprint":
        fields = {"decoder": config.model.decoder, "dim": config.model.dim,
                  "adagrad_variant": config.training.adagrad_variant,
                  "relation_optimizer": config.training.relation_optimizer,
                  "num_partitions": layout.num_partitions,
                  "num_nodes": metadata.num_nodes, "num_relations": metadata.num_relations,
                  "num_train": metadata.num_train, "preprocess_seed": metadata.seed}
        if layout.dtype != "float32":  # (absent for float32: earlier checkpoints keep their fingerprint)
            fields["storage_dtype"] = layout.dtype
        return cls(fields, dict(metadata.identity))

    @property
    def digest(self) -> str:
        """The hash of ``fields`` (``TrainingState.config_fingerprint``; a group's trainers compare it)."""
        return hashlib.sha256(json.dumps(self.fields, sort_keys=True).encode()).hexdigest()[:16]

    def stamp(self, state: TrainingState) -> TrainingState:
        """``state`` recording this fingerprint (the next version is written with it)."""
        state.config_fingerprint = self.digest
        state.fingerprint_fields, state.dataset_identity = dict(self.fields), dict(self.dataset)
        return state

    def differences(self, state: TrainingState) -> list[str]:
        """How ``state``'s version differs from this fingerprint, one phrase each (empty: it matches)."""
        found = []
        if state.config_fingerprint != self.digest and not state.fingerprint_fields:
            found.append("the model's shapes or the dataset's counts (the version predates recording which)")
        trained = RunFingerprint(state.fingerprint_fields or self.fields, state.dataset_identity or {})
        return found + trained.changes_to(self, "when trained", "now")

    def changes_to(self, other: "RunFingerprint", this_label: str, other_label: str) -> list[str]:
        """What differs from this fingerprint to ``other``, as "setting: value THIS_LABEL, value OTHER_LABEL"
        phrases, and how the dataset changed (where both know its identity)."""
        def shown(fields: dict, key: str):
            return fields.get(key, "float32" if key == "storage_dtype" else "absent")
        found = [f"{_FIELD_SOURCES.get(key, key)}: {shown(self.fields, key)} {this_label}, "
                 f"{shown(other.fields, key)} {other_label}"
                 for key in sorted(self.fields.keys() | other.fields.keys())
                 if shown(self.fields, key) != shown(other.fields, key)]
        change = describe_change(self.dataset, other.dataset) if self.dataset and other.dataset else None
        return found + ([f"{_DATASET_CHANGE}: {change}"] if change else [])

    def check(self, state: TrainingState, version: Path) -> None:
        """Refuse a version written for another model or dataset, naming what differs."""
        differences = self.differences(state)
        if not differences:
            return
        if all(phrase.startswith("the dataset") for phrase in differences):  # (its counts, or its content)
            expected = ("the dataset as the run trained on it: preprocess it again as it was (the same files, line "
                        "order and seed), or train a new run on the changed dataset")
        else:
            expected = "the model settings and dataset of the run's config.yaml"
        raise MariusInputError(f"the checkpoint was written with a different model or dataset: "
                               f"{'; '.join(differences)}", path=version, expected=expected)


class RunDirectory:
    """A training run's directory: config, metrics log and checkpoints."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.checkpoints = self.path / CHECKPOINTS
        self._recovered: dict | None = None  # pointers recovered from the versions (the pointer file was not sound)
        self.recovery_note: str | None = None

    # ---- creation and logs ----
    def create(self, config: Config) -> None:
        self.checkpoints.mkdir(parents=True, exist_ok=True)
        self.write_config(config)

    def write_config(self, config: Config) -> None:
        durable.write_text_atomic(self.path / CONFIG_FILE, dump_config(config))

    def log(self, record: dict) -> None:
        """Append ``record`` to the metrics log (opened per record: a kill loses at most the line being written)."""
        with open(self.path / METRICS_FILE, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(record, sort_keys=True) + "\n")

    def read_metrics(self) -> list[dict]:
        """The metrics log's records (``metric_lines`` without line numbers)."""
        return [record for _, record in self.metric_lines()]

    def metric_lines(self) -> list[tuple[int, dict]]:
        """(line number, record) of every line of the metrics log ([] when there is none).

        A last line without its newline that is not a JSON object is what a kill
        in the middle of a write leaves: it is skipped (the next run's
        ``truncate_metrics`` drops it). Any other line that is not one JSON
        object is refused with the file and line.
        """
        return read_json_lines(self.path / METRICS_FILE)

    def truncate_metrics(self, epoch: int) -> None:
        """Drop log records of epochs after ``epoch`` (written before a crash cut their commit) and a last
        line a kill cut short; a damaged line elsewhere is refused (file:line) before anything is rewritten."""
        kept = [r for r in self.read_metrics() if r.get("epoch", 0) <= epoch]
        durable.write_text_atomic(self.path / METRICS_FILE,
                                  "".join(json.dumps(r, sort_keys=True) + "\n" for r in kept))

    # ---- versions ----
    @property
    def pointer_file(self) -> Path:
        return self.checkpoints / POINTERS

    def _pointer_file(self) -> dict | None:
        """The pointer file as written (None: there is none). MariusInputError naming it when it is not
        ``{"latest": VERSION[, "best": VERSION]}`` with best no newer than latest."""
        path = self.pointer_file
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        except (OSError, UnicodeDecodeError) as error:
            raise MariusInputError(f"unreadable ({type(error).__name__}: {error})", path=path) from None
        try:
            pointers = json.loads(text)
        except ValueError as error:
            raise MariusInputError(f"not JSON ({error})", path=path) from None
        names = pointers.values() if isinstance(pointers, dict) else ()
        if not (isinstance(pointers, dict) and "latest" in pointers and set(pointers) <= {"latest", "best"}
                and all(isinstance(name, str) and _VERSION.fullmatch(name) for name in names)
                and version_key(pointers.get("best", pointers["latest"])) <= version_key(pointers["latest"])):
            raise MariusInputError(f"not a pointer file: {text.strip()[:80]!r}", path=path,
                                   expected='{"latest": "v000003", "best": "v000002"}')
        return pointers

    def _pointers(self) -> dict:
        """latest and best: the pointer file's or, when it is missing, damaged or names a latest version that
        is gone, recovered from the versions on disk (``_recover``); {} when nothing was ever committed."""
        if self._recovered is not None:
            return dict(self._recovered)
        try:
            pointers = self._pointer_file()
        except MariusInputError as damage:
            return self._recover(damage.problem)
        if pointers is None:
            return self._recover("missing") if self.versions_on_disk() else {}
        if not (self.checkpoints / pointers["latest"]).is_dir():
            return self._recover(f"names {pointers['latest']}, which is missing")
        return pointers

    def _recover(self, problem: str) -> dict:
        """Pointers to the newest version on disk, when its files are intact (its state.json names the best
        epoch); otherwise an error naming the damaged file: nothing older is chosen behind the user's back."""
        where = self.pointer_file
        versions = self.versions_on_disk()
        if not versions:
            raise MariusInputError(f"{problem}, and {self.checkpoints} holds no version to recover from",
                                   path=where, expected="a run directory with its committed versions")
        newest = versions[-1]
        damage = version_problems(newest)
        if damage:
            older = f", or remove {newest} to resume from {versions[-2].name}" if len(versions) > 1 else ""
            raise MariusInputError(f"{problem}, and the newest version, {newest.name}, is damaged: {damage[0]}",
                                   path=where, expected=f"the damaged file restored from a copy{older}")
        pointers = {"latest": newest.name}
        best = _best_version_name(newest)
        if best is not None and (self.checkpoints / best).is_dir():
            pointers["best"] = best
        self._recovered = pointers
        self.recovery_note = (f"{where}: {problem}; recovered from the versions on disk: latest {newest.name} "
                              f"(the newest, intact), best {pointers.get('best', 'unknown')}")
        return dict(pointers)

    def repair_pointers(self) -> str | None:
        """Before training moves on from the pointers: write the pointer file again, atomically, when it had
        to be recovered or names a best version that is gone (dropped: the next new best is kept). Returns
        what was done (None: the pointers were sound).

        A best version whose files are damaged is refused, naming the file, like a damaged latest one:
        dropping it would let the next commit delete the run's only copy of its best model, which restoring
        the one damaged file from a copy mends (removing the version resumes without it)."""
        pointers = self._pointers()
        note = self.recovery_note if self._recovered is not None else None
        best = pointers.get("best")
        if best is not None and not (self.checkpoints / best).is_dir():
            del pointers["best"]
            note = (note + "; " if note else "") + f"{self.pointer_file}: best names {best}, which is missing: " \
                                                   f"dropped (the next new best is kept)"
        elif best is not None and best != pointers["latest"]:  # (latest is checked as it is loaded)
            self._refuse_a_damaged_best(self.checkpoints / best)
        if note is None:
            return None
        durable.write_text_atomic(self.pointer_file, json.dumps(pointers) + "\n")
        self._recovered = None
        return note

    def _refuse_a_damaged_best(self, version: Path) -> None:
        damage = version_problems(version)
        if damage:
            raise MariusInputError(f"best names {version.name}, which is damaged: {_summary(damage)}",
                                   path=self.pointer_file,
                                   expected=f"the damaged file restored from a copy, or {version} removed to "
                                            f"resume without a best version (the next new best is kept)")

    def versions_on_disk(self) -> list[Path]:
        """Every version directory in checkpoints/ (committed, or left by a commit a kill cut short), oldest
        first."""
        try:
            children = list(self.checkpoints.iterdir())
        except (FileNotFoundError, NotADirectoryError):
            return []
        return sorted((child for child in children if _VERSION.fullmatch(child.name) and child.is_dir()),
                      key=lambda child: version_key(child.name))

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

    def prepare_version(self, tmp: Path, epoch: int, states_done: int = 0) -> Path:
        """Checksum and fsync ``tmp`` and rename it to its final name, which no pointer names yet (``point_to``
        commits it; a group's trainers each prepare theirs before the leader's pointer commits the group's)."""
        pointers = self._pointers()
        previous = pointers.get("latest")
        write_manifest(tmp, None if previous is None else self.checkpoints / previous)
        fsync_tree(tmp)
        final = self.checkpoints / version_name(epoch, states_done)
        if final.name in pointers.values() or (previous is not None
                                               and version_key(final.name) <= version_key(previous)):
            raise MariusInputError(f"version {final.name} would replace committed state ({POINTERS} names "
                                   f"{previous}): another process trains in this run directory", path=final,
                                   expected="one training command per run directory at a time")
        if final.exists():  # newer than latest, so never committed: a leftover of a commit a kill cut short
            shutil.rmtree(final)
        os.replace(tmp, final)
        fsync_directory(self.checkpoints)
        return final

    def point_to(self, version: Path, is_best: bool, keeps_best: bool = True) -> None:
        """Commit a prepared version: the pointer file names it latest (and best), replaced atomically; then
        versions no pointer names are deleted. Without ``keeps_best`` (a trainer of a group other than its
        leader, whose best version is the run's) it names the latest alone."""
        pointers = self._pointers() if keeps_best else {}
        pointers["latest"] = version.name
        if is_best:
            pointers["best"] = version.name
        self._write_pointers(pointers)

    def _write_pointers(self, pointers: dict) -> None:
        durable.write_text_atomic(self.pointer_file, json.dumps(pointers) + "\n")
        self._recovered = None
        self._delete_unreferenced(set(pointers.values()))

    def adopt_version(self, name: str) -> Path:
        """The version ``name`` that a group committed (its leader's pointer names it), made this directory's
        latest: a trainer killed between writing it and pointing to it points to it now, and one whose
        pointers name a version the group never committed drops that. MariusInputError when it is not here
        intact (a trainer's run directory from another run, or damaged)."""
        version = self.checkpoints / name
        try:
            pointed = (self._pointer_file() or {}).get("latest")
        except MariusInputError:  # (a damaged pointer file: rewritten below)
            pointed = None
        if pointed == name and version.is_dir():
            return version
        damage = version_problems(version)
        if damage:
            raise MariusInputError(f"the group's last commit is {name}, and this trainer's copy of it is "
                                   f"{'missing' if not version.is_dir() else 'damaged: ' + damage[0]}",
                                   path=version, expected="each trainer resumed with its own run directory "
                                                          "(the same --run-dir and node ranks as before)")
        self._write_pointers({"latest": name})
        return version

    def drop_versions(self) -> None:
        """Remove the pointer file and every version: a trainer of a group whose leader committed nothing holds
        only versions written for a commit that never happened."""
        self.pointer_file.unlink(missing_ok=True)
        self._recovered = None
        for version in self.versions_on_disk():
            shutil.rmtree(version)

    def committed_versions(self) -> list[Path]:
        """The versions the pointers name (latest, best), oldest first."""
        return [self.checkpoints / name for name in sorted(set(self._pointers().values()), key=version_key)]

    def _delete_unreferenced(self, keep: set[str]) -> None:
        """After a commit: versions the pointers no longer name (superseded by the commit, or leftovers of a
        commit a kill cut short) and temporary directories. Anything not named like a version is left."""
        for child in self.checkpoints.iterdir():
            if child.name not in keep and child.is_dir() and (_VERSION.fullmatch(child.name)
                                                              or TEMPORARY_VERSION.fullmatch(child.name)):
                shutil.rmtree(child, ignore_errors=True)


class MetricsLog:
    """The metrics log as the run's first callback (``marius_py.callbacks``): every record, appended to
    metrics.jsonl before any other callback sees it."""

    def __init__(self, run: RunDirectory):
        self.run = run

    def on_record(self, view, record: dict) -> None:
        self.run.log(record)


def version_name(epoch: int, states_done: int = 0) -> str:
    """``v000003`` after epoch 3; ``v000003.s000012`` after 12 buffer states of epoch 4 (sorts between)."""
    return f"v{epoch:06d}" + (f".s{states_done:06d}" if states_done else "")


def version_key(name: str) -> tuple[int, int]:
    """(epochs done, buffer states of the next done) of a version's name: the order of commits."""
    match = _VERSION.fullmatch(name)
    if match is None:
        raise ValueError(f"not a version name: {name!r}")
    return int(match.group(1)), int(match.group(2) or 0)


def _best_version_name(directory: Path) -> str | None:
    """The version of the best epoch a version's state.json records (None: none yet, or unreadable)."""
    try:
        best = read_state(directory)[0].best_epoch
    except MariusInputError:
        return None
    return version_name(best) if isinstance(best, int) and not isinstance(best, bool) and best > 0 else None


def read_state(directory: Path) -> tuple[TrainingState, bool]:
    """A version's state.json: its training state, and whether the version was committed with a manifest
    (``CHECKSUMMED``). MariusInputError naming the file when it is missing, unreadable or not a state."""
    path = directory / STATE_FILE
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
        checksummed = bool(raw.pop(CHECKSUMMED, False))
        return TrainingState(**raw), checksummed
    except (OSError, ValueError, AttributeError, TypeError) as error:  # (a JSON list or string: not a state)
        raise MariusInputError(f"unreadable ({type(error).__name__}: {error})", path=path,
                               expected="the state a commit writes: `marius-py verify RUN_DIR` checks every "
                                        "version") from None


def write_version_state(directory: Path, model_state: dict, training_state: TrainingState,
                        position: dict | None = None) -> None:
    """The non-embedding files of a version: model parameters, training position and, mid-epoch, where in
    the epoch (the walk it belongs to, the generators' devices and states)."""
    torch.save(model_state, directory / MODEL_FILE)
    state = {**training_state.__dict__, CHECKSUMMED: True}  # (prepare_version writes its manifest)
    (directory / STATE_FILE).write_text(json.dumps(state, indent=2), encoding="utf-8")
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


def load_version(directory: Path, fingerprint: RunFingerprint | None = None, with_nodes: bool = True
                 ) -> tuple[np.ndarray | None, np.ndarray | None, dict, TrainingState]:
    """Node embeddings, node optimizer state, model state dict and training state of a version.

    With ``fingerprint``, refuse a version written for another model or dataset (before anything is read or
    written); without ``with_nodes`` the (possibly larger than memory) node arrays are not read.
    """
    check_version(directory)
    training_state, _ = read_state(directory)
    if fingerprint is not None:
        fingerprint.check(training_state, directory)
    try:
        store = EmbeddingStore(directory / NODES, mode="r")
        nodes, state = store.read_all() if with_nodes else (None, None)
        model_state = torch.load(directory / MODEL_FILE, map_location="cpu", weights_only=True)
    except (OSError, ValueError, KeyError, TypeError, RuntimeError) as error:
        raise MariusInputError(f"checkpoint version is missing or damaged ({type(error).__name__}: {error})",
                               path=directory, expected="a version committed by `marius-py train`") from None
    return nodes, state, model_state, training_state


def version_problems(directory: Path) -> list[str]:
    """What is wrong with a version's files, one line each naming the file (empty: intact). A version from
    before manifests existed is only checked for its files being there."""
    if not directory.is_dir():
        return [f"{directory}: missing"]
    if has_manifest(directory):
        return verify_manifest(directory)
    missing = [f"{directory / name}: missing" for name in (STATE_FILE, MODEL_FILE, NODES)
               if not (directory / name).exists()]
    if missing:
        return missing
    try:
        _, checksummed = read_state(directory)
    except MariusInputError as error:
        return [f"{error.path}: {error.problem}, and no {MANIFEST_FILE}"]
    return [f"{directory / MANIFEST_FILE}: missing (the version was committed with one)"] if checksummed else []


def check_holders(state: TrainingState, num_trainers: int, version: Path) -> None:
    """Refuse a version whose partitions are spread over more trainers' run directories than load it (a
    group's version between its gathers: each trainer's run directory holds a share)."""
    if state.holders and max(state.holders) >= num_trainers:
        raise MariusInputError(f"the version's partitions are spread over the run directories of "
                               f"{max(state.holders) + 1} torchrun trainers", path=version,
                               expected="--resume with torchrun and as many trainers, or a version that "
                                        "holds every partition (the best one, or the last of a finished run)")


def check_version(directory: Path) -> None:
    """Refuse a version whose files differ from its manifest (versions from before manifests pass)."""
    if not directory.is_dir():
        raise MariusInputError("checkpoint version is missing", path=directory,
                               expected="the version the run's checkpoints/POINTERS.json names (`marius-py verify "
                                        "RUN_DIR` lists the versions there)")
    problems = version_problems(directory)
    if problems:
        raise MariusInputError(f"checkpoint is corrupt: {_summary(problems)}", path=directory,
                               expected="intact files: `marius-py verify RUN_DIR` lists every problem and "
                                        "the versions that are intact")


def _summary(problems: list[str]) -> str:
    """The first of a version's problems, and how many more there are."""
    return problems[0] + (f" and {len(problems) - 1} more" if len(problems) > 1 else "")
