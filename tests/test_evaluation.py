"""Filtered and sampled link-prediction ranks against brute-force references.

The references loop over queries and candidates in plain Python (scores with
``math``/``cmath`` on float64 values) and apply the documented protocol:
filter the other known answers (train + valid + test) but keep the target, and
report the realistic rank (optimistic + pessimistic) / 2.
"""

from __future__ import annotations

import cmath
import math

import numpy as np
import pytest
import torch

import marius_py.evaluation as evaluation
from marius_py.evaluation import (PROTOCOL_FILTERED, build_known_answers, evaluate_filtered,
                                  evaluate_sampled, filtered_ranks, summarize)
from marius_py.models import build_decoder

NUM_NODES = 12
NUM_RELATIONS = 3
DIM = 4


# ---------------------------------------------------------------------------
# brute-force reference
# ---------------------------------------------------------------------------

def _c(v):
    half = len(v) // 2
    return [complex(v[k], v[k + half]) for k in range(half)]


def hand_score(name, norm, anchor, rel, cand):
    """Score of op(anchor, rel) against cand, in plain Python."""
    if name == "distmult":
        return sum(a * r * c for a, r, c in zip(anchor, rel, cand))
    if name == "transe":
        diffs = [a + r - c for a, r, c in zip(anchor, rel, cand)]
        return -sum(abs(x) for x in diffs) if norm == 1 else -math.sqrt(sum(x * x for x in diffs))
    if name == "complex":
        return sum(a * r * c.conjugate() for a, r, c in zip(_c(anchor), _c(rel), _c(cand))).real
    if name == "rotate":
        moduli = [abs(a * cmath.exp(1j * th) - c) for a, th, c in zip(_c(anchor), rel, _c(cand))]
        return -sum(moduli) if norm == 1 else -math.sqrt(sum(x * x for x in moduli))
    raise AssertionError(name)


def realistic_rank(target_score, other_scores):
    """(1 + #greater + 1 + #greater-or-equal among the others) / 2."""
    greater = sum(s > target_score for s in other_scores)
    greater_equal = sum(s >= target_score for s in other_scores)
    return ((1 + greater) + (1 + greater_equal)) / 2


def brute_force_filtered(name, norm, nodes, relations, test_edges, known_edges):
    """Tail ranks of every test edge, then head ranks; also the number of queries with a tie."""
    known = {tuple(int(x) for x in e) for e in known_edges}
    ranks, ties = [], 0
    for inverse in (False, True):
        for h, r, t in test_edges.tolist():
            if inverse:
                anchor, target, rel = t, h, relations[r + NUM_RELATIONS]
                is_known = lambda n: (n, r, t) in known  # noqa: E731
            else:
                anchor, target, rel = h, t, relations[r]
                is_known = lambda n: (h, r, n) in known  # noqa: E731
            scores = [hand_score(name, norm, nodes[anchor], rel, nodes[n]) for n in range(len(nodes))]
            others = [scores[n] for n in range(len(nodes)) if n != target and not is_known(n)]
            ties += any(s == scores[target] for s in others)
            ranks.append(realistic_rank(scores[target], others))
    return ranks, ties


def random_graph(seed, num_edges=40):
    rng = np.random.default_rng(seed)
    flat = rng.choice(NUM_NODES * NUM_RELATIONS * NUM_NODES, size=num_edges, replace=False)
    h, rest = np.divmod(flat, NUM_RELATIONS * NUM_NODES)
    r, t = np.divmod(rest, NUM_NODES)
    edges = np.stack([h, r, t], axis=1).astype(np.int64)
    return edges[:26], edges[26:32], edges[32:]  # train, valid, test


def make_model(name, norm, seed, duplicate_rows=False):
    g = torch.Generator().manual_seed(seed)
    nodes = torch.randn(NUM_NODES, DIM, generator=g, dtype=torch.float64)
    if duplicate_rows:  # exact ties: 5 and 7 copy 3, 10 copies 1
        nodes[5] = nodes[3]
        nodes[7] = nodes[3]
        nodes[10] = nodes[1]
    decoder = build_decoder(name, NUM_RELATIONS, DIM, 1.0, norm=norm).double()
    with torch.no_grad():
        decoder.relations.copy_(torch.randn(decoder.relations.shape, generator=g, dtype=torch.float64))
    return decoder, nodes


CASES = [("distmult", 1), ("transe", 1), ("transe", 2), ("complex", 1), ("rotate", 1), ("rotate", 2)]
CASE_IDS = ["distmult", "transe-L1", "transe-L2", "complex", "rotate", "rotate-L2"]


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
@pytest.mark.parametrize("seed", [0, 1])
def test_filtered_ranks_match_brute_force(case, seed):
    name, norm = case
    train, valid, test = random_graph(seed)
    known_edges = np.concatenate([train, valid, test])
    decoder, nodes = make_model(name, norm, seed)
    got = filtered_ranks(decoder, nodes, test, build_known_answers(known_edges, NUM_RELATIONS), batch_size=3)
    expected, _ = brute_force_filtered(name, norm, nodes.tolist(), decoder.relations.tolist(), test,
                                       known_edges)
    assert got.dtype == torch.float64
    assert got.tolist() == expected
    # filtering matters on this graph: some test query has another known answer
    pairs = [tuple(e) for e in known_edges[:, :2].tolist()]
    assert any(pairs.count(tuple(e)) > 1 for e in test[:, :2].tolist())


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_filtered_ranks_with_exact_ties(case):
    name, norm = case
    train, valid, test = random_graph(3)
    # test edges whose target has exact duplicates (3 ~ 5 ~ 7, 1 ~ 10), not known otherwise
    extra = np.array([[0, 0, 3], [2, 1, 5], [10, 2, 4], [1, 0, 7]], dtype=np.int64)
    known_set = {tuple(e) for e in np.concatenate([train, valid, test]).tolist()}
    extra = np.array([e for e in extra.tolist() if tuple(e) not in known_set], dtype=np.int64)
    test = np.concatenate([test, extra])
    known_edges = np.concatenate([train, valid, test])
    decoder, nodes = make_model(name, norm, 3, duplicate_rows=True)
    got = filtered_ranks(decoder, nodes, test, build_known_answers(known_edges, NUM_RELATIONS), batch_size=3)
    expected, ties = brute_force_filtered(name, norm, nodes.tolist(), decoder.relations.tolist(), test,
                                          known_edges)
    assert ties >= 2, "the tie case did not produce ties"
    assert got.tolist() == expected


def test_filtered_ranks_written_out():
    """Dot product in one dimension; every number worked out by hand.

    nodes = [1, 2, 2, 2, 3, 0]; test edge (0, r0, 2); known: (0,0,2), (0,0,4), (1,1,2), (3,0,2).
    Tail query q = 1: scores [1, 2, 2, 2, 3, 0]; node 4 is a known tail of (0, r0) -> filtered.
      greater than 2: none -> optimistic 1; others >= 2: nodes 1, 3 -> pessimistic 3; rank 2.
    Head query q = 2: scores [2, 4, 4, 4, 6, 0]; node 3 is a known head of (r0, 2) -> filtered
      ((1, r1, 2) has another relation, so node 1 stays). greater than 2: nodes 1, 2, 4 ->
      optimistic 4; pessimistic 4; rank 4.
    """
    decoder = build_decoder("dot", 2, 1, 1.0).double()
    nodes = torch.tensor([[1.0], [2.0], [2.0], [2.0], [3.0], [0.0]], dtype=torch.float64)
    test = np.array([[0, 0, 2]])
    known = np.array([[0, 0, 2], [0, 0, 4], [1, 1, 2], [3, 0, 2]])
    got = filtered_ranks(decoder, nodes, test, build_known_answers(known, 2), batch_size=3)
    assert got.tolist() == [2.0, 4.0]


def test_filtered_ranks_independent_of_batch_size():
    train, valid, test = random_graph(4)
    known = build_known_answers(np.concatenate([train, valid, test]), NUM_RELATIONS)
    decoder, nodes = make_model("distmult", 1, 4)
    one = filtered_ranks(decoder, nodes, test, known, batch_size=1)
    assert torch.equal(one, filtered_ranks(decoder, nodes, test, known, batch_size=3))
    assert torch.equal(one, filtered_ranks(decoder, nodes, test, known, batch_size=1000))


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_filtered_ranks_in_chunks_of_queries_match_brute_force(case, monkeypatch):
    """A split too large for its rows at once is ranked in chunks of edges (here a chunk per batch of 3), and
    each block of candidates in pieces (here of 2 nodes): tail queries of every chunk first, then head
    queries, as brute force ranks them."""
    name, norm = case
    train, valid, test = random_graph(5)
    known_edges = np.concatenate([train, valid, test])
    decoder, nodes = make_model(name, norm, 5)
    monkeypatch.setattr(evaluation, "QUERY_ROWS_BYTES", 1)
    monkeypatch.setattr(evaluation, "SCORE_BYTES", 4 * 3 * 2)  # (a batch of 3 against 2 nodes)
    assert evaluation.query_chunk_edges(4 * decoder.dim, 3) == 3 < len(test)
    got = filtered_ranks(decoder, nodes, test, build_known_answers(known_edges, NUM_RELATIONS), batch_size=3)
    expected, _ = brute_force_filtered(name, norm, nodes.tolist(), decoder.relations.tolist(), test,
                                       known_edges)
    assert got.tolist() == expected


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_filtered_ranks_in_chunks_on_the_gpu_match_brute_force(case, monkeypatch):
    """The same chunks and pieces with the table and decoder on the GPU."""
    name, norm = case
    train, valid, test = random_graph(6)
    known_edges = np.concatenate([train, valid, test])
    decoder, nodes = make_model(name, norm, 6)
    monkeypatch.setattr(evaluation, "QUERY_ROWS_BYTES", 1)
    monkeypatch.setattr(evaluation, "SCORE_BYTES", 4 * 3 * 2)
    assert evaluation.query_chunk_edges(4 * decoder.dim, 3) == 3 < len(test)
    got = filtered_ranks(decoder.cuda(), nodes.cuda(), test, build_known_answers(known_edges, NUM_RELATIONS),
                         batch_size=3)
    expected, _ = brute_force_filtered(name, norm, nodes.tolist(), decoder.relations.tolist(), test,
                                       known_edges)
    assert got.tolist() == expected


def test_known_answers_lookup():
    edges = np.array([[0, 1, 2], [0, 1, 5], [0, 0, 3], [4, 1, 2], [0, 1, 1]])
    tails, heads = build_known_answers(edges, 2)
    rows, answers = tails.lookup(torch.tensor([0, 4, 3, 0]), torch.tensor([1, 1, 1, 0]))
    pairs = sorted(zip(rows.tolist(), answers.tolist()))
    assert pairs == [(0, 1), (0, 2), (0, 5), (1, 2), (3, 3)]
    rows, answers = heads.lookup(torch.tensor([2, 3]), torch.tensor([1, 1]))
    assert sorted(zip(rows.tolist(), answers.tolist())) == [(0, 0), (0, 4)]


def test_evaluate_filtered_summary_matches_brute_force():
    train, valid, test = random_graph(5)
    known_edges = np.concatenate([train, valid, test])
    decoder, nodes = make_model("transe", 1, 5)
    metrics = evaluate_filtered(decoder, nodes, test, build_known_answers(known_edges, NUM_RELATIONS),
                                batch_size=3)
    ranks, _ = brute_force_filtered("transe", 1, nodes.tolist(), decoder.relations.tolist(), test,
                                    known_edges)
    assert metrics["num_queries"] == 2 * len(test)
    assert metrics["protocol"] == PROTOCOL_FILTERED
    assert metrics["mrr"] == pytest.approx(sum(1 / x for x in ranks) / len(ranks), rel=1e-12)
    assert metrics["mean_rank"] == pytest.approx(sum(ranks) / len(ranks), rel=1e-12)
    assert metrics["hits@10"] == pytest.approx(sum(x <= 10 for x in ranks) / len(ranks))


# ---------------------------------------------------------------------------
# summarize
# ---------------------------------------------------------------------------

def test_summarize_written_out():
    ranks = torch.tensor([1.0, 2.0, 4.0, 1.5, 20.0, 3.0, 10.5, 10.0])
    m = summarize(ranks, "proto")
    assert m["mrr"] == pytest.approx((1 + 1 / 2 + 1 / 4 + 1 / 1.5 + 1 / 20 + 1 / 3 + 1 / 10.5 + 1 / 10) / 8)
    assert m["mean_rank"] == pytest.approx(52.0 / 8)
    assert m["hits@1"] == pytest.approx(1 / 8)     # 1.5 is not a hit at 1
    assert m["hits@3"] == pytest.approx(4 / 8)     # 1, 2, 1.5, 3
    assert m["hits@10"] == pytest.approx(6 / 8)    # 10.5 and 20 are not
    assert m["num_queries"] == 8
    assert m["protocol"] == "proto"


# ---------------------------------------------------------------------------
# sampled evaluation
# ---------------------------------------------------------------------------

@pytest.fixture
def captured_ranks(monkeypatch):
    """Record the per-query ranks that evaluate_sampled passes to summarize."""
    calls = []
    original = evaluation.summarize

    def capture(ranks, protocol):
        calls.append(ranks.clone())
        return original(ranks, protocol)

    monkeypatch.setattr(evaluation, "summarize", capture)
    return calls


def _record_candidates(monkeypatch, decoder):
    seen = []
    original = decoder.compare_all

    def wrapper(queries, candidates):
        seen.append(candidates[0].detach().clone())
        return original(queries, candidates)

    monkeypatch.setattr(decoder, "compare_all", wrapper)
    return seen


def _node_ids(candidates, nodes):
    """Map candidate embedding rows back to node ids (rows of ``nodes`` are all distinct)."""
    matches = (candidates[:, None, :] == nodes[None, :, :]).all(-1)
    assert torch.all(matches.sum(1) == 1)
    return matches.int().argmax(1).tolist()


@pytest.mark.parametrize("sampling", ["uniform", "degree", "mixed"])
def test_evaluate_sampled_ranks_in_range_and_deterministic(sampling, captured_ranks):
    train, valid, test = random_graph(6)
    decoder, nodes = make_model("distmult", 1, 6)
    degrees = np.bincount(train[:, [0, 2]].reshape(-1), minlength=len(nodes))
    num_negatives = 7
    first = evaluate_sampled(decoder, nodes, test, num_negatives, sampling, degrees, seed=13, batch_size=3)
    second = evaluate_sampled(decoder, nodes, test, num_negatives, sampling, degrees, seed=13, batch_size=3)
    assert first == second
    ranks = captured_ranks[0]
    assert torch.equal(ranks, captured_ranks[1])
    assert len(ranks) == 2 * len(test)
    assert torch.all((ranks >= 1) & (ranks <= num_negatives + 1))
    assert torch.all(ranks * 2 == torch.round(ranks * 2))
    assert first["num_queries"] == 2 * len(test)
    assert str(num_negatives) in first["protocol"]


def test_evaluate_sampled_matches_brute_force_on_drawn_negatives(monkeypatch, captured_ranks):
    """Rank among the negatives actually drawn (recovered from the decoder calls), unfiltered."""
    train, valid, test = random_graph(7)
    decoder, nodes = make_model("transe", 1, 7)
    candidates = _record_candidates(monkeypatch, decoder)
    batch_size = 3
    evaluate_sampled(decoder, nodes, test, 5, "uniform", None, seed=2, batch_size=batch_size)
    ranks = captured_ranks[0].tolist()
    rel = decoder.relations.tolist()
    node_list = nodes.tolist()
    expected = []
    batches = [test[s:s + batch_size] for s in range(0, len(test), batch_size)]
    for (inverse, batch), cand in zip([(False, b) for b in batches] + [(True, b) for b in batches], candidates):
        negatives = _node_ids(cand, nodes)
        for h, r, t in batch.tolist():
            anchor, target, rv = (t, h, rel[r + NUM_RELATIONS]) if inverse else (h, t, rel[r])
            target_score = hand_score("transe", 1, node_list[anchor], rv, node_list[target])
            others = [hand_score("transe", 1, node_list[anchor], rv, node_list[n]) for n in negatives]
            expected.append(realistic_rank(target_score, others))
    assert len(candidates) == 2 * len(batches)
    assert ranks == pytest.approx(expected, abs=1e-12)


def test_degree_sampling_draws_only_nodes_with_degree(monkeypatch):
    train, valid, test = random_graph(8)
    decoder, nodes = make_model("distmult", 1, 8)
    candidates = _record_candidates(monkeypatch, decoder)
    degrees = np.bincount([2, 2, 5, 9, 2], minlength=len(nodes))  # 3, 1, 1
    evaluate_sampled(decoder, nodes, test, 50, "degree", degrees, seed=0, batch_size=4)
    drawn = [n for cand in candidates for n in _node_ids(cand, nodes)]
    assert set(drawn) == {2, 5, 9}
    assert drawn.count(2) > drawn.count(5)  # in proportion to degree (3/5 vs 1/5)
    # uniform sampling ignores the degrees
    candidates.clear()
    evaluate_sampled(decoder, nodes, test, 50, "uniform", degrees, seed=0, batch_size=4)
    drawn = {n for cand in candidates for n in _node_ids(cand, nodes)}
    assert drawn - {2, 5, 9}


def test_mixed_sampling_draws_half_by_degree(monkeypatch):
    train, valid, test = random_graph(8)
    decoder, nodes = make_model("distmult", 1, 8)
    candidates = _record_candidates(monkeypatch, decoder)
    degrees = np.bincount([5] * 7, minlength=len(nodes))  # every degree-based draw is node 5
    evaluate_sampled(decoder, nodes, test, 40, "mixed", degrees, seed=0, batch_size=4)
    for cand in candidates:
        drawn = _node_ids(cand, nodes)
        assert drawn[20:] == [5] * 20  # the second half: by degree
        assert len(set(drawn[:20])) > 5  # the first half: uniform


@pytest.mark.parametrize("case", [("dot", 1)] + CASES, ids=["dot"] + CASE_IDS)
def test_evaluate_sampled_tie_with_sampled_copy_of_target(case, captured_ranks):
    """Sampled evaluation is unfiltered: a negative equal to the target is an exact tie.

    Self-loop edges (i, r, i) with the degree pool [i]: every negative, in both
    directions, is the target itself, so each of the N + 1 scores ties and the
    realistic rank must be (1 + (N + 1)) / 2 = 3 for N = 4.
    """
    name, norm = case
    g = torch.Generator().manual_seed(0)
    nodes = torch.randn(40, 16, generator=g, dtype=torch.float64)
    decoder = build_decoder(name, 2, 16, 1.0, norm=norm).double()
    with torch.no_grad():
        decoder.relations.copy_(torch.randn(decoder.relations.shape, generator=g, dtype=torch.float64))
    for i in range(40):
        evaluate_sampled(decoder, nodes, np.array([[i, i % 2, i]]), 4, "degree", np.bincount([i], minlength=40),
                         seed=0)
    ranks = torch.cat(captured_ranks)
    bad = int((ranks != 3.0).sum())
    assert bad == 0, f"{bad}/{len(ranks)} queries broke the tie with their own copy: {ranks.unique().tolist()}"
