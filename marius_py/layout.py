"""The store a run uses, resolved from ``storage.*`` beside the plan (``marius_py.plan``) that chooses its counts.

Validation leaves ``storage.*`` as the user gave it; ``storage_layout`` resolves it into physical units: the
partition split, the buffer's default, the automatic group size and the dtype. Whether the run's trainers
are a torchrun group is the caller's to say (``torchrun``): the API and CLI read it once where a run starts
(``distributed.group.launched_by_torchrun``) and pass it down; a layout never reads the environment.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING

from marius_py.config import device_list
from marius_py.errors import MariusInputError
from marius_py.orderings import (Ordering, build_ordering, continued, default_group_size, default_split,
                                 is_two_level)
from marius_py.orderings.affine import affine_group_size, affine_split
from marius_py.storage.partitioning import partitions_filled

if TYPE_CHECKING:
    from marius_py.config import Config, StorageConfig


@dataclass(frozen=True)
class StorageLayout:
    """The store a run uses, resolved once from ``storage.*`` (which validation leaves as the user gave it)
    and, where known, the graph's size: the same names, in physical units."""

    num_partitions: int     # the user's partitions times the split
    buffer_capacity: int    # the buffer's slots, likewise
    group_size: int         # physical partitions per group (two-level orderings), the automatic one resolved
    partition_split: int    # physical partitions per partition the user gave
    ordering: str
    dtype: str              # float32 or bfloat16 (``storage.dtype=auto`` resolved)

    @property
    def swap_size(self) -> int:
        """Partitions the buffer swaps together: a group under a two-level ordering, else one."""
        return self.group_size if is_two_level(self.ordering) else 1


def epoch_ordering(layout: StorageLayout, seed: int, epoch: int, continues: bool = False) -> Ordering:
    """An epoch's ordering over a store's partitions, seeded by training.seed and the epoch. With
    ``continues`` (``storage.continue_epochs``), from the second epoch on it continues the epoch before
    (``orderings.continued``): its first state holds the storage partitions the last one's ended with, which
    stay in the buffer, so no epoch but the first waits for a state to be read before it trains. The chain is
    followed from the latest epoch this process knows the end of (``continue_chain``: a resumed run says where
    its last epoch ended), else from the first."""
    if epoch <= 1 or not continues:
        return built_ordering(layout, seed, epoch)
    known, carried, latest = _chains.get((layout, seed), (None, None, None))
    if known == epoch and latest is not None:
        return latest
    if known is None or known >= epoch:  # (nothing known before this epoch: the chain starts again)
        known, carried = 1, ending(built_ordering(layout, seed, 1))
    ordering = None
    for later in range(known + 1, epoch + 1):
        ordering = continued(built_ordering(layout, seed, later), carried)
        carried = ending(ordering)
    continue_chain(layout, seed, epoch, carried, ordering)
    return ordering


def continue_chain(layout: StorageLayout, seed: int, epoch: int, ended_with,
                   ordering: Ordering | None = None) -> None:
    """Remember that ``epoch`` (whose ``ordering`` it was, where known) ended with the storage partitions
    ``ended_with``: the next epoch's ordering continues from them without rebuilding the epochs before (each
    build costs up to seconds at a thousand partitions)."""
    key = (layout, seed)
    if key not in _chains and len(_chains) >= 8:
        _chains.pop(next(iter(_chains)))
    _chains[key] = (epoch, tuple(int(q) for q in ended_with), ordering)


def ending(ordering: Ordering) -> tuple[int, ...]:
    """The storage partitions an epoch's walk ends with (resident for the next epoch)."""
    return ordering.resident(ordering.num_states - 1)


# (layout, seed) -> (the latest epoch known, the partitions it ended with, its ordering or None)
_chains: dict[tuple[StorageLayout, int], tuple[int, tuple[int, ...], Ordering | None]] = {}


@functools.lru_cache(maxsize=4)  # (asked again by the epoch whose first state was read ahead)
def built_ordering(layout: StorageLayout, seed: int, epoch: int) -> Ordering:
    """The registry's ordering for an epoch, as built (``epoch_ordering`` continues it from the one before)."""
    group = layout.swap_size
    options = {"group_size": group} if is_two_level(layout.ordering) else {}
    return build_ordering(layout.ordering, layout.num_partitions // group, layout.buffer_capacity // group,
                          seed=seed, epoch=epoch, **options)


def storage_layout(s: StorageConfig, num_nodes: int | None = None, several_devices: bool = False, *,
                   torchrun: bool = False) -> StorageLayout:
    """The physical store of ``storage.*``: the split applied (``storage.partition_split``; automatic: chosen
    for regrouping, 1 for ``torchrun`` trainers, and with ``num_nodes`` lowered until the nodes fill every
    physical partition), the buffer's default (all partitions), the automatic group size, and the dtype
    (auto: bfloat16 for partitions on disk, unless ``several_devices`` or ``torchrun`` trainers, a group of
    one included, exchange them)."""
    buffer = s.buffer_capacity or s.num_partitions
    split = _split_for_regrouping(s, buffer, torchrun)
    if num_nodes is not None and split > 1:
        split = _filled_split(s, split, num_nodes)
    partitions, buffer = s.num_partitions * split, buffer * split
    group = s.group_size or automatic_group_size(s.ordering, partitions, buffer)
    dtype = s.dtype
    if dtype == "auto":
        dtype = "bfloat16" if partitions > 1 and not several_devices and not torchrun else "float32"
    return StorageLayout(partitions, buffer, group, split, s.ordering, dtype)


def run_layout(config: Config, num_nodes: int | None = None, *, torchrun: bool = False) -> StorageLayout:
    """``storage_layout`` of a run's config (its devices decide whether auto may store bfloat16)."""
    return storage_layout(config.storage, num_nodes, several_devices=len(device_list(config.training.devices)) > 1,
                          torchrun=torchrun)


def with_split_applied(config: Config, layout: StorageLayout) -> Config:
    """``config`` as a run saves it (config.yaml): as given, with the split and dtype its store took pinned,
    so that a resume resolves the same store."""
    storage = dataclasses.replace(config.storage, partition_split=layout.partition_split, dtype=layout.dtype)
    return dataclasses.replace(config, storage=storage)


def _split_for_regrouping(s: StorageConfig, buffer: int, torchrun: bool) -> int:
    """``storage.partition_split`` (module field help) before fitting it to the graph."""
    if s.group_size or not is_two_level(s.ordering):
        return max(s.partition_split, 1) if s.group_size else 1
    if s.partition_split:
        return s.partition_split
    chosen = default_split if s.ordering == "comet" else affine_split
    return 1 if torchrun else chosen(s.num_partitions, buffer)


def _filled_split(s: StorageConfig, split: int, num_nodes: int) -> int:
    """``split`` where the nodes fill every partition it makes: the automatic one is lowered until they do,
    one the user gave is refused, naming the largest that works."""
    largest = next((m for m in range(split, 1, -1)
                    if partitions_filled(num_nodes, s.num_partitions * m) == s.num_partitions * m), 1)
    if largest < split and s.partition_split:
        raise MariusInputError(f"storage.partition_split={split} stores {s.num_partitions} x {split} partitions, "
                               f"but the {num_nodes:,} nodes leave the last of them empty",
                               expected=f"storage.partition_split={largest} (the largest up to {split} whose "
                                        f"partitions they all fill), or 0 (automatic)")
    return largest


def automatic_group_size(ordering: str, num_physical: int, buffer: int) -> int:
    """``storage.group_size=0``: comet's default (``default_group_size``), or for affine the k that makes
    the logical partitions the square of those in the buffer."""
    if ordering == "affine" and buffer < num_physical:
        return affine_group_size(num_physical, buffer)
    return default_group_size(num_physical, buffer)
