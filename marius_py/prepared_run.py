"""A run as planned before its trainer is built (``prepare_run``): devices, the graph's size and the plan found
once, a buffer's memory checked, and the dataset bucketed for the plan's partitions. The run's setup
(``api.train``, ``distributed.launch``) prepares it, prints the plan, pins config.yaml from it and hands it
to the ``Trainer``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from marius_py.bundled import bucketed_for_run
from marius_py.config import Config
from marius_py.dataset import Dataset, required_given_negatives
from marius_py.devices import resolve_devices
from marius_py.layout import with_split_applied
from marius_py.plan import GraphSize, Machine, Plan, plan_run
from marius_py.resources import check_memory, check_partitioning
from marius_py.timeline import Startup


@dataclass(frozen=True)
class PreparedRun:
    """A run as planned before its trainer is built: the plan, the config it applies, the dataset bucketed for
    the plan's partitions, the devices and the graph's size (each found once, by ``prepare_run``)."""

    plan: Plan
    config: Config
    dataset: Dataset
    devices: list[torch.device]
    graph: GraphSize

    def pinned_config(self) -> Config:
        """What the run directory's config.yaml records: the config with the plan's partitions and buffer, the
        split the dataset allowed and the dtype pinned (a resume plans nothing anew)."""
        return with_split_applied(self.config, self.plan.layout)


def prepare_run(config: Config, dataset: Dataset, run_dir: str | Path | None = None, progress: bool = False,
                world_size: int = 1, torchrun: bool = False, startup: Startup | None = None) -> PreparedRun:
    """Plan ``config``'s run on ``dataset`` for this machine (the disk of ``run_dir``; ``world_size``: torchrun
    trainers sharing the tables; ``torchrun``: they are a torchrun group, of one included; with ``progress`` the
    plan is printed), refuse a buffer that does not fit in memory now, and, out of core, bucket
    the dataset for the plan's partitions (a copy in the cache where the dataset's own buckets differ)."""
    check_protocol(config.evaluation.protocol, dataset)
    devices = resolve_devices(config)
    graph = GraphSize.of_dataset(config, dataset)
    plan = plan_run(config, graph, Machine.probe(devices, run_dir), world_size, torchrun)
    if progress:
        print(plan.describe())
    partitions = plan.layout.num_partitions
    if partitions > 1:  # before anything is written (a re-bucketed copy of the dataset included)
        check_memory(plan.buffer_bytes, "storage.buffer_capacity")  # (a GPU buffer stages through as many)
        dataset = bucketed_for_run(partitions, dataset, progress)
        check_partitioning(partitions, dataset)
        if startup is not None:
            startup.mark("bucketing")
    return PreparedRun(plan, plan.applied(config), dataset, devices, graph)


def check_protocol(protocol: str, dataset: Dataset) -> None:
    """Refuse, before training, a protocol the dataset cannot be evaluated by: ``given`` needs the negatives
    a dataset prepared from OGB carries for each split it has."""
    if protocol == "given":
        for split, count in (("valid", dataset.metadata.num_valid), ("test", dataset.metadata.num_test)):
            if count:
                required_given_negatives(dataset.directory, split)
