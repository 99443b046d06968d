"""Partition IO of one epoch of an ordering, as the partition buffer performs it.

Counting rules (a real buffer's counters must equal these):

* ``swaps`` = ``len(states) - 1``: one logical partition admitted per swap.
* ``partitions_read`` = ``c + swaps``: the buffer starts empty, reads the ``c``
  partitions of ``states[0]``, then the admitted partition of every swap. A
  partition evicted and admitted again later is read again.
* ``partitions_written`` = ``swaps + c``: every evicted partition is treated as
  dirty (it is written back whether or not a bucket touched it while it was
  resident), and the ``c`` partitions of the last state are flushed at the end
  of the epoch. Hence reads == writes, partition for partition.
* ``bytes_read`` / ``bytes_written``: the sum of the sizes of those partitions.
  ``partition_bytes`` gives the size of every *storage* partition: an int (all
  the same) or a list indexed by storage partition. Include everything a
  partition moves (embeddings and optimizer state).
* Two-level orderings (``groups`` set): ``swaps``, ``partitions_read`` and
  ``partitions_written`` count *logical* partitions, the unit one-level
  orderings count in; ``physical_partitions_read``/``_written`` count storage
  partitions (``len(groups[l])`` per logical partition ``l``, i.e. ``k`` each),
  and bytes are the sums over physical partitions. For one-level orderings the
  physical counts equal the logical ones.
* ``lower_bound_swaps`` = ``swap_lower_bound(p, c)`` and ``ratio_to_lower_bound``
  = ``swaps / lower_bound_swaps`` (1.0 when both are 0, i.e. ``c == p``).
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from dataclasses import dataclass

from marius_py.orderings.bounds import swap_lower_bound
from marius_py.orderings.ordering import Ordering
from marius_py.orderings.registry import ORDERINGS, build_ordering

PartitionBytes = int | list[int] | tuple[int, ...]


@dataclass(frozen=True)
class IOStats:
    """One epoch's partition IO for one ordering (module docstring: counting rules)."""

    ordering: str
    num_partitions: int
    capacity: int
    swaps: int
    partitions_read: int
    partitions_written: int
    bytes_read: int
    bytes_written: int
    lower_bound_swaps: int
    ratio_to_lower_bound: float
    physical_partitions_read: int
    physical_partitions_written: int


def storage_sizes(partition_bytes: PartitionBytes, num_storage_partitions: int) -> list[int]:
    """Size of every storage partition from an int (uniform) or a per-partition list."""
    if isinstance(partition_bytes, numbers.Integral):
        sizes = [partition_bytes] * num_storage_partitions
    else:
        sizes = [int(b) for b in partition_bytes]
        if len(sizes) != num_storage_partitions:
            raise ValueError(f"partition_bytes lists {len(sizes)} sizes, expected one per storage "
                             f"partition ({num_storage_partitions})")
    if any(b < 0 for b in sizes):
        raise ValueError("partition_bytes must be >= 0")
    return sizes


def simulate(ordering: Ordering, partition_bytes: PartitionBytes) -> IOStats:
    """Partitions and bytes read and written in one epoch of ``ordering``."""
    sizes = storage_sizes(partition_bytes, ordering.num_physical_partitions)
    logical_bytes = [sum(sizes[q] for q in ordering.partitions_of(lp)) for lp in range(ordering.num_partitions)]
    logical_width = [len(ordering.partitions_of(lp)) for lp in range(ordering.num_partitions)]
    swaps = ordering.swaps()
    read = list(ordering.states[0]) + [s.admitted for s in swaps]
    written = [s.evicted for s in swaps] + list(ordering.states[-1])
    lower = swap_lower_bound(ordering.num_partitions, ordering.capacity)
    num_swaps = len(swaps)
    ratio = num_swaps / lower if lower else (1.0 if num_swaps == 0 else float("inf"))
    return IOStats(
        ordering=ordering.name, num_partitions=ordering.num_partitions, capacity=ordering.capacity,
        swaps=num_swaps, partitions_read=len(read), partitions_written=len(written),
        bytes_read=sum(logical_bytes[q] for q in read), bytes_written=sum(logical_bytes[q] for q in written),
        lower_bound_swaps=lower, ratio_to_lower_bound=ratio,
        physical_partitions_read=sum(logical_width[q] for q in read),
        physical_partitions_written=sum(logical_width[q] for q in written))


def walk_io(ordering: Ordering, partition_bytes: PartitionBytes, carried: Sequence[int] = (),
            carried_dirty: bool = True, flush: bool = False) -> dict[str, int]:
    """Partition IO of one epoch of ``ordering`` as a buffer that stays filled between epochs performs it: it
    starts holding the ``carried`` storage partitions (the last epoch's last state; written back only where
    ``carried_dirty``, i.e. trained since the store last took them, and evicted), reads what the first state
    lacks and every swap's admission, writes every swap's eviction (trained, so dirty), and leaves the last
    state resident unless ``flush``. Counts storage partitions; with no ``carried`` and ``flush`` it is
    ``simulate``'s physical IO."""
    sizes = storage_sizes(partition_bytes, ordering.num_physical_partitions)
    first, held = set(ordering.resident(0)), set(carried)
    read = sorted(first - held)
    written = sorted(held - first) if carried_dirty else []
    for swap in ordering.swaps():
        read += ordering.partitions_of(swap.admitted)
        written += ordering.partitions_of(swap.evicted)
    if flush:
        written += ordering.resident(ordering.num_states - 1)
    return {"partitions_read": len(read), "partitions_written": len(written),
            "bytes_read": sum(sizes[q] for q in read), "bytes_written": sum(sizes[q] for q in written)}


def split_evenly(total: int, parts: int) -> list[int]:
    """``parts`` integers summing to ``total``, differing by at most one (larger first)."""
    base, extra = divmod(total, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


def _defined(name: str, num_partitions: int, capacity: int) -> bool:
    """Whether ordering ``name`` exists at these sizes (``OrderingSpec.defined_at``; ``affine`` needs p = c^2)."""
    defined_at = ORDERINGS[name].defined_at
    return defined_at is None or defined_at(num_partitions, capacity)


def compare_orderings(num_partitions: int, capacity: int, partition_bytes: PartitionBytes, seed: int = 0,
                      epoch: int = 0, physical_partition_bytes: PartitionBytes | None = None,
                      group_size: int | None = None) -> list[IOStats]:
    """``simulate`` every registered ordering defined at these sizes (default options), in registry order.

    ``partition_bytes`` sizes the ``p`` partitions of one-level orderings. For
    two-level orderings the same table is cut into ``num_physical_partitions``
    storage partitions: pass their sizes as ``physical_partition_bytes``, or by
    default the total of ``partition_bytes`` is split evenly among them, so every
    row moves the same table and its bytes compare directly.

    ``group_size`` k: two-level orderings as training runs them, over the same
    ``p`` partitions and ``capacity`` slots, grouped k to a logical partition.
    """
    p = num_partitions
    total = sum(storage_sizes(partition_bytes, p))
    rows = []
    for name in ORDERINGS:
        if group_size is not None and ORDERINGS[name].options == ("group_size",):
            if _defined(name, p // group_size, capacity // group_size):
                ordering = build_ordering(name, p // group_size, capacity // group_size, seed=seed, epoch=epoch,
                                          group_size=group_size)
                rows.append(simulate(ordering, physical_partition_bytes or partition_bytes))
            continue
        if not _defined(name, p, capacity):
            continue
        ordering = build_ordering(name, p, capacity, seed=seed, epoch=epoch)
        if ordering.groups is None:
            sizes: PartitionBytes = partition_bytes
        elif physical_partition_bytes is not None:
            sizes = physical_partition_bytes
        else:
            sizes = split_evenly(total, ordering.num_physical_partitions)
        rows.append(simulate(ordering, sizes))
    return rows


def format_bytes(num_bytes: float) -> str:
    """Binary units: ``512 B``, ``1.5 KiB``, ``12.0 GiB``."""
    value = float(num_bytes)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024:
            return f"{int(value)} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} PiB"


def format_table(rows: list[IOStats]) -> str:
    """One line per ordering: swaps, partitions and bytes read/written, swaps / lower bound."""
    header = ("ordering", "swaps", "partitions read", "partitions written", "bytes read", "bytes written",
              "swaps/lower bound")
    first = (rows[0].num_partitions, rows[0].capacity) if rows else None

    def label(r: IOStats) -> str:  # rows over other sizes (two-level orderings' groups) say so
        same = (r.num_partitions, r.capacity) == first
        return r.ordering if same else f"{r.ordering} ({r.num_partitions} groups, buffer {r.capacity})"

    lines = [header] + [(label(r), str(r.swaps), str(r.partitions_read), str(r.partitions_written),
                         format_bytes(r.bytes_read), format_bytes(r.bytes_written),
                         f"{r.ratio_to_lower_bound:.3f}") for r in rows]
    widths = [max(len(line[col]) for line in lines) for col in range(len(header))]
    out = []
    for n, line in enumerate(lines):
        cells = [line[0].ljust(widths[0])] + [cell.rjust(w) for cell, w in zip(line[1:], widths[1:])]
        out.append("  ".join(cells).rstrip())
        if n == 0:
            out.append("  ".join("-" * w for w in widths))
    same_size = [r for r in rows if (r.num_partitions, r.capacity) == first]
    if same_size and len({r.lower_bound_swaps for r in same_size}) == 1:
        r = same_size[0]
        out.append(f"p={r.num_partitions} partitions, buffer c={r.capacity}: "
                   f"no ordering over them needs fewer than {r.lower_bound_swaps} swaps")
    return "\n".join(out)
