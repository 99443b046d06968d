"""Growing a trained model's building blocks (issue 55): new rows from trained neighbours through the
decoder's own query, and a relation table grown without changing any old edge's score."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from marius_py.growth import grown_relation_rows, grown_relation_state, neighbour_rows
from marius_py.models import Decoder, build_decoder

DECODERS = ["dot", "distmult", "complex", "transe", "rotate", "simple"]


def scores_both_ways(decoder: Decoder, nodes: torch.Tensor, edges: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        tails = decoder.compare_pairs(decoder.query(nodes[edges[:, 0]], edges[:, 1], False), nodes[edges[:, 2]])
        heads = decoder.compare_pairs(decoder.query(nodes[edges[:, 2]], edges[:, 1], True), nodes[edges[:, 0]])
    return torch.cat([tails, heads])


@pytest.mark.parametrize("name", DECODERS)
def test_a_grown_relation_table_scores_every_old_edge_as_before(name):
    torch.manual_seed(0)
    decoder = build_decoder(name, 4, 8, 0.5)
    with torch.no_grad():
        decoder.relations.normal_()
    nodes, edges = torch.randn(30, 8), torch.stack([torch.randint(30, (50,)), torch.randint(4, (50,)),
                                                    torch.randint(30, (50,))], dim=1)
    before = scores_both_ways(decoder, nodes, edges)
    width = decoder.relations.shape[1]
    grown = grown_relation_rows(decoder.relations.detach(), 4, torch.randn(3, width), torch.randn(3, width))
    decoder.relations = torch.nn.Parameter(grown)
    decoder.num_relations = 7
    assert torch.equal(scores_both_ways(decoder, nodes, edges), before)


def test_grown_optimizer_state_keeps_old_rows_and_zeroes_new_ones():
    state = torch.arange(8 * 2, dtype=torch.float32).reshape(8, 2)  # (4 relations: forward, then inverse)
    grown = grown_relation_state(state, 4, 2)
    assert grown.shape == (12, 2)
    assert torch.equal(grown[:4], state[:4]) and torch.equal(grown[6:10], state[4:])
    assert not grown[4:6].any() and not grown[10:].any()
    with pytest.raises(ValueError):
        grown_relation_rows(state, 3, torch.zeros(1, 2), torch.zeros(1, 2))


@pytest.mark.parametrize("name", ["transe", "rotate"])
def test_a_distance_decoder_places_a_new_node_at_the_mean_of_its_neighbours_queries(name):
    torch.manual_seed(1)
    decoder = build_decoder(name, 3, 8, 0.5)
    nodes = torch.randn(10, 8)
    initial = torch.full((3, 8), 7.0)
    # new node 10: tail of (2, r1, 10) and head of (10, r0, 4); new node 11: only beside new node 12; 12: none
    edges = np.array([[2, 1, 10], [10, 0, 4], [11, 2, 12]])
    rows, estimated = neighbour_rows(decoder, nodes, edges, 10, initial)
    with torch.no_grad():
        as_tail = decoder.query(nodes[[2]], torch.tensor([1]), False)[0]
        as_head = decoder.query(nodes[[4]], torch.tensor([0]), True)[0]
    torch.testing.assert_close(rows[0], (as_tail + as_head) / 2, rtol=1e-6, atol=1e-6)
    assert estimated.tolist() == [True, False, False] and torch.equal(rows[1:], initial[1:])


@pytest.mark.parametrize("name", ["distmult", "complex", "dot"])
def test_a_dot_decoder_points_a_new_node_along_its_neighbours_query_at_a_trained_length(name):
    torch.manual_seed(2)
    decoder = build_decoder(name, 3, 8, 0.5)
    nodes = torch.randn(10, 8)
    rows, estimated = neighbour_rows(decoder, nodes, np.array([[3, 2, 10]]), 10, torch.zeros(1, 8))
    with torch.no_grad():
        query = decoder.query(nodes[[3]], torch.tensor([2]), False)[0]
    assert estimated.tolist() == [True]
    assert torch.nn.functional.cosine_similarity(rows[0], query, dim=0) == pytest.approx(1.0, abs=1e-6)
    assert torch.linalg.vector_norm(rows[0]) == pytest.approx(float(nodes.norm(dim=1).median()), rel=1e-5)


def test_a_decoder_whose_query_is_no_node_row_keeps_the_given_rows():
    class Plugin(Decoder):
        name = "growth-test-plugin"

        def score_hrt(self, heads, relations, tails):
            return (heads * relations * tails).sum(-1)
    decoder = Plugin(3, 8, 0.5)
    initial = torch.randn(2, 8)
    rows, estimated = neighbour_rows(decoder, torch.randn(10, 8), np.array([[1, 0, 10]]), 10, initial)
    assert torch.equal(rows, initial) and not estimated.any()
