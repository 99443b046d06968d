"""Chunked shared negative sampling and chunk padding."""

from __future__ import annotations

import pytest
import torch

from marius_py.negatives import chunk, sample_negatives


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


ENDPOINTS = torch.tensor([3, 17, 42, 17, 3, 3])


@pytest.mark.parametrize("fraction", [0.0, 0.25, 0.5, 1.0])
def test_shapes_and_range(fraction):
    negatives = sample_negatives(ENDPOINTS, 50, num_chunks=3, num_negatives=8,
                                 degree_fraction=fraction, generator=gen())
    assert negatives.shape == (3, 8)
    assert negatives.dtype == torch.int64
    assert torch.all((negatives >= 0) & (negatives < 50))


def test_all_nodes():
    negatives = sample_negatives(ENDPOINTS, 9, num_chunks=4, num_negatives=-1, degree_fraction=0.5,
                                 generator=gen())
    assert negatives.tolist() == [list(range(9))]


def test_degree_fraction_one_draws_only_endpoints():
    negatives = sample_negatives(ENDPOINTS, 1000, num_chunks=5, num_negatives=40, degree_fraction=1.0,
                                 generator=gen(1))
    assert set(negatives.flatten().tolist()) == {3, 17, 42}
    # proportional to multiplicity among the endpoints: 3 appears 3/6, 42 appears 1/6
    flat = negatives.flatten().tolist()
    assert flat.count(3) > flat.count(42)


def test_degree_fraction_part_comes_from_endpoints():
    """round(10 * 0.3) = 3 per chunk from the endpoints; the rest uniform over 10^6 nodes."""
    negatives = sample_negatives(ENDPOINTS, 1_000_000, num_chunks=4, num_negatives=10,
                                 degree_fraction=0.3, generator=gen(2))
    endpoint_set = set(ENDPOINTS.tolist())
    for row in negatives.tolist():
        assert sum(n in endpoint_set for n in row) == 3


def test_degree_fraction_zero_is_uniform():
    negatives = sample_negatives(ENDPOINTS, 20, num_chunks=10, num_negatives=50, degree_fraction=0.0,
                                 generator=gen(3))
    assert set(negatives.flatten().tolist()) == set(range(20))


def test_deterministic_for_seeded_generator():
    a = sample_negatives(ENDPOINTS, 100, 3, 12, 0.5, gen(7))
    b = sample_negatives(ENDPOINTS, 100, 3, 12, 0.5, gen(7))
    c = sample_negatives(ENDPOINTS, 100, 3, 12, 0.5, gen(8))
    assert torch.equal(a, b)
    assert not torch.equal(a, c)


def test_chunk_pads_by_repeating_last_row_and_keeps_order():
    ids = torch.tensor([10, 11, 12, 13, 14, 15, 16])
    out = chunk(ids, 3)
    assert out.tolist() == [[10, 11, 12], [13, 14, 15], [16, 16, 16]]
    rows = torch.arange(14).reshape(7, 2)
    out = chunk(rows, 3)
    assert out.shape == (3, 3, 2)
    assert out.reshape(-1, 2).tolist() == rows.tolist() + [[12, 13], [12, 13]]


def test_chunk_without_padding_is_a_reshape():
    rows = torch.arange(24).reshape(6, 4)
    assert torch.equal(chunk(rows, 3), rows.reshape(3, 2, 4))
    assert torch.equal(chunk(rows, 1), rows[None])
    assert torch.equal(chunk(rows, 6), rows[:, None, :])


def test_chunk_more_chunks_than_rows():
    out = chunk(torch.tensor([5, 6]), 3)
    assert out.tolist() == [[5], [6], [6]]


def test_candidate_ranges_map_positions_to_their_rows():
    from marius_py.negatives import CandidateRows
    candidates = CandidateRows([(0, 4), (10, 2), (20, 3)])
    assert candidates.total == 9
    assert candidates.rows(torch.arange(9)).tolist() == [0, 1, 2, 3, 10, 11, 20, 21, 22]
    assert candidates.all(torch.device("cpu")).tolist() == [0, 1, 2, 3, 10, 11, 20, 21, 22]
    assert candidates.to("cpu").rows(torch.tensor([5, 8])).tolist() == [11, 22]
    assert CandidateRows.contiguous(5).is_identity and not candidates.is_identity
