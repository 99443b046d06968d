"""Training on several processes and machines: torch.distributed, launched with torchrun.

    torchrun --nproc-per-node 2 -m marius_py train CONFIG storage.num_partitions=8 --run-dir runs/two

Each trainer keeps its partitions in a run directory of its own, on its
machine's disk; partitions pass from trainer to trainer over torch.distributed
(as PyTorch-BigGraph's partition servers), so no file system is shared. See
``launch`` (the run directories and the dataset of each machine),
``granted_spans`` (a trainer as the trainer's span source), ``hand_over``
(partitions sent and received), ``scheduler_service`` (rank 0's bucket
scheduler over torch.distributed's store), ``relations`` (relation parameters
kept in step by all-reduce) and ``group`` (the process group).
"""

from marius_py.distributed.group import launched_by_torchrun
from marius_py.distributed.launch import RunSteps, train_distributed

__all__ = ["RunSteps", "launched_by_torchrun", "train_distributed"]
