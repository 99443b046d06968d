"""``marius-py train`` under torchrun: join the group, set the run up once, train, test on rank 0."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from marius_py.config import Config
from marius_py.errors import MariusInputError
from marius_py.distributed.group import join_group, restarted_by_torchrun
from marius_py.distributed.trainer import DistributedTrainer, write_pid


def train_distributed(config: Config, run_dir, progress: bool, resume: bool):
    """This process's share of a run trained by torchrun's trainers; rank 0 returns the tested model,
    the others ``None``."""
    from marius_py import api  # (api imports this module)
    cuda = config.training.device in ("auto", "cuda") and torch.cuda.is_available()
    if cuda:  # one GPU per trainer
        config.training.device = f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}"
    group = join_group(config.distributed.timeout_seconds, cuda)
    try:
        if config.storage.num_partitions < 2:
            raise MariusInputError("several trainers take disjoint buckets of a partitioned store",
                                   path="storage.num_partitions",
                                   expected="storage.num_partitions >= 2 (PyTorch-BigGraph advises >= 2 x "
                                            "trainers)")
        resume = resume or restarted_by_torchrun()
        run_dir = Path(group.broadcast(str(run_dir or api.default_run_dir(config))))
        if group.is_leader:
            api.check_new_run_dir(run_dir, resume)
            trainer, dataset = _start(api, config, run_dir, progress, resume, group)
        group.barrier()  # the dataset is preprocessed and the store created once, by rank 0
        if not group.is_leader:
            trainer, dataset = _start(api, config, run_dir, False, True, group)
        write_pid(run_dir, group.rank)
        group.barrier()  # every trainer is set up: the first epoch's buckets are shared from its start
        try:
            trainer.train()
            group.barrier()
            if not group.is_leader:
                return None
            return api.finish_training(trainer, config, dataset, run_dir)
        finally:
            trainer.stop_scheduler()
            trainer.close()
            trainer.run.close()
    finally:
        group.close()


def _start(api, config: Config, run_dir: Path, progress: bool, resume: bool, group):
    if not resume:
        api.RunDirectory(run_dir).create(config)
    dataset = api.open_dataset(config, progress)
    return DistributedTrainer(config, dataset, run_dir, group, progress=progress), dataset
