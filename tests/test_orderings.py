"""Orderings: contract tests for every registered ordering, bounds, seeding, simulator.

The property sweep checks every ordering against an independent checker (not
``Ordering.validate``, which is code under test), for 2 <= c <= p <= 32.
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from marius_py.orderings import (ORDERINGS, Ordering, Swap, beta_swap_count, build_ordering, compare_orderings,
                       continued, default_group_size,
                       format_table, simulate, swap_lower_bound)
from marius_py.orderings.beta import beta_states
from marius_py.orderings.visits import hilbert_index, hilbert_visits

ALL_SIZES = [(p, c) for p in range(2, 33) for c in range(2, p + 1)]
# comet with its default k=4 has 16x the buckets of the others ((4p)^2), so the
# independent checker would dominate the file's run time over all 496 sizes. Its
# state sequence is beta_states (checked on every size through beta), so comet
# gets every size up to p=16 plus every c for a few larger p, odd and even,
# including p=32.
COMET_SIZES = [(p, c) for p, c in ALL_SIZES if p <= 16 or p in (23, 31, 32)]

# One entry per registered ordering: which (p, c) the property test sweeps.
# test_every_registered_ordering_has_a_property_sweep fails when one is missing.
PROPERTY_SWEEPS = {
    "beta": ALL_SIZES,
    "beta_random": ALL_SIZES,
    "sequential": ALL_SIZES,
    "hilbert": ALL_SIZES,
    "hilbert_symmetric": ALL_SIZES,
    "comet": COMET_SIZES,
    "affine": [(q * q, q) for q in (2, 3, 4, 5, 7, 8)] + [(p, p) for p in range(1, 9)],
}


def check_ordering(o: Ordering, p: int, c: int) -> None:
    """Every invariant of an ordering, written independently of ``Ordering.validate``."""
    assert (o.num_partitions, o.capacity) == (p, c)
    assert len(o.states) >= 1 and len(o.buckets) == len(o.states)
    for k, state in enumerate(o.states):
        assert len(state) == c, (o.name, k, state)
        assert len(set(state)) == c, (o.name, k, state)
        assert all(0 <= q < p for q in state), (o.name, k, state)
    for k in range(1, len(o.states)):
        diff = [s for s in range(c) if o.states[k][s] != o.states[k - 1][s]]
        assert len(diff) == 1, (o.name, k, o.states[k - 1], o.states[k])
    if o.groups is None:
        label = list(range(p))
    else:
        assert len(o.groups) == p
        flat = sorted(q for g in o.groups for q in g)
        assert flat == list(range(len(flat))), "groups must partition the physical partitions"
        label = [0] * len(flat)
        for lp, g in enumerate(o.groups):
            for q in g:
                label[q] = lp
    n = len(label)
    seen = set()
    for k, bs in enumerate(o.buckets):
        held = set(o.states[k])
        for i, j in bs:
            assert 0 <= i < n and 0 <= j < n, (o.name, i, j)
            assert (i, j) not in seen, f"{o.name}: bucket {(i, j)} assigned twice"
            seen.add((i, j))
            assert label[i] in held and label[j] in held, (o.name, k, (i, j), o.states[k])
    assert len(seen) == n * n, f"{o.name}: {n * n - len(seen)} buckets unassigned"
    assert o.num_swaps == len(o.states) - 1 == len(o.swaps())
    assert o.num_swaps >= swap_lower_bound(p, c)


@pytest.mark.parametrize("name", list(ORDERINGS))
def test_ordering_properties(name):
    for p, c in PROPERTY_SWEEPS[name]:
        o = build_ordering(name, p, c, seed=7, epoch=3)
        check_ordering(o, p, c)
        if name in ("beta", "beta_random", "comet"):
            assert o.num_swaps == beta_swap_count(p, c), (name, p, c)


def test_every_registered_ordering_has_a_property_sweep():
    assert set(PROPERTY_SWEEPS) == set(ORDERINGS)
    for name, sizes in PROPERTY_SWEEPS.items():
        if name == "affine":  # defined for p = c^2 only
            continue
        assert (32, 2) in sizes and (32, 32) in sizes and (2, 2) in sizes, name


def test_beta_sizes_and_formula_on_all_sizes():
    for p, c in ALL_SIZES:
        x = (p - c) // (c - 1)
        formula = (p - c) + (x + 1) * ((p - c) - x * (c - 1) / 2)
        assert beta_swap_count(p, c) == formula
        assert len(beta_states(p, c)) - 1 == formula
        assert beta_swap_count(p, c) >= swap_lower_bound(p, c)
        lower = math.ceil((p * (p - 1) / 2 - c * (c - 1) / 2) / (c - 1))
        assert swap_lower_bound(p, c) == lower


def test_bounds_known_values():
    assert swap_lower_bound(4, 2) == 5 and beta_swap_count(4, 2) == 5
    assert swap_lower_bound(16, 4) == 38 and beta_swap_count(16, 4) == 42
    assert swap_lower_bound(8, 8) == 0 and beta_swap_count(8, 8) == 0
    assert swap_lower_bound(1, 1) == 0 and beta_swap_count(1, 1) == 0
    # c = 2: BETA is optimal, p(p-1)/2 - 1 swaps
    assert all(beta_swap_count(p, 2) == swap_lower_bound(p, 2) == p * (p - 1) // 2 - 1 for p in range(2, 40))
    with pytest.raises(ValueError):
        swap_lower_bound(5, 1)
    with pytest.raises(ValueError):
        beta_swap_count(4, 5)


def test_single_partition_is_one_state():
    for name in ORDERINGS:
        o = build_ordering(name, 1, 1)
        assert o.num_swaps == 0 and len(o.states) == 1


def test_c_equals_p_is_one_state_without_swaps():
    for name in ORDERINGS:
        for p in (2, 5, 9):
            o = build_ordering(name, p, p)
            assert o.num_swaps == 0, name
            assert sorted(o.states[0]) == list(range(p))


# ----------------------------------------------------------------- seeding

@pytest.mark.parametrize("name", list(ORDERINGS))
def test_seeded_determinism(name):
    p, c = (9, 3) if name == "affine" else (8, 3)  # affine: p = c^2
    a = build_ordering(name, p, c, seed=5, epoch=2)
    b = build_ordering(name, p, c, seed=5, epoch=2)
    assert a == b


@pytest.mark.parametrize("name", [n for n, spec in ORDERINGS.items() if spec.randomized])
def test_randomized_orderings_change_every_epoch(name):
    p, c = (9, 3) if name == "affine" else (8, 3)
    epochs = [build_ordering(name, p, c, seed=1, epoch=e) for e in range(4)]
    for i in range(len(epochs)):
        for j in range(i + 1, len(epochs)):
            assert epochs[i].buckets != epochs[j].buckets, (name, i, j)
    assert build_ordering(name, p, c, seed=2, epoch=0).buckets != epochs[0].buckets
    # different epochs see different buffer states (as sets of partitions), not only new labels
    assert len({frozenset(map(frozenset, map(o.resident, range(o.num_states)))) for o in epochs}) == 4


@pytest.mark.parametrize("name", [n for n, spec in ORDERINGS.items() if not spec.randomized])
def test_baselines_are_fixed_unless_labels_permuted(name):
    assert build_ordering(name, 8, 3, epoch=0) == replace(build_ordering(name, 8, 3, epoch=1), epoch=0)
    a = build_ordering(name, 8, 3, epoch=0, permute_labels=True)
    b = build_ordering(name, 8, 3, epoch=1, permute_labels=True)
    assert a.states != b.states and a.num_swaps == b.num_swaps


def test_beta_and_beta_random_share_states_not_assignment():
    greedy = build_ordering("beta", 12, 4, seed=3, epoch=1)
    rand = build_ordering("beta_random", 12, 4, seed=3, epoch=1)
    assert greedy.states == rand.states
    assert greedy.assignment() != rand.assignment()
    # greedy: every bucket is in the first state holding both partitions
    for (i, j), k in greedy.assignment().items():
        first = next(t for t, s in enumerate(greedy.states) if i in s and j in s)
        assert k == first


def test_beta_random_spreads_buckets_over_eligible_states():
    # bucket (0, 0) is eligible in every state holding 0; over epochs it lands in many of them
    hits = {build_ordering("beta_random", 6, 3, seed=0, epoch=e, permute_labels=False).assignment()[(0, 0)]
            for e in range(30)}
    eligible = {k for k, s in enumerate(beta_states(6, 3)) if 0 in s}
    assert hits <= eligible and len(hits) >= 3


# ------------------------------------------------------------------- comet

def test_comet_groups_partition_physical_partitions():
    for k in (1, 3, 4):
        o = build_ordering("comet", 6, 3, seed=0, epoch=4, group_size=k)
        assert o.num_physical_partitions == 6 * k
        assert all(len(g) == k and list(g) == sorted(g) for g in o.groups)
        assert sorted(q for g in o.groups for q in g) == list(range(6 * k))
        for t in range(o.num_states):
            resident = set(o.resident(t))
            assert len(resident) == 3 * k
            assert all(i in resident and j in resident for i, j in o.buckets[t])


def test_comet_regroups_every_epoch_and_defaults_to_four():
    groups = [build_ordering("comet", 8, 2, seed=0, epoch=e).groups for e in range(5)]
    assert len(set(groups)) == 5
    assert all(len(g) == 4 for g in groups[0])


@pytest.mark.parametrize("name, options", [("beta", {}), ("beta_random", {}), ("hilbert", {}),
                                           ("comet", {"group_size": 3}), ("affine", {"group_size": 2})])
def test_continued_starts_with_the_carried_partitions(name, options):
    """A continued ordering is the built one with its storage partitions renamed: valid, starting with the
    carried partitions, with the same swaps and the same buckets per state up to the renaming."""
    p, c = (9, 3) if name == "affine" else (8, 3)
    built = build_ordering(name, p, c, seed=1, epoch=2, **options)
    before = build_ordering(name, p, c, seed=1, epoch=1, **options)
    carried = before.resident(before.num_states - 1)
    ordering = continued(built, carried).validate()
    assert set(ordering.resident(0)) == set(carried) and ordering.continues == tuple(sorted(carried))
    assert set(built.resident(0)) != set(carried)  # (the case is not trivial)
    everything = set(range(built.num_physical_partitions))
    renamed = dict(zip(built.resident(0), sorted(carried)))  # (the first state onto the carried, the rest in order)
    renamed.update(zip(sorted(everything - set(built.resident(0))), sorted(everything - set(carried))))
    for k in range(built.num_states):
        assert ordering.resident(k) == tuple(sorted(renamed[q] for q in built.resident(k)))
        assert ordering.buckets[k] == tuple((renamed[i], renamed[j]) for i, j in built.buckets[k])
    assert simulate(ordering, 1).partitions_read == simulate(built, 1).partitions_read
    assert continued(built, carried[:-1]) is built  # (another size: left as built)


# --------------------------------------------------------------- simulator

def test_hand_worked_beta_p4_c2():
    # p=4, c=2, canonical labels. Round 0 keeps 0 in slot 0 and cycles slot 1
    # through 2, 3; round 1 puts 1 in slot 0 (3 stays as s) and cycles slot 1 to 2;
    # the last round puts the remaining 3 into slot 0.
    o = build_ordering("beta", 4, 2, permute_labels=False)
    assert o.states == ((0, 1), (0, 2), (0, 3), (1, 3), (1, 2), (3, 2))
    assert o.swaps() == [Swap(1, 1, 1, 2), Swap(2, 1, 2, 3), Swap(3, 0, 0, 1), Swap(4, 1, 3, 2),
                         Swap(5, 0, 1, 3)]
    assert o.buckets == (((0, 0), (0, 1), (1, 0), (1, 1)), ((0, 2), (2, 0), (2, 2)),
                         ((0, 3), (3, 0), (3, 3)), ((1, 3), (3, 1)), ((1, 2), (2, 1)), ((2, 3), (3, 2)))
    # 5 swaps = lower bound ceil((6 - 1) / 1). Reads: initial fill {0, 1} + 5
    # admissions = 7; writes: 5 evictions + final flush {3, 2} = 7.
    s = simulate(o, 100)
    assert (s.swaps, s.partitions_read, s.partitions_written) == (5, 7, 7)
    assert (s.bytes_read, s.bytes_written) == (700, 700)
    assert (s.lower_bound_swaps, s.ratio_to_lower_bound) == (5, 1.0)
    assert (s.physical_partitions_read, s.physical_partitions_written) == (7, 7)
    # sizes 10, 20, 30, 40: read 0,1 (30) + admitted 2,3,1,2,3 (160) = 190;
    # written evicted 1,2,0,3,1 (120) + flushed 3,2 (70) = 190.
    s = simulate(o, [10, 20, 30, 40])
    assert (s.bytes_read, s.bytes_written) == (190, 190)


def test_hand_worked_sequential_p3_c2():
    # Row-major visits (0,0) (0,1) (0,2) (1,0) (1,1) (1,2) (2,0) (2,1) (2,2), start [0, 1].
    # (0,2): evict 1 (not in the bucket) -> [0,2]; (1,0): evict 2 -> [0,1];
    # (1,2): evict 0 -> [2,1]; (2,0): evict 1 (only candidate) -> [2,0];
    # (2,1): evict 0 (never used again) -> [2,1]. 5 swaps; lower bound is 2.
    o = build_ordering("sequential", 3, 2)
    assert o.states == ((0, 1), (0, 2), (0, 1), (2, 1), (2, 0), (2, 1))
    assert o.buckets == (((0, 0), (0, 1)), ((0, 2),), ((1, 0), (1, 1)), ((1, 2),), ((2, 0),),
                         ((2, 1), (2, 2)))
    s = simulate(o, 10)
    assert (s.swaps, s.partitions_read, s.partitions_written, s.bytes_read, s.bytes_written) == (5, 7, 7, 70, 70)
    assert (s.lower_bound_swaps, s.ratio_to_lower_bound) == (2, 2.5)


def test_hand_worked_comet_p4_c2_k2():
    # Same logical walk as beta p=4, c=2 (5 swaps); each logical partition is 2
    # physical partitions of 50 bytes: 7 logical = 14 physical reads, 700 bytes.
    o = build_ordering("comet", 4, 2, group_size=2)
    s = simulate(o, 50)
    assert (s.swaps, s.partitions_read, s.partitions_written) == (5, 7, 7)
    assert (s.physical_partitions_read, s.physical_partitions_written) == (14, 14)
    assert (s.bytes_read, s.bytes_written) == (700, 700)
    sizes = list(range(1, 9))
    s = simulate(o, sizes)
    group_bytes = [sum(sizes[q] for q in g) for g in o.groups]
    swaps = o.swaps()
    assert s.bytes_read == sum(group_bytes[q] for q in o.states[0]) + sum(group_bytes[w.admitted] for w in swaps)
    assert s.bytes_written == sum(group_bytes[w.evicted] for w in swaps) + sum(group_bytes[q] for q in o.states[-1])


def test_simulator_rejects_wrong_sizes():
    with pytest.raises(ValueError, match="expected one per storage partition"):
        simulate(build_ordering("beta", 4, 2), [1, 2, 3])


def test_compare_orderings_and_table():
    rows = compare_orderings(16, 4, 4 * 2**20)
    assert [r.ordering for r in rows] == list(ORDERINGS)
    by_name = {r.ordering: r for r in rows}
    assert by_name["beta"].swaps == beta_swap_count(16, 4) == 42
    # comet moves the same table in 4x smaller physical partitions: same bytes as beta
    assert by_name["comet"].bytes_read == by_name["beta"].bytes_read == 46 * 4 * 2**20
    assert by_name["comet"].physical_partitions_read == 4 * 46
    assert all(r.swaps >= r.lower_bound_swaps == 38 for r in rows)
    table = format_table(rows)
    lines = table.splitlines()
    assert "bytes read" in lines[0] and "swaps/lower bound" in lines[0]
    assert len(lines) == 2 + len(rows) + 1
    assert "184.0 MiB" in lines[2] and "1.105" in lines[2]


@pytest.mark.parametrize("partitions, capacity, expected", [(16, 4, 2), (8, 2, 1), (64, 16, 8), (32, 8, 4),
                                                            (12, 6, 3), (9, 3, 1), (7, 7, 1)])
def test_default_group_size_leaves_two_groups_in_the_buffer(partitions, capacity, expected):
    k = default_group_size(partitions, capacity)
    assert k == expected
    assert partitions % k == 0 and capacity % k == 0 and (k == 1 or capacity // k >= 2)


def test_compare_orderings_over_training_partitions():
    """With group_size, comet's row is what training runs on the same 16 partitions and 4 slots: groups of
    2, reading those partitions' bytes (BETA over 8 groups with 2 slots reads each group ~3.6 times)."""
    rows = {r.ordering: r for r in compare_orderings(16, 4, 4 * 2**20, group_size=2)}
    comet = rows["comet"]
    assert (comet.num_partitions, comet.capacity) == (8, 2)
    assert comet.physical_partitions_read == 2 * comet.partitions_read
    assert comet.bytes_read == comet.physical_partitions_read * 4 * 2**20
    assert rows["beta"].bytes_read == 46 * 4 * 2**20


# ----------------------------------------------------------------- registry

def test_unknown_ordering_lists_known_names():
    with pytest.raises(ValueError) as err:
        build_ordering("nope", 4, 2)
    assert all(name in str(err.value) for name in ORDERINGS)


def test_bad_options_and_sizes():
    with pytest.raises(ValueError, match="group_size"):
        build_ordering("beta", 4, 2, group_size=2)
    with pytest.raises(ValueError, match="capacity"):
        build_ordering("beta", 4, 1)
    with pytest.raises(ValueError, match="capacity"):
        build_ordering("hilbert", 4, 5)
    with pytest.raises(ValueError, match="group_size"):
        build_ordering("comet", 4, 2, group_size=0)


def test_validate_reports_broken_orderings():
    o = build_ordering("beta", 4, 2, permute_labels=False)
    broken_slots = Ordering("x", 4, 2, ((0, 1), (2, 3)), (o.buckets[0], o.buckets[1]))
    with pytest.raises(AssertionError, match="changes slots"):
        broken_slots.validate()
    missing = Ordering("x", 4, 2, o.states, o.buckets[:-1] + ((),))
    with pytest.raises(AssertionError, match="buckets assigned"):
        missing.validate()
    misplaced = Ordering("x", 4, 2, o.states, (o.buckets[0] + ((2, 3),),) + o.buckets[1:5] + (((3, 2),),))
    with pytest.raises(AssertionError, match="does not hold both"):
        misplaced.validate()


def test_hilbert_curve_is_continuous():
    for order in (1, 2, 3):
        n = 1 << order
        cells = sorted(((x, y) for x in range(n) for y in range(n)), key=lambda b: hilbert_index(order, *b))
        assert sorted(hilbert_index(order, x, y) for x, y in cells) == list(range(n * n))
        assert all(abs(a[0] - b[0]) + abs(a[1] - b[1]) == 1 for a, b in zip(cells, cells[1:]))
    assert len(hilbert_visits(5)) == 25


@pytest.mark.parametrize("name, p, c, seed", [("beta", 16, 8, 0), ("beta", 8, 3, 1), ("comet", 16, 8, 2),
                                              ("hilbert", 6, 3, 0)])
def test_balanced_buckets_keep_states_and_even_the_load(name, p, c, seed):
    """Same states (so the same IO), every bucket once in a state holding it, and no state trains more
    edges than under the ordering's own assignment; with BETA's heavy first state, far fewer."""
    import numpy as np
    from marius_py.orderings import balanced_buckets, simulate
    options = {"group_size": 2} if name == "comet" else {}
    ordering = build_ordering(name, p // 2 if name == "comet" else p, c // 2 if name == "comet" else c,
                              seed=seed, **options)
    physical = ordering.num_physical_partitions
    sizes = np.random.default_rng(seed).integers(1, 1000, size=(physical, physical))
    balanced = balanced_buckets(ordering, sizes).validate()
    assert balanced.states == ordering.states
    assert simulate(balanced, 1) == simulate(ordering, 1)

    def loads(o):
        return [sum(int(sizes[b]) for b in buckets) for buckets in o.buckets]
    assert sum(loads(balanced)) == sum(loads(ordering)) == sizes.sum()
    assert max(loads(balanced)) <= max(loads(ordering))
    if name == "beta" and (p, c) == (16, 8):
        assert max(loads(balanced)) < 0.5 * max(loads(ordering))  # BETA's first state: c^2 of p^2 buckets


@pytest.mark.parametrize("q, group_size", [(2, 1), (3, 2), (4, 4), (5, 1), (8, 1)])
def test_affine_trains_each_partition_in_q_plus_1_states_and_each_pair_once(q, group_size):
    """The lines of AG(2, q): every logical partition trains in q + 1 states, every two meet in exactly one
    training state, and consecutive lines share a partition, so a line costs q - 1 reads."""
    o = build_ordering("affine", q * q, q, seed=2, epoch=1, group_size=group_size)
    labels = {p: logical for logical, group in enumerate(o.groups) for p in group}
    training = [k for k in range(o.num_states) if o.buckets[k]]
    assert len(training) == q * (q + 1)
    trained_in = {logical: sum(logical in o.states[k] for k in training) for logical in range(q * q)}
    assert set(trained_in.values()) == {q + 1}
    for a in range(q * q):
        for b in range(a + 1, q * q):
            assert sum(a in o.states[k] and b in o.states[k] for k in training) == 1, (a, b)
    for k in training:  # a state trains only buckets across its own groups
        assert all(labels[i] in o.states[k] and labels[j] in o.states[k] for i, j in o.buckets[k])
    assert o.num_swaps == (q * (q + 1) - 1) * (q - 1)
    with pytest.raises(ValueError, match="capacity"):
        build_ordering("affine", q * q + 1, q)
