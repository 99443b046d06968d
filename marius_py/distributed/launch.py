"""``marius-py train`` under torchrun: join the group, set the run up once, train, test on rank 0."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch

from marius_py.checkpoint import RunDirectory
from marius_py.config import Config
from marius_py.errors import MariusInputError
from marius_py.run_setup import claim_run_dir, unwritable_as_user_error
from marius_py.distributed.group import Group, join_group, launch_id, restart_count
from marius_py.distributed.trainer import DISTRIBUTED_DIR, DistributedTrainer, write_pid

LAUNCH_FILE = "launch.json"      # in RUN_DIR/distributed: the torchrun launch that created the run
SETUP_WAIT = timedelta(days=7)   # rank 0's setup (preprocessing, store creation, checksums) has no limit


@dataclass(frozen=True)
class RunSteps:
    """The steps of a run that the API defines and a trainer group shares (passed in by ``api.train``: this
    package sits below the API and does not import it)."""

    default_run_dir: Callable[[Config], Path]
    open_dataset: Callable[[Config, bool], object]        # (config, progress) -> Dataset
    finish_training: Callable[..., object]                # (trainer, config, dataset, run_dir) -> TrainedModel


def train_distributed(config: Config, run_dir, progress: bool, resume: bool, api: RunSteps):
    """This process's share of a run trained by torchrun's trainers; rank 0 returns the tested model,
    the others ``None``."""
    _check_devices(config)
    cuda = config.training.device in ("auto", "cuda") and torch.cuda.is_available()
    if cuda:  # one GPU per trainer; NCCL's communicators use the current device
        config.training.device = f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}"
        torch.cuda.set_device(config.training.device)
    group = join_group(config.distributed.timeout_seconds, cuda)
    try:
        run_dir = Path(group.broadcast(str(Path(run_dir or api.default_run_dir(config)).resolve())))
        resume = resume or _restarted_launch_of(run_dir)
        with _set_up(api, config, run_dir, progress, resume, group) as (trainer, dataset):
            write_pid(run_dir, group.rank)
            group.barrier()  # every trainer is set up: the first epoch's buckets are shared from its start
            try:
                trainer.train()
                group.barrier()
                return api.finish_training(trainer, config, dataset, run_dir) if group.is_leader else None
            finally:
                trainer.stop_scheduler()
                trainer.close()
                trainer.run.close()
    finally:
        group.close()


@contextmanager
def _set_up(api: RunSteps, config: Config, run_dir: Path, progress: bool, resume: bool, group: Group):
    """(trainer, dataset) of this trainer, for the with-block that trains. Rank 0 claims the run directory for
    the group (``run_setup.claim_run_dir``: it locks the directory, prepares the dataset and creates or
    restores the store) and holds it until the block ends; the others wait for its setup, then open what it
    made (they only read the run directory). A file that may not be written is one error naming it."""
    setup = group.store_connection()
    if group.is_leader:
        with claim_run_dir(run_dir, resume, lambda: _start(api, config, run_dir, progress, resume, group)) as started:
            setup.set("setup_done", "1")
            yield started
    else:
        setup.wait(["setup_done"], SETUP_WAIT)
        with unwritable_as_user_error():
            yield _start(api, config, run_dir, False, True, group)


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


def _start(api: RunSteps, config: Config, run_dir: Path, progress: bool, resume: bool, group: Group):
    if not resume:
        RunDirectory(run_dir).create(config)
    if group.is_leader:  # (also for a run that one process started: its logs go there from now on)
        (run_dir / DISTRIBUTED_DIR).mkdir(parents=True, exist_ok=True)
    if not resume:
        (run_dir / DISTRIBUTED_DIR / LAUNCH_FILE).write_text(json.dumps({"launch": launch_id()}) + "\n")
    dataset = api.open_dataset(config, progress)
    return DistributedTrainer(config, dataset, run_dir, group, progress=progress), dataset
