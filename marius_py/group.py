"""The trainers of a run, as the trainer sees them: one process (``ONE_PROCESS``), or torchrun's group
(``marius_py.distributed.group.Group``), behind one interface.

The trainer's epoch end is written once for both: every trainer's record is
gathered, the leader validates and decides whether to commit, and the
training state it holds reaches every trainer. For one process those steps
are the identity, so the single-process run is the group of one.
"""

from __future__ import annotations

from typing import Protocol, TypeVar

Value = TypeVar("Value")


class TrainerGroup(Protocol):
    rank: int
    world_size: int

    @property
    def is_leader(self) -> bool:
        """The trainer that validates, logs the run's metrics and holds the group's commit marker."""

    def barrier(self) -> None: ...

    def all_gather(self, value: Value) -> list[Value]:
        """Every trainer's ``value``, by rank."""

    def broadcast(self, value: Value) -> Value:
        """The leader's ``value`` on every trainer."""


class OneProcess:
    """A run trained by this process alone."""

    rank, world_size, is_leader = 0, 1, True

    def barrier(self) -> None:
        pass

    def all_gather(self, value: Value) -> list[Value]:
        return [value]

    def broadcast(self, value: Value) -> Value:
        return value


ONE_PROCESS = OneProcess()
