"""Decoders, losses, regularisers and StepModel.compute_batch against hand computations.

Every expected value here is computed independently of marius_py: plain Python
(``math``/``cmath``) on explicit numbers for the scores, and plain autograd on a
dense float64 copy (with the textbook formulas) for ``compute_batch``.
"""

from __future__ import annotations

import cmath
import math

import pytest
import torch
from torch.nn import functional as F

import marius_py.models as models
from marius_py.config import Config
from marius_py.config_validation import validate
from marius_py.errors import MariusInputError
from marius_py.models import (DECODERS, build_decoder, logistic, margin_ranking, regularization,
                              softmax_cross_entropy)
from marius_py.negatives import sample_negatives
from marius_py.step.model import StepModel

NUM_RELATIONS = 2
DIM = 4


# ---------------------------------------------------------------------------
# Hand score functions: plain Python floats / complex numbers, no torch.
# ``h``, ``t``: node vectors (lists of length DIM); ``r``: the relation row used.
# Complex embeddings are stored as [re | im].
# ---------------------------------------------------------------------------

def _as_complex(v):
    half = len(v) // 2
    return [complex(v[k], v[k + half]) for k in range(half)]


def hand_dot(h, r, t):
    return sum(a * b for a, b in zip(h, t))


def hand_distmult(h, r, t):
    return sum(a * b * c for a, b, c in zip(h, r, t))


def hand_complex(h, r, t):
    hc, rc, tc = _as_complex(h), _as_complex(r), _as_complex(t)
    return sum(a * b * c.conjugate() for a, b, c in zip(hc, rc, tc)).real


def hand_transe_l1(h, r, t):
    return -sum(abs(a + b - c) for a, b, c in zip(h, r, t))


def hand_transe_l2(h, r, t):
    return -math.sqrt(sum((a + b - c) ** 2 for a, b, c in zip(h, r, t)))


def hand_rotate(h, theta, t):
    hc, tc = _as_complex(h), _as_complex(t)
    return -sum(abs(a * cmath.exp(1j * th) - c) for a, th, c in zip(hc, theta, tc))


def hand_rotate_l2(h, theta, t):
    hc, tc = _as_complex(h), _as_complex(t)
    return -math.sqrt(sum(abs(a * cmath.exp(1j * th) - c) ** 2 for a, th, c in zip(hc, theta, tc)))


def hand_simple(h, rows, t):
    """Kazemi & Poole: 1/2 (<h_H, r, t_T> + <t_H, r', h_T>), nodes [head role | tail role]; ``rows``: the
    direction's own row then the other (forward: r, r'; inverse: r', r, with h and t swapped)."""
    half = len(h) // 2
    own, other = rows[:half], rows[half:]
    return 0.5 * (sum(a * b * c for a, b, c in zip(h[:half], own, t[half:]))
                  + sum(a * b * c for a, b, c in zip(t[:half], other, h[half:])))


# (decoder name, its distance norm) -> hand score; every registered decoder must appear.
HAND_SCORES = {
    ("dot", 1): hand_dot,
    ("distmult", 1): hand_distmult,
    ("complex", 1): hand_complex,
    ("transe", 1): hand_transe_l1,
    ("transe", 2): hand_transe_l2,
    ("rotate", 1): hand_rotate,
    ("rotate", 2): hand_rotate_l2,
    ("simple", 1): hand_simple,
}
CASES = list(HAND_SCORES)
CASE_IDS = [f"{name}-L{norm}" if name == "transe" or norm == 2 else name for name, norm in CASES]

# Explicit relation tables: rows 0..R-1 forward, R..2R-1 inverse.
RELATIONS_DIM4 = [[0.5, -1.0, 2.0, 0.0],
                  [1.5, 0.25, -0.5, -2.0],
                  [-0.75, 2.0, 1.0, 0.5],    # inverse of relation 0
                  [0.1, -0.3, 0.7, 1.25]]    # inverse of relation 1
RELATIONS_PHASES = [[math.pi / 2, math.pi],
                    [0.3, -1.2],
                    [-math.pi / 3, 2.5],
                    [1.0, -0.4]]

HEADS = [[1.0, 2.0, 3.0, 4.0],
         [-0.5, 0.25, 1.5, -2.0],
         [0.0, -1.0, 0.75, 0.5]]
TAILS = [[2.0, 1.0, -1.0, 3.0],
         [1.25, -0.75, 0.5, 2.0],
         [-1.5, 0.5, -0.25, 1.0]]
REL_IDS = [0, 1, 1]


def relation_table(name):
    if name == "dot":
        return [[] for _ in range(2 * NUM_RELATIONS)]
    if name in ("rotate", "simple"):  # (SimplE: r and r', each half the dimension)
        return RELATIONS_PHASES
    return RELATIONS_DIM4


def direction_row(name, table, r, inverse):
    """The relation vector a direction of relation ``r`` scores with: its row (SimplE: both of the relation's
    rows, the direction's own first)."""
    own, other = (r + NUM_RELATIONS, r) if inverse else (r, r + NUM_RELATIONS)
    return list(table[own]) + (list(table[other]) if name == "simple" else [])


def make_decoder(name, norm=1, num_relations=NUM_RELATIONS, dim=DIM):
    decoder = build_decoder(name, num_relations, dim, 0.1, norm=norm).double()
    if num_relations == NUM_RELATIONS and dim == DIM:
        table = torch.tensor(relation_table(name), dtype=torch.float64).reshape(2 * NUM_RELATIONS, -1)
        if (name, norm) in HAND_SCORES:
            assert decoder.relations.shape == table.shape
        if decoder.relations.shape == table.shape:  # else: a decoder without a table keeps its init
            with torch.no_grad():
                decoder.relations.copy_(table)
    return decoder


def t64(rows):
    return torch.tensor(rows, dtype=torch.float64)


# ---------------------------------------------------------------------------
# registry / meta
# ---------------------------------------------------------------------------

def test_every_registered_decoder_has_a_hand_computation():
    covered = {name for name, _ in HAND_SCORES}
    missing = set(DECODERS) - covered
    assert not missing, f"decoders without a hand-computed score test: {sorted(missing)}"


def test_build_decoder_rejects_unknown_name():
    with pytest.raises(MariusInputError, match="unknown decoder 'nope'"):
        build_decoder("nope", 2, 4, 0.1)


def test_hand_functions_on_written_out_numbers():
    """The hand formulas themselves, on numbers worked out on paper."""
    h, r, t = [1, 2, 3, 4], [0.5, -1, 2, 0], [2, 1, -1, 3]
    assert hand_dot(h, r, t) == 13.0                      # 2 + 2 - 3 + 12
    assert hand_distmult(h, r, t) == -7.0                 # 1 - 2 - 6 + 0
    # h = (1+3i, 2+4i), r = (0.5+2i, -1+0i), t = (2-1i, 1+3i)
    # (1+3i)(0.5+2i)(2+1i) = -14.5+1.5i ; (2+4i)(-1)(1-3i) = -14+2i
    assert hand_complex(h, r, t) == pytest.approx(-28.5, abs=1e-12)
    # h + r - t = (-0.5, 0, 6, 1)
    assert hand_transe_l1(h, r, t) == -7.5
    assert hand_transe_l2(h, r, t) == pytest.approx(-math.sqrt(37.25), abs=1e-12)
    # rotations by i and -1: (-3+1i) - (2-1i) = -5+2i ; (-2-4i) - (1+3i) = -3-7i
    assert hand_rotate(h, [math.pi / 2, math.pi], t) == pytest.approx(-(math.sqrt(29) + math.sqrt(58)),
                                                                        abs=1e-12)
    assert hand_rotate_l2(h, [math.pi / 2, math.pi], t) == pytest.approx(-math.sqrt(29 + 58), abs=1e-12)


@pytest.mark.parametrize("name,expected", [
    ("dot", 13.0), ("distmult", -7.0), ("complex", -28.5), ("transe-1", -7.5),
    ("transe-2", -math.sqrt(37.25)), ("rotate", -(math.sqrt(29) + math.sqrt(58))),
    ("rotate-2", -math.sqrt(87))])
def test_library_score_on_written_out_numbers(name, expected):
    base, _, norm = name.partition("-")
    decoder = build_decoder(base, 1, 4, 0.1, norm=int(norm or 1)).double()
    rel = [math.pi / 2, math.pi] if base == "rotate" else ([] if base == "dot" else [0.5, -1, 2, 0])
    with torch.no_grad():
        decoder.relations.copy_(t64([rel, rel]).reshape(2, -1))
    got = decoder.score(t64([[1, 2, 3, 4]]), torch.tensor([0]), t64([[2, 1, -1, 3]])).detach()
    assert got.shape == (1,)
    assert float(got[0]) == pytest.approx(expected, rel=1e-9, abs=1e-9)


# ---------------------------------------------------------------------------
# score / query / compare_pairs
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_score_matches_hand(case):
    name, norm = case
    hand = HAND_SCORES[case]
    decoder = make_decoder(name, norm)
    table = relation_table(name)
    got = decoder.score(t64(HEADS), torch.tensor(REL_IDS), t64(TAILS))
    expected = [hand(h, direction_row(name, table, r, False), t) for h, r, t in zip(HEADS, REL_IDS, TAILS)]
    assert got.shape == (3,)
    assert got.tolist() == pytest.approx(expected, rel=1e-9, abs=1e-9)


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_query_compare_pairs_forward_and_inverse(case):
    name, norm = case
    hand = HAND_SCORES[case]
    decoder = make_decoder(name, norm)
    table = relation_table(name)
    ids = torch.tensor(REL_IDS)
    forward = decoder.compare_pairs(decoder.query(t64(HEADS), ids, inverse=False), t64(TAILS))
    assert forward.tolist() == pytest.approx(
        [hand(h, direction_row(name, table, r, False), t) for h, r, t in zip(HEADS, REL_IDS, TAILS)],
        rel=1e-9, abs=1e-9)
    # inverse query: op(t, r_inv) compared with h, r_inv = row r + R
    inverse = decoder.compare_pairs(decoder.query(t64(TAILS), ids, inverse=True), t64(HEADS))
    assert inverse.tolist() == pytest.approx(
        [hand(t, direction_row(name, table, r, True), h) for h, r, t in zip(HEADS, REL_IDS, TAILS)],
        rel=1e-9, abs=1e-9)


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_relation_vectors_inverse_offset(case):
    name, norm = case
    decoder = make_decoder(name, norm)
    ids = torch.tensor([1, 0, 1])
    table = relation_table(name)
    for inverse in (False, True):
        expected = t64([direction_row(name, table, r, inverse) for r in ids.tolist()]).reshape(3, -1)
        assert torch.equal(decoder.relation_vectors(ids, inverse=inverse), expected)


def _random_inputs(seed, chunks, m, n, dim=DIM):
    g = torch.Generator().manual_seed(seed)
    queries = torch.randn(chunks, m, dim, generator=g, dtype=torch.float64)
    candidates = torch.randn(chunks, n, dim, generator=g, dtype=torch.float64)
    return queries, candidates


def _pairwise_loop(decoder, queries, candidates):
    chunks, m, _ = queries.shape
    n = candidates.shape[1]
    out = torch.empty(chunks, m, n, dtype=torch.float64)
    for c in range(chunks):
        for i in range(m):
            for j in range(n):
                out[c, i, j] = decoder.compare_pairs(queries[c, i][None], candidates[c, j][None])[0]
    return out


# every registered decoder (TransE with both norms), whether or not it has a hand table entry
CONTRACT_CASES = [(name, norm) for name in sorted(DECODERS)
                  for norm in ((1, 2) if name == "transe" else (1,))]


@pytest.mark.parametrize("name,norm", CONTRACT_CASES)
def test_compare_all_equals_pairwise_loop(name, norm):
    """Contract of every registered decoder: compare_all[c, m, n] == compare_pairs(q[c, m], x[c, n])."""
    decoder = make_decoder(name, norm)
    queries, candidates = _random_inputs(0, chunks=2, m=3, n=5)
    got = decoder.compare_all(queries, candidates)
    assert got.shape == (2, 3, 5)
    torch.testing.assert_close(got, _pairwise_loop(decoder, queries, candidates), rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("case", [("rotate", 1), ("transe", 1)], ids=["rotate", "transe-L1"])
def test_blocked_compare_all_equals_unblocked(case, monkeypatch):
    name, norm = case
    decoder = make_decoder(name, norm)
    queries, candidates = _random_inputs(1, chunks=2, m=3, n=37)
    unblocked = decoder.compare_all(queries, candidates)
    calls = []
    original = decoder.distance

    def counting_distance(difference):
        calls.append(difference.shape)
        return original(difference)

    monkeypatch.setattr(decoder, "distance", counting_distance)
    monkeypatch.setattr(models, "_BROADCAST_BLOCK", 2 * 3 * DIM)  # block of 2 candidates
    blocked = decoder.compare_all(queries, candidates)
    assert len(calls) > 1, "blocked path was not taken"
    assert all(shape[2] <= 2 for shape in calls)
    assert blocked.shape == (2, 3, 37)
    torch.testing.assert_close(blocked, unblocked, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(blocked, _pairwise_loop(decoder, queries, candidates), rtol=1e-9, atol=1e-9)


# ---------------------------------------------------------------------------
# losses
# ---------------------------------------------------------------------------

POS = [1.0, -0.5, 2.0, 0.0]
NEG = [[0.5, 2.0, -1.0],
       [-0.5, 0.75, 3.0],
       [1.0, 1.0, 1.0],
       [-2.0, 4.0, 0.25]]
VALID = [[True, True, True],
         [True, False, True],
         [False, False, False],   # every negative masked
         [False, True, True]]


def _loss_inputs():
    return t64(POS), t64(NEG), torch.tensor(VALID)


def test_softmax_cross_entropy_against_filtered_log_softmax():
    got = softmax_cross_entropy(*_loss_inputs())
    expected = []
    for pos, negs, valid in zip(POS, NEG, VALID):
        logits = torch.tensor([pos] + [n for n, v in zip(negs, valid) if v], dtype=torch.float64)
        expected.append(float(-torch.log_softmax(logits, dim=0)[0]))
    assert got.tolist() == pytest.approx(expected, rel=1e-12, abs=1e-12)
    assert float(got[2]) == pytest.approx(0.0, abs=1e-12)  # only the positive left


def test_softmax_cross_entropy_written_out():
    # row 0: log(e^1 + e^0.5 + e^2 + e^-1) - 1
    got = softmax_cross_entropy(*_loss_inputs())
    assert float(got[0]) == pytest.approx(math.log(math.e + math.exp(0.5) + math.exp(2) + math.exp(-1)) - 1,
                                          rel=1e-12)


def _softplus(x):
    return math.log1p(math.exp(x))


def test_logistic_against_hand_formula():
    got = logistic(*_loss_inputs())
    expected = []
    for pos, negs, valid in zip(POS, NEG, VALID):
        kept = [n for n, v in zip(negs, valid) if v]
        mean_neg = sum(_softplus(n) for n in kept) / len(kept) if kept else 0.0
        expected.append(_softplus(-pos) + mean_neg)
    assert got.tolist() == pytest.approx(expected, rel=1e-12, abs=1e-12)


@pytest.mark.parametrize("margin", [1.0, 0.5])
def test_margin_ranking_against_hand_formula(margin):
    got = margin_ranking(*_loss_inputs(), margin=margin)
    expected = []
    for pos, negs, valid in zip(POS, NEG, VALID):
        kept = [max(0.0, margin - pos + n) for n, v in zip(negs, valid) if v]
        expected.append(sum(kept) / len(kept) if kept else 0.0)
    assert got.tolist() == pytest.approx(expected, rel=1e-12, abs=1e-12)
    # row 1, margin 1: valid negatives -0.5 and 3.0 -> (max(0, 1) + max(0, 4.5)) / 2
    if margin == 1.0:
        assert float(got[1]) == pytest.approx(2.75)


# ---------------------------------------------------------------------------
# regularisation
# ---------------------------------------------------------------------------

X1 = [[1.0, -2.0, 0.5, 3.0], [0.0, 1.5, -1.0, 2.0]]
X2 = [[-0.5, 0.25, 2.0, -1.0], [1.0, 1.0, 1.0, 1.0]]


def test_n3_real():
    got = regularization("n3", [t64(X1), t64(X2)], complex_valued=False, batch_size=2)
    expected = sum(abs(v) ** 3 for rows in (X1, X2) for row in rows for v in row) / 2
    assert float(got) == pytest.approx(expected, rel=1e-12)
    # written out for X1 alone: 1 + 8 + 0.125 + 27 + 0 + 3.375 + 1 + 8 = 48.5
    assert float(regularization("n3", [t64(X1)], False, 1)) == pytest.approx(48.5)


def test_n3_complex_uses_modulus():
    got = regularization("n3", [t64(X1), t64(X2)], complex_valued=True, batch_size=4)
    expected = sum(abs(z) ** 3 for rows in (X1, X2) for row in rows for z in _as_complex(row)) / 4
    assert float(got) == pytest.approx(expected, rel=1e-12)
    # |3+4i|^3 = 125
    assert float(regularization("n3", [t64([[3.0, 0.0, 4.0, 0.0]])], True, 1)) == pytest.approx(125.0)


def test_l2():
    got = regularization("l2", [t64(X1), t64(X2)], complex_valued=False, batch_size=3)
    expected = sum(v * v for rows in (X1, X2) for row in rows for v in row) / 3
    assert float(got) == pytest.approx(expected, rel=1e-12)
    # l2 ignores complex_valued
    assert float(regularization("l2", [t64(X1)], True, 1)) == pytest.approx(
        sum(v * v for row in X1 for v in row))


def test_regularization_none_is_zero():
    assert float(regularization("none", [t64(X1)], False, 1)) == 0.0


# ---------------------------------------------------------------------------
# StepModel.compute_batch against dense autograd + textbook Adagrad
# ---------------------------------------------------------------------------

EDGES = [[0, 0, 1], [1, 1, 2], [2, 0, 3], [3, 1, 5], [0, 1, 4]]
NUM_NODES = 6
LR = 0.1
RELATION_LR = 0.05


def _dense_score(name, norm, anchor, rel, cand):
    """Torch (autograd) version of the hand formulas, via complex tensors where relevant."""
    if name == "dot":
        return (anchor * cand).sum()
    if name == "distmult":
        return (anchor * rel * cand).sum()
    if name == "transe":
        diff = anchor + rel - cand
        return -(diff.abs().sum() if norm == 1 else torch.sqrt((diff * diff).sum()))
    half = anchor.shape[0] // 2
    a = torch.complex(anchor[:half], anchor[half:])
    c = torch.complex(cand[:half], cand[half:])
    if name == "complex":
        r = torch.complex(rel[:half], rel[half:])
        return (a * r * c.conj()).sum().real
    if name == "rotate":
        rotation = torch.complex(torch.cos(rel), torch.sin(rel))
        moduli = (a * rotation - c).abs()
        return -(moduli.sum() if norm == 1 else torch.sqrt((moduli * moduli).sum()))
    if name == "simple":  # (``rel``: the direction's own row, then the other; see hand_simple)
        own, other = rel[:half], rel[half:]
        return 0.5 * ((anchor[:half] * own * cand[half:]).sum() + (cand[:half] * other * anchor[half:]).sum())
    raise AssertionError(name)


def _dense_row(name, R, r, inverse):
    """``direction_row`` of the relation table tensor ``R``."""
    own, other = (r + NUM_RELATIONS, r) if inverse else (r, r + NUM_RELATIONS)
    return torch.cat([R[own], R[other]]) if name == "simple" else R[own]


def _dense_loss(kind, pos, negs, margin=1.0):
    negs = torch.stack(negs) if negs else pos.new_zeros(0)
    if kind == "softmax_ce":
        return torch.logsumexp(torch.cat([pos[None], negs]), 0) - pos
    if kind == "logistic":
        return F.softplus(-pos) + (F.softplus(negs).mean() if len(negs) else 0.0)
    if kind == "margin":
        return torch.relu(margin - pos + negs).mean() if len(negs) else pos * 0
    raise AssertionError(kind)


def _make_model(name, norm, loss="softmax_ce", num_negatives=-1, num_chunks=1, degree_fraction=0.0,
                reg_weight=0.0, regularizer="n3", dim=DIM):
    config = Config()
    config.model.decoder = name
    config.model.norm = norm
    config.model.dim = dim
    config.model.loss = loss
    config.model.dropout = 0.0
    config.model.reg_weight = reg_weight
    config.model.regularizer = regularizer
    config.training.device = "cpu"
    config.training.num_negatives = num_negatives
    config.training.num_chunks = num_chunks
    config.training.degree_fraction = degree_fraction
    config.training.batch_size = len(EDGES)
    config.training.lr = LR
    config.training.relation_lr = RELATION_LR
    config.training.relation_optimizer = "adagrad"
    validate(config)
    torch.manual_seed(0)
    # build in float64 so that the relation optimizer's eagerly created state is float64 too
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        model = StepModel(config, NUM_NODES, NUM_RELATIONS, torch.device("cpu"))
    finally:
        torch.set_default_dtype(previous)
    assert model.decoder.relations.dtype == torch.float64
    if dim == DIM:
        with torch.no_grad():
            model.decoder.relations.copy_(
                t64(relation_table(name)).reshape(2 * NUM_RELATIONS, -1))
    return model


def _node_tables(seed=3, dim=DIM):
    g = torch.Generator().manual_seed(seed)
    nodes = torch.randn(NUM_NODES, dim, generator=g, dtype=torch.float64)
    state = torch.rand(NUM_NODES, dim, generator=g, dtype=torch.float64) * 0.5
    return nodes, state


def _expected_update(name, norm, loss_kind, nodes, relations, state, tail_neg, head_neg,
                     chunk_of, reg_weight=0.0, margin=1.0):
    """Dense autograd of the textbook loss; returns (loss, node grad, relation grad)."""
    E = nodes.clone().requires_grad_(True)
    R = relations.clone().requires_grad_(True)
    total = E.new_zeros(())
    for b, (h, r, t) in enumerate(EDGES):
        c = chunk_of(b)
        # tail corruption: op(h, r) vs candidate tails
        forward, inverse = (_dense_row(name, R, r, direction) for direction in (False, True))
        pos = _dense_score(name, norm, E[h], forward, E[t])
        negs = [_dense_score(name, norm, E[h], forward, E[n]) for n in tail_neg[c] if n != t]
        total = total + _dense_loss(loss_kind, pos, negs, margin)
        # head corruption: op(t, r_inv) vs candidate heads
        pos = _dense_score(name, norm, E[t], inverse, E[h])
        negs = [_dense_score(name, norm, E[t], inverse, E[n]) for n in head_neg[c] if n != h]
        total = total + _dense_loss(loss_kind, pos, negs, margin)
    loss = total / len(EDGES)
    if reg_weight:
        reg = sum(E[h].abs().pow(3).sum() + E[t].abs().pow(3).sum()
                  + R[r].abs().pow(3).sum() + R[r + NUM_RELATIONS].abs().pow(3).sum()
                  for h, r, t in EDGES)
        loss = loss + reg_weight * reg / len(EDGES)
    loss.backward()
    return loss.detach(), E.grad, R.grad


def _check_update(model, update, rows, loss, grad, rel_grad, relations_before, state):
    assert update.rows.tolist() == rows
    g = grad[rows]
    expected_delta = -LR * g / (torch.sqrt(state[rows] + g * g) + 1e-10)
    torch.testing.assert_close(update.loss.double(), loss, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(update.squared, g * g, rtol=1e-9, atol=1e-14)
    torch.testing.assert_close(update.delta, expected_delta, rtol=1e-9, atol=1e-14)
    untouched = [n for n in range(NUM_NODES) if n not in rows]
    assert torch.all(grad[untouched] == 0)
    if model.relation_optimizer is not None:
        # first Adagrad step: r - lr * g / (sqrt(g^2) + eps) ~ r - lr * sign(g). Gradients that
        # cancel to exactly 0 in exact arithmetic come out ~1e-16, which this step turns into
        # moves of up to lr * 1e-16 / 1e-10; hence atol = 1e-7 (real moves are ~lr = 0.05).
        torch.testing.assert_close(model.decoder.relations.grad, rel_grad, rtol=1e-9, atol=1e-12)
        expected_rel = relations_before - RELATION_LR * rel_grad / (torch.sqrt(rel_grad * rel_grad) + 1e-10)
        torch.testing.assert_close(model.decoder.relations.detach(), expected_rel, rtol=1e-9, atol=1e-7)


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_compute_batch_all_nodes_softmax_matches_dense_autograd(case):
    name, norm = case
    model = _make_model(name, norm)
    nodes, state = _node_tables()
    relations_before = model.decoder.relations.detach().clone()
    update = model.compute_batch(nodes, state, torch.tensor(EDGES), torch.Generator().manual_seed(0))
    everything = [list(range(NUM_NODES))]
    loss, grad, rel_grad = _expected_update(name, norm, "softmax_ce", nodes, relations_before, state,
                                            everything, everything, chunk_of=lambda b: 0)
    _check_update(model, update, list(range(NUM_NODES)), loss, grad, rel_grad, relations_before, state)
    # compute_batch must not modify the node tables itself (apply does)
    nodes2, state2 = _node_tables()
    assert torch.equal(nodes, nodes2) and torch.equal(state, state2)


@pytest.mark.parametrize("loss_kind", ["softmax_ce", "logistic", "margin"])
def test_compute_batch_sampled_chunks_matches_dense_autograd(loss_kind):
    """5 edges, 2 chunks (3 + 2 padded), 3 shared negatives per chunk, half degree-based."""
    name, norm = "distmult", 1
    model = _make_model(name, norm, loss=loss_kind, num_negatives=3, num_chunks=2, degree_fraction=0.5)
    nodes, state = _node_tables(seed=5)
    relations_before = model.decoder.relations.detach().clone()
    edges = torch.tensor(EDGES)
    generator = torch.Generator().manual_seed(11)
    # the negatives compute_batch will draw: same generator state, tails first then heads
    replay = torch.Generator()
    replay.set_state(generator.get_state())
    endpoints = torch.cat([edges[:, 0], edges[:, 2]])
    tail_neg = sample_negatives(endpoints, NUM_NODES, 2, 3, 0.5, replay).tolist()
    head_neg = sample_negatives(endpoints, NUM_NODES, 2, 3, 0.5, replay).tolist()
    update = model.compute_batch(nodes, state, edges, generator)
    loss, grad, rel_grad = _expected_update(name, norm, loss_kind, nodes, relations_before, state,
                                            tail_neg, head_neg, chunk_of=lambda b: b // 3,
                                            margin=model.config.model.margin)
    rows = sorted({n for e in EDGES for n in (e[0], e[2])} | {n for c in tail_neg + head_neg for n in c})
    _check_update(model, update, rows, loss, grad, rel_grad, relations_before, state)


def test_compute_batch_n3_regularization_matches_dense_autograd():
    name, norm = "distmult", 1
    model = _make_model(name, norm, reg_weight=0.01, regularizer="n3")
    nodes, state = _node_tables(seed=8)
    relations_before = model.decoder.relations.detach().clone()
    update = model.compute_batch(nodes, state, torch.tensor(EDGES), torch.Generator().manual_seed(0))
    everything = [list(range(NUM_NODES))]
    loss, grad, rel_grad = _expected_update(name, norm, "softmax_ce", nodes, relations_before, state,
                                            everything, everything, chunk_of=lambda b: 0, reg_weight=0.01)
    _check_update(model, update, list(range(NUM_NODES)), loss, grad, rel_grad, relations_before, state)


@pytest.mark.parametrize("dim", [2, 4, 6])
def test_compute_batch_rotate_with_n3_runs_for_every_valid_dim(dim):
    """config_validation.validate accepts any even dim for rotate; N3 must not crash on the phase table.

    RotatE relations are dim/2 phases. compute_batch passes them to regularization()
    with complex_valued=True, which splits them into [re | im] halves: dim=2 gives a
    single phase column and chunk(2) yields one piece (ValueError); dim=6 gives 3
    columns split 2 + 1, silently broadcast.
    """
    model = _make_model("rotate", 1, reg_weight=0.01, regularizer="n3", dim=dim)
    nodes, state = _node_tables(seed=2, dim=dim)
    update = model.compute_batch(nodes, state, torch.tensor(EDGES), torch.Generator().manual_seed(0))
    assert torch.isfinite(update.loss)
    assert update.delta.shape == (NUM_NODES, dim)


# ---------------------------------------------------------------------------
# Relation prediction (Chen et al., AKBC 2021)
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["distmult", "complex"])
def test_relation_features_give_every_relations_score(name):
    """<phi(h, t), r> is the decoder's own score of (h, r, t), for every relation row."""
    torch.manual_seed(0)
    decoder = build_decoder(name, 3, 6, 1.0).double()
    heads, tails = torch.randn(5, 6, dtype=torch.float64), torch.randn(5, 6, dtype=torch.float64)
    features = decoder.relation_features(heads, tails)
    for r in range(6):  # forward and inverse rows
        expected = decoder.compare_pairs(decoder.operator(heads, decoder.relations[r].expand(5, -1)), tails)
        torch.testing.assert_close(features @ decoder.relations[r], expected)


def test_relation_prediction_is_a_softmax_over_all_relation_rows():
    """Against an explicit loop: -log softmax of the edge's relation among the 2R rows, both directions."""
    config = validate(Config())
    config.model.decoder, config.model.dim, config.training.relation_prediction = "complex", 6, 0.5
    torch.manual_seed(1)
    model = StepModel(config, 10, 4, torch.device("cpu"))
    model.decoder.double()
    heads, tails = torch.randn(7, 6, dtype=torch.float64), torch.randn(7, 6, dtype=torch.float64)
    relation_ids = torch.tensor([0, 3, 1, 1, 2, 0, 3])
    decoder = model.decoder
    with torch.no_grad():
        expected = _explicit_relation_loss(decoder, heads, tails, relation_ids)
    got = model.relation_prediction_loss(heads, tails, relation_ids)
    assert float(got.detach()) == pytest.approx(expected / 7, rel=1e-10)
    got.backward()
    assert decoder.relations.grad is not None and decoder.relations.grad.abs().sum() > 0


def _explicit_relation_loss(decoder, heads, tails, relation_ids) -> float:
    total = 0.0
    for b in range(len(relation_ids)):
        for h, t, target in ((heads[b], tails[b], relation_ids[b]),
                             (tails[b], heads[b], relation_ids[b] + decoder.num_relations)):
            scores = torch.stack([decoder.compare_pairs(decoder.operator(h, decoder.relations[r]), t)
                                  for r in range(len(decoder.relations))])
            total += float(torch.logsumexp(scores, 0) - scores[target])
    return total


def test_batch_loss_adds_the_weighted_relation_objective():
    torch.manual_seed(2)
    losses = {}
    for weight in (0.0, 0.25):
        model = _make_model("complex", 1)
        model.config.training.relation_prediction = weight
        plan = model.plan_batch(torch.tensor(EDGES), torch.Generator().manual_seed(0))
        embeddings = torch.randn(len(plan.rows), DIM, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
        losses[weight] = model.batch_loss(plan, embeddings, torch.Generator())
        if weight:
            heads, tails = embeddings[plan.local[:len(EDGES)]], embeddings[plan.local[len(EDGES):2 * len(EDGES)]]
            extra = model.relation_prediction_loss(heads, tails, torch.tensor(EDGES)[:, 1])
    torch.testing.assert_close(losses[0.25], losses[0.0] + 0.25 * extra)


@pytest.mark.parametrize(("overrides", "message"), [
    ({"decoder": "transe"}, "linear in the relation vector"), ({"weight": -1.0}, "expected >= 0")])
def test_relation_prediction_bad_config_is_refused(overrides, message):
    config = Config()
    config.model.decoder = overrides.get("decoder", "complex")
    config.training.relation_prediction = overrides.get("weight", 0.1)
    with pytest.raises(MariusInputError, match=f"training.relation_prediction.*{message}"):
        validate(config)


@pytest.mark.parametrize("decoder, transe_norm, rotate_norm, norm", [("transe", 2, 1, 2), ("rotate", 1, 2, 2),
                                                                      ("rotate", 2, 1, 1), ("complex", 2, 2, 1)])
def test_a_config_written_before_model_norm_keeps_its_decoders_norm(tmp_path, decoder, transe_norm, rotate_norm,
                                                                    norm):
    """Runs wrote model.transe_norm and model.rotate_norm in their config.yaml: a resume reads the decoder's
    own as model.norm (the other never applied), warning that the names go."""
    from marius_py.config import dump_config
    from marius_py.config_loading import load_config
    path = tmp_path / "config.yaml"
    path.write_text(f"model:\n  decoder: {decoder}\n  transe_norm: {transe_norm}\n  rotate_norm: {rotate_norm}\n")
    with pytest.warns(FutureWarning, match="model.rotate_norm and model.transe_norm are now model.norm"):
        config = load_config(path)
    assert config.model.norm == norm
    assert "transe_norm" not in dump_config(config) and "norm: " in dump_config(config)


@pytest.mark.parametrize("yaml_model, overrides, norm", [
    ("decoder: transe\n  transe_norm: 2\n  rotate_norm: 1", ["model.decoder=rotate"], 1),  # the final decoder's
    ("transe_norm: 2", ["model.decoder=transe"], 2),
    ("decoder: transe\n  transe_norm: 2", ["model.norm=1"], 1),            # model.norm later: it wins
    ("decoder: transe\n  norm: 1", ["model.transe_norm=2"], 2),            # the old key later: it wins
    ("decoder: rotate", ["model.rotate_norm=2", "model.transe_norm=1"], 2),
    ("decoder: transe", ["model.rotate_norm=2"], 1),                        # another decoder's: never applied
])
def test_the_final_decoders_old_norm_counts_unless_model_norm_comes_later(tmp_path, yaml_model, overrides, norm):
    from marius_py.config_loading import load_config
    path = tmp_path / "config.yaml"
    path.write_text(f"model:\n  {yaml_model}\n")
    with pytest.warns(FutureWarning, match="now model.norm"):
        assert load_config(path, overrides).model.norm == norm


def test_an_old_norm_out_of_range_is_named_as_model_norm():
    from marius_py.config_loading import load_config
    with pytest.raises(MariusInputError, match="model.norm: expected 1 or 2, got 3"), \
            pytest.warns(FutureWarning, match="model.transe_norm is now model.norm"):
        load_config(None, ["model.decoder=transe", "model.transe_norm=3"])
