"""Decoders (operator + comparator), losses and regularisers.

A decoder scores an edge (h, r, t) as ``comparator(operator(h, r), t)``. Every
relation has two parameter vectors: one to corrupt tails (query ``op(h, r)``
against candidate tails) and an inverse one to corrupt heads (query
``op(t, r_inv)`` against candidate heads), so both directions are trained and
ranked with the same code. Node embeddings are not parameters of this module:
they live in the embedding store and arrive as plain tensors.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

# Elements of one broadcast [M, N, d] block for comparators without a matmul form.
_BROADCAST_BLOCK = 1 << 24


class Decoder(nn.Module):
    """Base class; subclasses define ``operator`` and ``compare_pairs``/``compare_all``, and declare what the
    fused step computes for them (``edge_operator`` and ``comparator``, read by ``step/edge_kernels.py``)."""

    name = ""
    complex_valued = False
    regularize_relations = True  # False where relation parameters are not vectors (RotatE phases)
    edge_operator: str | None = None  # the fused step's operator (identity, diagonal, complex, translation,
                                      # rotation); None: no fused step
    comparator = "dot"                # how queries meet targets: dot, l2, l1 or modulus

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "edge_operator" not in cls.__dict__:  # a subclass declares its own fused maths, or has none
            cls.edge_operator = None

    def __init__(self, num_relations: int, dim: int, init_scale: float):
        super().__init__()
        self.dim = dim
        rel_dim = self.relation_dim(dim)
        self.relations = nn.Parameter(self.init_relations(2 * num_relations, rel_dim, init_scale))
        self.num_relations = num_relations

    def relation_dim(self, dim: int) -> int:
        return dim

    def init_relations(self, rows: int, rel_dim: int, init_scale: float) -> torch.Tensor:
        return torch.randn(rows, rel_dim) * init_scale

    def relation_vectors(self, relation_ids: torch.Tensor, inverse: bool) -> torch.Tensor:
        """Rows of the relation table: forward ids, or inverse ids offset by R.

        ``index_select`` rather than indexing: its gradient is an atomic
        ``index_add_``, where indexing's sorts and adds each id's run serially
        (slow on a GPU when thousands of edges share a relation).
        """
        return torch.index_select(self.relations, 0, relation_ids + (self.num_relations if inverse else 0))

    def operator(self, nodes: torch.Tensor, relations: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def compare_pairs(self, queries: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Score of each query against its own target: [B, d] x [B, d] -> [B]."""
        raise NotImplementedError

    def compare_all(self, queries: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
        """Every query of a chunk against the chunk's candidates: [C, M, d] x [C, N, d] -> [C, M, N]."""
        raise NotImplementedError

    def relation_features(self, heads: torch.Tensor, tails: torch.Tensor) -> torch.Tensor:
        """phi(h, t) with score(h, r, t) = <phi(h, t), r> for every relation vector r (decoders linear in r)."""
        raise NotImplementedError(f"{self.name} scores are not linear in the relation vector")

    def query(self, nodes: torch.Tensor, relation_ids: torch.Tensor, inverse: bool) -> torch.Tensor:
        return self.operator(nodes, self.relation_vectors(relation_ids, inverse))

    def score(self, heads: torch.Tensor, relation_ids: torch.Tensor, tails: torch.Tensor) -> torch.Tensor:
        """Score of edges (h, r, t) given node embeddings [B, d] and relation ids [B]."""
        return self.compare_pairs(self.query(heads, relation_ids, inverse=False), tails)


class DotProductComparator(Decoder):
    """Comparator <q, t>: candidate scoring is one batched matmul."""

    def compare_pairs(self, queries, targets):
        return (queries * targets).sum(-1)

    def compare_all(self, queries, candidates):
        return torch.bmm(queries, candidates.transpose(1, 2))


class Dot(DotProductComparator):
    """Plain graphs: score = <h, t>; the relation is ignored."""

    name = "dot"
    edge_operator = "identity"

    def relation_dim(self, dim):
        return 0

    def operator(self, nodes, relations):
        return nodes


class DistMult(DotProductComparator):
    """score = <h * r, t> (Yang et al. 2015)."""

    name = "distmult"
    edge_operator = "diagonal"

    def operator(self, nodes, relations):
        return nodes * relations

    def relation_features(self, heads, tails):
        return heads * tails


def complex_product(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Elementwise complex product of [.., re | im] halves."""
    a_re, a_im = a.chunk(2, dim=-1)
    b_re, b_im = b.chunk(2, dim=-1)
    return torch.cat([a_re * b_re - a_im * b_im, a_re * b_im + a_im * b_re], dim=-1)


class ComplEx(DotProductComparator):
    """score = Re(<h * r, conj(t)>) (Trouillon et al. 2016).

    Embeddings are stored as [re | im]. With q = h * r (complex product),
    Re(<q, conj(t)>) = <q_re, t_re> + <q_im, t_im>: a plain dot product of the
    stored halves, so candidate scoring is the same batched matmul as DistMult.
    """

    name = "complex"
    complex_valued = True
    edge_operator = "complex"

    def operator(self, nodes, relations):
        return complex_product(nodes, relations)

    def relation_features(self, heads, tails):
        """Re(<h * r, conj(t)>) = <r_re, h_re t_re + h_im t_im> + <r_im, h_re t_im - h_im t_re>."""
        h_re, h_im = heads.chunk(2, dim=-1)
        t_re, t_im = tails.chunk(2, dim=-1)
        return torch.cat([h_re * t_re + h_im * t_im, h_re * t_im - h_im * t_re], dim=-1)


class DistanceComparator(Decoder):
    """Comparator -||q - t||_p, p (``norm``) 1 or 2; 2 has a matmul form (|q|^2 + |t|^2 - 2 q.t)."""

    norm_1_comparator = "l1"  # (RotatE's norm 1 is the sum of complex moduli)

    def __init__(self, num_relations, dim, init_scale, norm: int = 1):
        super().__init__(num_relations, dim, init_scale)
        self.norm = norm

    @property
    def comparator(self) -> str:
        return "l2" if self.norm == 2 else self.norm_1_comparator

    def compare_pairs(self, queries, targets):
        return -self.distance(queries - targets)

    def distance(self, difference: torch.Tensor) -> torch.Tensor:
        return torch.linalg.vector_norm(difference, ord=self.norm, dim=-1)

    def compare_all(self, queries, candidates):
        if self.norm == 2:
            return -torch.cdist(queries, candidates, p=2.0)
        return -_blocked_pairwise(queries, candidates, self.distance)


class TransE(DistanceComparator):
    """score = -||h + r - t||_p (Bordes et al. 2013), p = 1 or 2."""

    name = "transe"
    edge_operator = "translation"

    def operator(self, nodes, relations):
        return nodes + relations


class RotatE(DistanceComparator):
    """score = -||h * r - t|| with |r_k| = 1 (Sun et al. 2019).

    Relations are phases (dim/2 per relation). With norm 1 the distance is the
    sum of the complex moduli of the difference, as Sun et al. define it; with
    norm 2 it is the L2 norm of the difference (the square root of the sum of
    the squared moduli), as PyKEEN's RotatE does, which expands into dot
    products like TransE-L2 and so scores on matmuls.
    """

    name = "rotate"
    complex_valued = True
    regularize_relations = False
    edge_operator = "rotation"
    norm_1_comparator = "modulus"

    def relation_dim(self, dim):
        return dim // 2

    def init_relations(self, rows, rel_dim, init_scale):
        return (torch.rand(rows, rel_dim) * 2 - 1) * math.pi

    def operator(self, nodes, relations):
        rotation = torch.cat([torch.cos(relations), torch.sin(relations)], dim=-1)
        return complex_product(nodes, rotation)

    def distance(self, difference):
        if self.norm == 2:
            return super().distance(difference)
        re, im = difference.chunk(2, dim=-1)
        return torch.sqrt(re * re + im * im + 1e-12).sum(-1)


def _blocked_pairwise(queries: torch.Tensor, candidates: torch.Tensor, distance) -> torch.Tensor:
    """distance(q - c) for every (q, c) pair of each chunk, in bounded-memory blocks."""
    c, m, d = queries.shape
    block = max(1, _BROADCAST_BLOCK // max(1, c * m * d))
    parts = [distance(queries[:, :, None, :] - candidates[:, None, start:start + block, :])
             for start in range(0, candidates.shape[1], block)]
    return torch.cat(parts, dim=2)


DECODER_CLASSES = {cls.name: cls for cls in (Dot, DistMult, ComplEx, TransE, RotatE)}


def build_decoder(name: str, num_relations: int, dim: int, init_scale: float, norm: int = 1) -> Decoder:
    """The decoder ``name``; ``norm``: the distance norm of distance decoders (TransE, RotatE)."""
    try:
        cls = DECODER_CLASSES[name]
    except KeyError:  # the CLI checks names in config.validate; this guards library callers
        raise ValueError(f"unknown decoder {name!r}; known: {', '.join(DECODER_CLASSES)}") from None
    if issubclass(cls, DistanceComparator):
        return cls(num_relations, dim, init_scale, norm=norm)
    return cls(num_relations, dim, init_scale)


# ---- losses: positive scores [B], negative scores [B, N], valid mask [B, N] -> per-edge [B] ----

def softmax_cross_entropy(positive, negative, valid, margin=None):
    """-log softmax of the positive among itself and its (unmasked) negatives."""
    logits = torch.cat([positive[:, None], negative.masked_fill(~valid, float("-inf"))], dim=1)
    return torch.logsumexp(logits, dim=1) - positive


def _masked_row_mean(values, valid):
    return (values * valid).sum(1) / valid.sum(1).clamp_min(1)


def logistic(positive, negative, valid, margin=None):
    """Binary cross-entropy: positives towards 1, negatives towards 0 (mean over negatives)."""
    return F.softplus(-positive) + _masked_row_mean(F.softplus(negative), valid)


def margin_ranking(positive, negative, valid, margin=1.0):
    """max(0, margin - s(pos) + s(neg)), averaged over negatives."""
    return _masked_row_mean(F.relu(margin - positive[:, None] + negative), valid)


LOSSES = {"softmax_ce": softmax_cross_entropy, "logistic": logistic, "margin": margin_ranking}


def regularization(kind: str, tensors: list[torch.Tensor], complex_valued: bool,
                   batch_size: int) -> torch.Tensor:
    """N3 (Lacroix et al. 2018) or squared L2 of the batch's embeddings, per edge.

    For complex decoders N3 uses the modulus of each complex coordinate.
    """
    total = tensors[0].new_zeros(())
    for x in tensors:
        if kind == "n3":
            if complex_valued:
                re, im = x.chunk(2, dim=-1)
                total = total + (re * re + im * im).pow(1.5).sum()
            else:
                total = total + x.abs().pow(3).sum()
        elif kind == "l2":
            total = total + (x * x).sum()
    return total / batch_size
