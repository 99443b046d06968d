"""The trainers' process group, from torchrun's environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT).

torch.distributed's ``env://`` rendezvous gives every trainer the same key-value
store (torchrun's own when it hosts one); the process group and the bucket
scheduler's messages use it under separate prefixes. Control traffic
(barriers, objects, relation changes: kilobytes to megabytes) goes through
gloo on every backend (``relations`` says why also between GPUs); node
embeddings move through the shared store on disk.
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


def restart_count() -> int:
    """torchrun's elastic restarts so far (``--max-restarts`` reruns the command: it then resumes)."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))


def launch_id() -> str:
    """torchrun's id of this launch, the same across its restarts (empty without torchrun)."""
    return os.environ.get("TORCHELASTIC_RUN_ID", "")


@dataclass
class Group:
    rank: int
    world_size: int
    control: dist.ProcessGroup  # gloo
    timeout: timedelta
    attempt: int                # torchrun's restart count: keys of earlier attempts are not read again

    @property
    def is_leader(self) -> bool:
        return self.rank == 0

    def store_connection(self) -> dist.Store:
        """A connection of its own to the rendezvous store, under this attempt's prefix, for the
        scheduler's messages. One per thread: one TCPStore client serves one request at a time, so a
        thread blocked in ``get`` would stall another's requests. Every rank connects the same way
        (torchrun's own handle may add a prefix of its own, depending on the torch version)."""
        client = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                               timeout=self.timeout)
        return dist.PrefixStore(f"{STORE_PREFIX}/{self.attempt}", client)

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
    attempt = restart_count()  # a restart must not meet the dead workers' addresses in the store
    dist.init_process_group(backend, store=dist.PrefixStore(f"process_group/{attempt}", store), rank=rank,
                            world_size=world_size, timeout=timeout)
    control = dist.new_group(backend="gloo", timeout=timeout) if backend != "gloo" else dist.group.WORLD
    return Group(rank, world_size, control, timeout, attempt)
