"""The trainers' process group, from torchrun's environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT).

torch.distributed's ``env://`` rendezvous gives every trainer the same key-value
store (torchrun's own when it hosts one); the process group and the bucket
scheduler's messages use it under separate prefixes. Control traffic
(barriers, objects, relation averages: kilobytes to megabytes) goes through
gloo on every backend; node embeddings move through the shared store on disk.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta

import torch.distributed as dist

from marius_py.errors import MariusInputError


STORE_PREFIX = "marius_py"


def launched_by_torchrun() -> bool:
    """Whether this process is a trainer of a group: started by torchrun (even alone: the distributed
    path with one trainer is the baseline of its scaling), or one of several (WORLD_SIZE)."""
    return "TORCHELASTIC_RUN_ID" in os.environ or int(os.environ.get("WORLD_SIZE", "1")) > 1


def restarted_by_torchrun() -> bool:
    """torchrun's elastic restart (``--max-restarts``) reruns the command: it then resumes the run."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0


@dataclass
class Group:
    rank: int
    world_size: int
    store: dist.Store           # the scheduler's requests and replies
    control: dist.ProcessGroup  # gloo
    timeout: timedelta

    @property
    def is_leader(self) -> bool:
        return self.rank == 0

    def own_store_connection(self) -> dist.Store:
        """A second connection to the rendezvous store, for a thread of its own: one TCPStore client
        serves one request at a time, so a thread blocked in ``get`` would stall another's requests."""
        client = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                               timeout=self.timeout)
        return dist.PrefixStore(STORE_PREFIX, client)

    def barrier(self) -> None:
        dist.barrier(group=self.control)

    def all_gather(self, value) -> list:
        out = [None] * self.world_size
        dist.all_gather_object(out, value, group=self.control)
        return out

    def broadcast(self, value):
        """Rank 0's ``value`` on every rank."""
        box = [value]
        dist.broadcast_object_list(box, src=0, group=self.control)
        return box[0]

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()


def join_group(timeout_seconds: float, cuda: bool) -> Group:
    """Join the group torchrun started (NCCL as the default backend on CUDA, gloo otherwise)."""
    if not dist.is_available():
        raise MariusInputError("torch.distributed is not available in this torch build", path="torch",
                               expected="a torch build with distributed support (Linux or macOS wheels)")
    timeout = timedelta(seconds=timeout_seconds)
    store, rank, world_size = next(dist.rendezvous("env://", timeout=timeout))
    store.set_timeout(timeout)
    backend = "nccl" if cuda and dist.is_nccl_available() else "gloo"
    dist.init_process_group(backend, store=dist.PrefixStore("process_group", store), rank=rank,
                            world_size=world_size, timeout=timeout)
    control = dist.new_group(backend="gloo", timeout=timeout) if backend != "gloo" else dist.group.WORLD
    return Group(rank, world_size, dist.PrefixStore(STORE_PREFIX, store), control, timeout)
