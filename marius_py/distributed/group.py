"""The trainers' process group, from torchrun's environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT).

torch.distributed's ``env://`` rendezvous gives every trainer the same key-value
store (torchrun's own when it hosts one); the process group and the bucket
scheduler's messages use it under a prefix of this attempt's. Control traffic
(barriers, objects, relation changes: kilobytes to megabytes) goes through
gloo on every backend (``relations`` says why also between GPUs); partitions
go point to point over the data groups (NCCL between GPUs, gloo on the CPU):
one for sends to a higher rank and one for sends to a lower, so that a pair's
two directions never queue behind each other (NCCL runs one communicator's
operations in order).
"""

from __future__ import annotations

import os
import time
import uuid
from dataclasses import dataclass
from datetime import timedelta

import torch.distributed as dist

from marius_py.errors import MariusInputError


STORE_PREFIX = "marius_py"
LEADER = 0
POLL_SECONDS = 0.01


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


def local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", "0"))


def node_rank() -> int:
    """torchrun's rank of this machine (its agent) in the launch."""
    return int(os.environ.get("GROUP_RANK", "0"))


@dataclass
class Group:
    rank: int
    world_size: int
    control: dist.ProcessGroup  # gloo
    data: tuple[dist.ProcessGroup, dist.ProcessGroup]  # partitions sent to a higher rank, to a lower one
    timeout: timedelta
    attempt: str                # this attempt's key prefix: keys of earlier attempts are never read

    @property
    def is_leader(self) -> bool:
        return self.rank == LEADER

    def store_connection(self) -> dist.Store:
        """A connection of its own to the rendezvous store, under this attempt's prefix, for the
        scheduler's messages. One per thread: one TCPStore client serves one request at a time, so a
        thread blocked in ``get`` would stall another's requests. Every rank connects the same way
        (torchrun's own handle may add a prefix of its own, depending on the torch version)."""
        return dist.PrefixStore(f"{STORE_PREFIX}/{self.attempt}", _store_client(self.timeout))

    def link_to(self, peer: int) -> dist.ProcessGroup:
        """The data group partitions travel on between this rank and ``peer`` in this direction."""
        return self.data[0] if self.rank < peer else self.data[1]

    def link_from(self, peer: int) -> dist.ProcessGroup:
        return self.data[0] if peer < self.rank else self.data[1]

    def barrier(self) -> None:
        dist.barrier(group=self.control)

    def all_gather(self, value) -> list:
        out = [None] * self.world_size
        dist.all_gather_object(out, value, group=self.control)
        return out

    def broadcast(self, value):
        """The leader's ``value`` on every rank."""
        box = [value]
        dist.broadcast_object_list(box, src=LEADER, group=self.control)
        return box[0]

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()


def _store_client(timeout: timedelta) -> dist.Store:
    return dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                         timeout=timeout)


def join_group(timeout_seconds: float, cuda: bool) -> Group:
    """Join the group torchrun started (NCCL as the default backend on CUDA, gloo otherwise)."""
    if not dist.is_available():
        raise MariusInputError("torch.distributed is not available in this torch build", path="torch",
                               expected="a torch build with distributed support (Linux or macOS wheels)")
    timeout = timedelta(seconds=timeout_seconds)
    store, rank, world_size = next(dist.rendezvous("env://", timeout=timeout))
    store.set_timeout(timeout)
    attempt = agree_on_attempt(dist.PrefixStore(f"{STORE_PREFIX}/attempts", store), rank, world_size, timeout)
    backend = "nccl" if cuda and dist.is_nccl_available() else "gloo"
    dist.init_process_group(backend, store=dist.PrefixStore(f"process_group/{attempt}", store), rank=rank,
                            world_size=world_size, timeout=timeout)
    control = dist.new_group(backend="gloo", timeout=timeout) if backend != "gloo" else dist.group.WORLD
    data = (dist.new_group(backend=backend, timeout=timeout), dist.new_group(backend=backend, timeout=timeout))
    return Group(rank, world_size, control, data, timeout, attempt)


def agree_on_attempt(store: dist.Store, rank: int, world_size: int, timeout: timedelta) -> str:
    """A key prefix every trainer of this attempt shares and no earlier attempt used.

    torchrun keeps its store across elastic restarts, and its restart count is each machine's own (an
    agent that restarts for another machine's failure does not count it), so neither tells attempts
    apart. Each trainer but the leader knocks with a fresh nonce; the leader answers every knock it sees
    with a fresh number until all have acknowledged that number: a knock left by an earlier attempt is
    answered too, but nobody waits for that answer."""
    deadline = time.monotonic() + timeout.total_seconds()
    if rank != LEADER:
        nonce = uuid.uuid4().hex
        store.set(f"knock/{rank}", nonce)
        answer = _poll(store, f"answer/{rank}/{nonce}", deadline)
        store.set(f"ack/{answer}/{rank}", "1")
        return answer
    attempt = f"{store.add('attempts', 1)}-{uuid.uuid4().hex[:8]}"
    answered: set[tuple[int, str]] = set()
    waiting = set(range(world_size)) - {LEADER}
    while waiting:
        for other in sorted(waiting):
            if store.check([f"ack/{attempt}/{other}"]):
                waiting.discard(other)
            elif store.check([f"knock/{other}"]):
                knock = (other, store.get(f"knock/{other}").decode())
                if knock not in answered:
                    store.set(f"answer/{other}/{knock[1]}", attempt)
                    answered.add(knock)
        if waiting:
            _raise_past(deadline, f"trainers {sorted(waiting)} did not join")
            time.sleep(POLL_SECONDS)
    return attempt


def _poll(store: dist.Store, key: str, deadline: float) -> str:
    """The value of ``key`` once it is set (polled: a store wait that times out leaves a client out of step)."""
    while not store.check([key]):
        _raise_past(deadline, "no answer from the leader (rank 0)")
        time.sleep(POLL_SECONDS)
    return store.get(key).decode()


def _raise_past(deadline: float, what: str) -> None:
    if time.monotonic() > deadline:
        raise RuntimeError(f"joining the trainers' group timed out: {what}")
