"""Orderings: which partitions the buffer holds when, and which buckets train when.

Nodes are split into ``p`` partitions and edges into ``p x p`` buckets; bucket
``(i, j)`` holds the edges from partition ``i`` to partition ``j``. The buffer
holds ``c`` partitions. An :class:`Ordering` is

``states``   buffer contents per state, as slots: ``states[k][s]`` is the
             partition in slot ``s``; consecutive states differ in exactly one
             slot (the evicted partition's slot receives the admitted one);
``buckets``  per state, the buckets trained in it. Every bucket, diagonal ones
             included, is in exactly one state, and that state holds both its
             partitions.

``swaps()`` lists ``Swap(state, slot, evicted, admitted)`` (``state`` = the state
the swap enters); ``assignment()`` maps bucket -> state; ``validate()`` checks
all of the above and raises ``AssertionError`` naming what is wrong.

Two levels (``comet``, ``affine``). ``groups`` is ``None`` for every other ordering. When set,
``states`` hold *logical* partitions ``0..p-1``, ``groups[l]`` is the sorted tuple
of *storage* ("physical") partitions that logical ``l`` stands for this epoch
(the groups partition ``range(num_physical_partitions)``), and ``buckets`` are
*physical* buckets ``(a, b)`` over storage partitions. Buckets are therefore
always in the ids of the edge store the trainer reads, and with ``groups=None``
logical and storage ids coincide, so one trainer loop serves both: admitting
logical ``l`` loads every partition of ``partitions_of(l)`` (``groups[l]``, or
``(l,)``), evicting it writes them all back, and ``resident(k)`` is the set of
storage partitions in the buffer during state ``k``. See ``orderings.comet``.

Registered orderings (``ORDERINGS``; ``build_ordering(name, p, c, seed, epoch,
**options)``): ``beta``, ``beta_random``, ``sequential``, ``hilbert``,
``hilbert_symmetric``, ``comet``, ``affine`` (two-level, p = c^2 logical
partitions). ``beta``/``beta_random`` relabel partitions with a random
permutation per (seed, epoch), as Marius does; ``comet`` and ``affine`` regroup
their physical partitions per (seed, epoch); the three curve baselines are built the
same every epoch unless ``permute_labels=True`` (a run renames them per epoch all the
same: ``continued``). ``continued(ordering, carried)`` renames
an ordering's storage partitions so that its first state holds ``carried``: a run
starts each epoch's walk with the partitions the last one ended with.

Bounds: ``swap_lower_bound(p, c)`` (no ordering does better) and
``beta_swap_count(p, c)`` (exactly what ``beta`` does). ``balanced_buckets(ordering,
bucket_edges)`` keeps the states and moves each bucket to the eligible state
that evens the edges per state (``storage.edge_assignment=balanced``). ``orderings.simulator``
turns an ordering into partitions and bytes read and written per epoch.

Depends on numpy and the standard library only.
"""

from marius_py.orderings.balance import balanced_buckets
from marius_py.orderings.bounds import beta_swap_count, swap_lower_bound
from marius_py.orderings.comet import default_group_size, default_split
from marius_py.orderings.ordering import Bucket, Ordering, State, Swap, continued, relabel
from marius_py.orderings.registry import ORDERINGS, OrderingSpec, build_ordering, get_spec, is_two_level, register_ordering
from marius_py.orderings.simulator import IOStats, compare_orderings, format_table, simulate, walk_io

__all__ = [
    "Bucket", "IOStats", "ORDERINGS", "Ordering", "OrderingSpec", "State", "Swap", "balanced_buckets",
    "beta_swap_count",
    "build_ordering", "continued", "compare_orderings", "default_group_size", "default_split", "format_table", "get_spec",
    "is_two_level", "register_ordering", "relabel",
    "simulate", "swap_lower_bound", "walk_io",
]
