"""``marius-py train`` under torchrun: join the group, set each trainer's run directory up, train, test on the
leader.

Every trainer has a run directory of its own on its machine's disk: the
leader's (rank 0) is ``--run-dir`` itself, the run's (config, metrics, the
group's commit marker, and after training every partition); rank r's is
``RUN_DIR/distributed/rankR`` under the ``--run-dir`` of its machine. A machine
without the leader also gets ``RUN_DIR/config.yaml``, so that the same
``--resume RUN_DIR`` command runs on every machine. Each machine prepares the
dataset in its own cache (its first trainer, while the others wait).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch

from marius_py.checkpoint import CONFIG_FILE, RunDirectory
from marius_py.config import Config
from marius_py.errors import MariusInputError
from marius_py.run_setup import claim_run_dir
from marius_py.prepared_run import prepare_run
from marius_py.trainer import Trainer
from marius_py.distributed.granted_spans import (DISTRIBUTED_DIR, GrantedSpans, check_group_config,
                                                 too_few_partitions)
from marius_py.distributed.group import Group, join_group, launch_id, local_rank, node_rank, restart_count

LAUNCH_FILE = "launch.json"      # in a trainer's RUN_DIR/distributed: the torchrun launch that created the run
PID_FILE = "trainer.pid"         # likewise: the trainer's process id
SETUP_WAIT = timedelta(days=7)   # a machine's setup (preprocessing, store creation, checksums) has no limit


@dataclass(frozen=True)
class RunSteps:
    """The steps of a run that the API defines and a trainer group shares (passed in by ``api.train``: this
    package sits below the API and does not import it)."""

    default_run_dir: Callable[[Config], Path]
    open_dataset: Callable[[Config, bool], object]        # (config, progress) -> Dataset
    finish_training: Callable[..., object]                # (trainer, config, dataset, run_dir) -> TrainedModel


def trainer_run_dir(run_dir: Path, rank: int) -> Path:
    """A trainer's own run directory under its machine's ``--run-dir``."""
    return run_dir if rank == 0 else run_dir / DISTRIBUTED_DIR / f"rank{rank}"


def train_distributed(config: Config, run_dir, progress: bool, resume: bool, api: RunSteps):
    """This process's share of a run trained by torchrun's trainers; the leader returns the tested model,
    the others ``None``."""
    _check_devices(config)
    run_dir = Path(run_dir or api.default_run_dir(config)).resolve()
    check_group_config(config, run_dir)
    cuda = config.training.device in ("auto", "cuda") and torch.cuda.is_available()
    if cuda:  # one GPU per trainer; NCCL's communicators use the current device
        config.training.device = f"cuda:{local_rank()}"
        torch.cuda.set_device(config.training.device)
    group = join_group(config.distributed.timeout_seconds, cuda)
    try:
        resume = group.broadcast(resume or _restarted_launch_of(run_dir))  # (the leader's run decides)
        with _set_up(api, config, run_dir, progress, resume, group) as (trainer, dataset, pinned):
            try:
                _write_pid(trainer.run.path)
                group.barrier()  # every trainer is set up: the first epoch's buckets are shared from its start
                if resume:  # (every trainer accepted the run's state; it may have extended training.epochs)
                    _save_config(pinned, run_dir, group)
                trainer.train()
                group.barrier()
                return api.finish_training(trainer, trainer.config, dataset, run_dir) if group.is_leader else None
            finally:
                trainer.close()  # (its callbacks' on_train_end too)
    finally:
        group.close()


@contextmanager
def _set_up(api: RunSteps, config: Config, run_dir: Path, progress: bool, resume: bool, group: Group):
    """(trainer, dataset, its planned config) of this trainer, for the with-block that trains. Each trainer claims its own run
    directory (``run_setup.claim_run_dir``: locked, made or checked, and what a new run wrote removed when its
    setup fails), the leader first (a new run clears what an earlier one left in RUN_DIR/distributed)."""
    setup = group.store_connection()
    own = trainer_run_dir(run_dir, group.rank)
    if not group.is_leader:
        setup.wait(["leader_claimed"], SETUP_WAIT)
    own_resume = resume and (group.is_leader or (own / CONFIG_FILE).is_file())  # (one that never started: new)
    with claim_run_dir(own, own_resume, lambda: _start(api, config, run_dir, progress, own_resume, group, setup)) \
            as started:
        yield started


def _start(api: RunSteps, config: Config, run_dir: Path, progress: bool, resume: bool, group: Group, setup):
    own = trainer_run_dir(run_dir, group.rank)
    if not resume:
        RunDirectory(own).create(config)
        (own / DISTRIBUTED_DIR).mkdir(parents=True, exist_ok=True)
        (own / DISTRIBUTED_DIR / LAUNCH_FILE).write_text(json.dumps({"launch": launch_id()}) + "\n")
    if group.is_leader:
        setup.set("leader_claimed", "1")
    dataset = _open_dataset_on_this_machine(api, config, progress and group.is_leader, setup)
    # (P alike on every trainer: not by memory)
    prepared = prepare_run(config, dataset, own, progress and group.is_leader, group.world_size, torchrun=True)
    plan, pinned = prepared.plan, prepared.pinned_config()
    if group.is_leader:
        warning = too_few_partitions(plan.num_partitions, group.world_size)
        if warning:
            print(f"marius-py: warning: {warning}", file=sys.stderr)
    if not resume:  # (a resume writes it once every trainer accepted the run's state: train_distributed)
        _save_config(pinned, run_dir, group)
    trainer = Trainer(prepared, own, progress=progress, group=group,
                      spans=lambda inputs: GrantedSpans(inputs, group, plan.held_per_trainer,
                                                        config.distributed.relation_sync_seconds,
                                                        dataset.directory))
    return trainer, dataset, pinned


def _save_config(pinned: Config, run_dir: Path, group: Group) -> None:
    """This trainer's config.yaml, and the machine's RUN_DIR's where a trainer other than the leader is the
    machine's first (the same --resume RUN_DIR runs on every machine)."""
    RunDirectory(trainer_run_dir(run_dir, group.rank)).write_config(pinned)
    if local_rank() == 0 and not group.is_leader:
        RunDirectory(run_dir).write_config(pinned)


def _open_dataset_on_this_machine(api: RunSteps, config: Config, progress: bool, setup):
    """The dataset, prepared in this machine's cache by its first trainer while the others wait."""
    ready = f"dataset_ready/{node_rank()}"
    if local_rank() != 0:
        setup.wait([ready], SETUP_WAIT)
    dataset = api.open_dataset(config, progress)
    if local_rank() == 0:
        setup.set(ready, "1")
    return dataset


def _check_devices(config: Config) -> None:
    if config.training.devices.strip():
        raise MariusInputError("under torchrun each trainer takes one GPU (that of its LOCAL_RANK)",
                               path="training.devices", expected="training.devices unset (and no --gpus); "
                                                                "--nproc-per-node N for N GPUs")


def _restarted_launch_of(run_dir: Path) -> bool:
    """Whether this is torchrun restarting the launch that created ``run_dir`` (it then resumes; a
    restart after a refused start, e.g. a directory holding another run, must not resume that run)."""
    marker = run_dir / DISTRIBUTED_DIR / LAUNCH_FILE
    return restart_count() > 0 and marker.exists() and json.loads(marker.read_text())["launch"] == launch_id()


def pid_file(trainer_dir: Path) -> Path:
    """Where a trainer's process id is, in its own run directory (for operators, and the failure tests)."""
    return Path(trainer_dir) / DISTRIBUTED_DIR / PID_FILE


def _write_pid(trainer_dir: Path) -> None:
    path = pid_file(trainer_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"{os.getpid()}\n")
