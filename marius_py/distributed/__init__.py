"""Training on several processes and machines: torch.distributed, launched with torchrun.

    torchrun --nproc-per-node 2 -m marius_py train CONFIG storage.num_partitions=8 --run-dir /shared/run

Every trainer opens the same run directory, which must be on a file system all
of them share (as PyTorch-BigGraph's partitioned checkpoints): the partitions
move through it. See ``trainer`` (one trainer), ``scheduler_service`` (rank 0's
bucket scheduler over torch.distributed's store), ``relations`` (relation
parameters kept in step by all-reduce) and ``group`` (the process group).
"""

from marius_py.distributed.group import launched_by_torchrun
from marius_py.distributed.launch import RunSteps, train_distributed

__all__ = ["RunSteps", "launched_by_torchrun", "train_distributed"]
