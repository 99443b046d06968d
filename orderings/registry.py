"""Orderings by name: ``ORDERINGS`` and ``build_ordering``.

``ORDERINGS`` is the table of the registry research code registers its own orderings in, ``mp.ORDERINGS``
(``marius_py.config``: this package imports numpy alone), so an ordering registered there is built here.

Randomness: ``SeedSequence([seed, epoch])`` is split into two streams, one for
the per-epoch relabelling of partitions and one for the builder (random bucket
assignment, COMET's groups). So ``beta`` and ``beta_random`` built with the same
seed and epoch walk the same buffer states, and every (seed, epoch) pair gives
its own ordering, reproducibly.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

import numpy as np

from marius_py.orderings.affine import affine_defined, build_affine
from marius_py.orderings.beta import build_beta, build_beta_random
from marius_py.orderings.comet import build_comet
from marius_py.orderings.ordering import Ordering, check_sizes, relabel
from marius_py.orderings.visits import build_hilbert, build_hilbert_symmetric, build_sequential

Builder = Callable[..., Ordering]


@dataclass(frozen=True)
class OrderingSpec:
    """A registered ordering.

    ``builder(num_partitions, capacity, rng, **options)`` returns the ordering
    over canonical labels. ``permute_labels`` is the default of the option of
    the same name (one-level orderings only): relabel partitions with a random
    permutation drawn per (seed, epoch). ``randomized`` orderings differ between
    epochs with their default options.
    """

    name: str
    builder: Builder
    description: str
    randomized: bool
    permute_labels: bool | None     # None: two-level, relabelling does not apply
    options: tuple[str, ...] = ()
    defined_at: Callable[[int, int], bool] | None = None  # (p, c) -> exists there; None: at every size


ORDERINGS: dict[str, OrderingSpec] = {}


def register_ordering(spec: OrderingSpec) -> OrderingSpec:
    if spec.name in ORDERINGS:
        raise ValueError(f"ordering {spec.name!r} is already registered")
    ORDERINGS[spec.name] = spec
    return spec


for _spec in (
    OrderingSpec("beta", build_beta, "BETA states, greedy assignment (first state holding both)",
                 randomized=True, permute_labels=True),
    OrderingSpec("beta_random", build_beta_random, "BETA states, uniformly random assignment among eligible states",
                 randomized=True, permute_labels=True),
    OrderingSpec("sequential", build_sequential, "row-major buckets, furthest-future eviction",
                 randomized=False, permute_labels=False),
    OrderingSpec("hilbert", build_hilbert, "Hilbert-curve buckets, furthest-future eviction",
                 randomized=False, permute_labels=False),
    OrderingSpec("hilbert_symmetric", build_hilbert_symmetric,
                 "Hilbert-curve buckets, (i,j) with (j,i), furthest-future eviction",
                 randomized=False, permute_labels=False),
    OrderingSpec("comet", build_comet, "two-level: random groups of physical partitions, BETA over groups, "
                 "random assignment of physical buckets", randomized=True, permute_labels=None,
                 options=("group_size",)),
    OrderingSpec("affine", build_affine, "two-level: random groups, the buffer walks the lines of an affine "
                 "plane over the groups (p = c^2 logical partitions: each trained in c + 1 states)",
                 randomized=True, permute_labels=None, options=("group_size",), defined_at=affine_defined),
):
    register_ordering(_spec)


def is_two_level(name: str) -> bool:
    """Does ordering ``name`` group physical partitions into logical ones (``group_size``)?"""
    return "group_size" in get_spec(name).options


def get_spec(name: str) -> OrderingSpec:
    try:
        return ORDERINGS[name]
    except KeyError:
        raise ValueError(f"unknown ordering {name!r}; known orderings: {', '.join(ORDERINGS)}") from None


def build_ordering(name: str, num_partitions: int, capacity: int, seed: int = 0, epoch: int = 0,
                   **options) -> Ordering:
    """Build (and validate) ordering ``name`` for ``p`` partitions and capacity ``c``.

    Options: ``permute_labels`` (one-level orderings; default per ordering, see
    ``ORDERINGS[name].permute_labels``) and the ordering's own (``comet`` and ``affine``:
    ``group_size``).
    """
    spec = get_spec(name)
    check_sizes(num_partitions, capacity, what=f"{name}: ")
    if not (isinstance(seed, (int, np.integer)) and seed >= 0
            and isinstance(epoch, (int, np.integer)) and epoch >= 0):
        raise ValueError(f"{name}: seed and epoch must be integers >= 0, got {seed!r}, {epoch!r}")
    known = spec.options + (("permute_labels",) if spec.permute_labels is not None else ())
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise ValueError(f"{name}: unknown option(s) {', '.join(unknown)}; "
                         f"accepted: {', '.join(known) or 'none'}")
    builder_options = {k: v for k, v in options.items() if k != "permute_labels"}
    permute = bool(options.get("permute_labels", spec.permute_labels))
    relabel_seq, build_seq = np.random.SeedSequence([int(seed), int(epoch)]).spawn(2)
    ordering = spec.builder(num_partitions, capacity, np.random.default_rng(build_seq), **builder_options)
    if permute:
        ordering = relabel(ordering, np.random.default_rng(relabel_seq).permutation(num_partitions))
    ordering = replace(ordering, name=spec.name, seed=int(seed), epoch=int(epoch),
                       options=tuple(sorted(options.items())))
    return ordering.validate()
