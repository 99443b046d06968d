"""Decoders (operator + comparator, or a score function), losses and regularisers, each by name in a live
registry (``DECODERS``, ``LOSSES``, ``REGULARIZERS``; ``mp.DECODERS`` and so on) that research code
registers its own into.

A decoder scores an edge (h, r, t) as ``comparator(operator(h, r), t)``. Every
relation has two parameter vectors: one to corrupt tails (query ``op(h, r)``
against candidate tails) and an inverse one to corrupt heads (query
``op(t, r_inv)`` against candidate heads), so both directions are trained and
ranked with the same code. Node embeddings are not parameters of this module:
they live in the embedding store and arrive as plain tensors.

A plug-in decoder in plain PyTorch needs no more than a score over broadcast vectors:

    @mp.DECODERS.register("my_distmult")
    class MyDistMult(mp.Decoder):
        def score_hrt(self, h, r, t):
            return (h * r * t).sum(-1)

Both directions are scored by it: tails as ``score_hrt(h, r, t)``, heads as ``score_hrt(t, r_inv, h)``.
A loss is ``loss(positive [B], negative [B, N], valid [B, N], margin) -> [B]`` (per edge), a regulariser
``regularizer(tensors, complex_valued) -> scalar`` (summed over the rows of the batch's embeddings; the step
divides by the batch and weighs it by model.reg_weight).
"""

from __future__ import annotations

import inspect
import math

import torch
from torch import nn
from torch.nn import functional as F

from marius_py.errors import MariusInputError
from marius_py.registry import Registry, check_function, where_defined

# Elements of one broadcast [M, N, d] block for comparators without a matmul form and score functions: on a
# CPU, few enough for glibc to reuse heap memory instead of mapping fresh pages for every block (steps of the
# score form and TransE-L1 3-4x faster than at 2^24); on a GPU, 2^24 (fewer launches).
_BROADCAST_BLOCK = 1 << 21
_DEVICE_BROADCAST_BLOCK = 1 << 24


class Decoder(nn.Module):
    """Base class of every decoder. A subclass defines either ``score_hrt(h, r, t)`` alone (queries then carry
    the node and relation vectors side by side and candidates are scored by broadcasting, in blocks), or
    ``operator`` with ``compare_pairs`` and ``compare_all`` (a comparator base such as
    ``DotProductComparator`` gives the last two, scoring candidates on matmuls). Its constructor takes
    ``(num_relations, dim, init_scale)``.

    What it can do is declared by class attributes, which validation, the plan and the step read (never its
    name): ``complex_valued``, ``dim_multiple``, ``supports_relation_prediction``, ``regularize_relations``,
    and ``edge_operator``/``comparator`` (what the fused step computes for it, read by
    ``step/edge_kernels.py``; a plug-in leaves them, and trains on autograd)."""

    name = ""
    complex_valued = False       # rows are [re | im] complex vectors: model.dim even, N3 on their moduli
    dim_multiple = 1             # model.dim must be a multiple of this (SimplE: 2, its two halves)
    supports_relation_prediction = False  # the score is linear in one relation row: relation_features gives phi
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

    @classmethod
    def dim_step(cls) -> int:
        """What model.dim must be a multiple of: ``dim_multiple``, and 2 for complex-valued rows."""
        return math.lcm(cls.dim_multiple, 2 if cls.complex_valued else 1)

    def score_hrt(self, heads: torch.Tensor, relations: torch.Tensor, tails: torch.Tensor) -> torch.Tensor:
        """Scores of broadcast node and relation vectors [..., d] -> [...] (the simple form of a decoder)."""
        raise NotImplementedError(f"{type(self).__name__} defines operator and its comparator, not score_hrt")

    def operator(self, nodes: torch.Tensor, relations: torch.Tensor) -> torch.Tensor:
        """The query of ``nodes`` under ``relations``; for ``score_hrt``, both side by side."""
        return torch.cat([nodes, relations], dim=-1)

    def compare_pairs(self, queries: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Score of each query against its own target: [B, d] x [B, d] -> [B]."""
        nodes, relations = self._query_parts(queries)
        return self.score_hrt(nodes, relations, targets)

    def compare_all(self, queries: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
        """Every query of a chunk against the chunk's candidates: [C, M, d] x [C, N, d] -> [C, M, N]."""
        nodes, relations = self._query_parts(queries)
        return _blocked_pairs(nodes, candidates, lambda block: self.score_hrt(
            nodes[:, :, None, :], relations[:, :, None, :], block[:, None, :, :]))

    def _query_parts(self, queries: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(node, relation) vectors of ``operator``'s default queries."""
        return queries[..., :self.dim], queries[..., self.dim:]

    def relation_features(self, heads: torch.Tensor, tails: torch.Tensor) -> torch.Tensor:
        """phi(h, t) with score(h, r, t) = <phi(h, t), r> for every relation vector r (decoders that declare
        ``supports_relation_prediction``)."""
        raise NotImplementedError(f"{type(self).__name__} scores are not linear in the relation vector")

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
    supports_relation_prediction = True

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
    supports_relation_prediction = True
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


class SimplE(DotProductComparator):
    """score = 1/2 (<h_H, r, t_T> + <t_H, r', h_T>) (Kazemi & Poole 2018, as PyKEEN defines it).

    Each node's vector holds its two embeddings as halves [head role | tail role]; relation k's forward row
    is r and its inverse row r' (d/2 each). The score is linear in either node, so both directions are a
    query against candidates on matmuls: op(x, [a | b]) = 1/2 [b * x_T | a * x_H] with [r | r'] for tail
    queries and [r' | r] for head queries, which give the same score.
    """

    name = "simple"
    dim_multiple = 2

    def relation_dim(self, dim):
        return dim // 2

    def relation_vectors(self, relation_ids, inverse):
        forward, backward = (torch.index_select(self.relations, 0, relation_ids + offset)
                             for offset in (0, self.num_relations))
        return torch.cat([backward, forward] if inverse else [forward, backward], dim=-1)

    def operator(self, nodes, relations):
        own, other = relations.chunk(2, dim=-1)
        head_role, tail_role = nodes.chunk(2, dim=-1)
        return 0.5 * torch.cat([other * tail_role, own * head_role], dim=-1)


def _blocked_pairwise(queries: torch.Tensor, candidates: torch.Tensor, distance) -> torch.Tensor:
    """distance(q - c) for every (q, c) pair of each chunk, in bounded-memory blocks."""
    return _blocked_pairs(queries, candidates, lambda block: distance(queries[:, :, None, :] - block[:, None, :, :]))


def _blocked_pairs(queries: torch.Tensor, candidates: torch.Tensor, pair_scores) -> torch.Tensor:
    """``pair_scores(block)`` -> [C, M, n] for blocks [C, n, d] of the candidates, sized so that one broadcast
    [C, M, n, d] block stays within ``_BROADCAST_BLOCK`` elements, concatenated."""
    c, m, d = queries.shape
    block = max(1, (_DEVICE_BROADCAST_BLOCK if queries.is_cuda else _BROADCAST_BLOCK) // max(1, c * m * d))
    parts = [pair_scores(candidates[:, start:start + block, :]) for start in range(0, candidates.shape[1], block)]
    return torch.cat(parts, dim=2)


_QUERY_FORM = ("operator", "compare_pairs", "compare_all")


def _check_decoder(name: str, cls) -> None:
    """A plug-in decoder: a ``Decoder`` subclass giving one of the two forms, whose declarations hold."""
    what = f"decoder {name!r} ({where_defined(cls)})"
    forms = "score_hrt(h, r, t) alone, or operator with compare_pairs and compare_all"
    if not (isinstance(cls, type) and issubclass(cls, Decoder)):
        raise MariusInputError(f"{what} is not a subclass of marius_py.models.Decoder",
                               expected=f"class MyDecoder(mp.Decoder) defining {forms}")
    given = {method for method in (*_QUERY_FORM, "score_hrt") if getattr(cls, method) is not getattr(Decoder, method)}
    partial = [method for method in _QUERY_FORM if method not in given]
    if len(partial) == len(_QUERY_FORM) and "score_hrt" not in given:
        raise MariusInputError(f"{what} defines neither score_hrt nor operator, compare_pairs and compare_all",
                               expected=forms)
    if 0 < len(partial) < len(_QUERY_FORM):
        raise MariusInputError(f"{what} defines {', '.join(m for m in _QUERY_FORM if m in given)} but not "
                               f"{', '.join(partial)}", expected=f"{forms} (a comparator base such as "
                                                                 "DotProductComparator gives the last two)")
    if cls.supports_relation_prediction and cls.relation_features is Decoder.relation_features:
        raise MariusInputError(f"{what} declares supports_relation_prediction but does not define "
                               "relation_features", expected="relation_features(heads, tails), or the "
                                                             "declaration off")
    if not (isinstance(cls.dim_multiple, int) and cls.dim_multiple >= 1):
        raise MariusInputError(f"{what}: dim_multiple is {cls.dim_multiple!r}", expected="an int >= 1")
    try:
        inspect.signature(cls).bind(1, 2, 0.1)
    except TypeError:
        raise MariusInputError(f"{what}: its constructor does not take (num_relations, dim, init_scale)",
                               expected="__init__(self, num_relations, dim, init_scale), or none of its own") \
            from None


DECODERS: Registry[type[Decoder]] = Registry("decoder", "mp.DECODERS", check=_check_decoder,
                                             loaded_by="model.plugins")
for _cls in (Dot, DistMult, ComplEx, TransE, RotatE, SimplE):
    DECODERS.register(_cls.name, _cls)


def build_decoder(name: str, num_relations: int, dim: int, init_scale: float, norm: int = 1) -> Decoder:
    """The registered decoder ``name``; ``norm``: the distance norm of distance decoders (TransE, RotatE)."""
    cls = DECODERS.get(name, "model.decoder")
    if issubclass(cls, DistanceComparator):
        return cls(num_relations, dim, init_scale, norm=norm)
    return cls(num_relations, dim, init_scale)


# ---- losses: positive scores [B], negative scores [B, N], valid mask [B, N] -> per-edge [B] ----
# ``fused_kernel``: the engine's kernels compute this loss (the shared-negative softmax, the fused step); a
# loss without it is computed from its scores on autograd.

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


softmax_cross_entropy.fused_kernel = "softmax_ce"

_LOSS_PARAMETERS = ("positive", "negative", "valid", "margin")


def _check_loss(name: str, loss) -> None:
    probe = (torch.zeros(2), torch.zeros(2, 3), torch.ones(2, 3, dtype=torch.bool), 1.0)
    check_function("loss", name, loss, _LOSS_PARAMETERS, probe,
                   lambda out: isinstance(out, torch.Tensor) and tuple(out.shape) == (2,),
                   "a tensor of one loss per edge, [B] for positive scores [B]")


LOSSES: Registry = Registry("loss", "mp.LOSSES", check=_check_loss, loaded_by="model.plugins")
LOSSES.register("softmax_ce", softmax_cross_entropy)
LOSSES.register("logistic", logistic)
LOSSES.register("margin", margin_ranking)


# ---- regularisers: the batch's embeddings (nodes, and relation rows where vectors) -> their summed penalty ----
# ``fused_kernel``: the fused step computes this regulariser under its name.

def no_regularizer(tensors: list[torch.Tensor], complex_valued: bool) -> torch.Tensor:
    return tensors[0].new_zeros(())


def n3(tensors: list[torch.Tensor], complex_valued: bool) -> torch.Tensor:
    """N3 (Lacroix et al. 2018): sum of |x|^3; of complex rows, the moduli of their coordinates."""
    total = tensors[0].new_zeros(())
    for x in tensors:
        if complex_valued:
            re, im = x.chunk(2, dim=-1)
            total = total + (re * re + im * im).pow(1.5).sum()
        else:
            total = total + x.abs().pow(3).sum()
    return total


def l2(tensors: list[torch.Tensor], complex_valued: bool) -> torch.Tensor:
    """Squared L2: sum of x^2."""
    return sum(((x * x).sum() for x in tensors), tensors[0].new_zeros(()))


def _check_regularizer(name: str, regularizer) -> None:
    check_function("regulariser", name, regularizer, ("tensors", "complex_valued"), ([torch.ones(2, 4)], False),
                   lambda out: isinstance(out, torch.Tensor) and out.dim() == 0,
                   "a scalar tensor, the penalty summed over the rows")


REGULARIZERS: Registry = Registry("regulariser", "mp.REGULARIZERS", check=_check_regularizer,
                                  loaded_by="model.plugins")
for _name, _regularizer in (("none", no_regularizer), ("n3", n3), ("l2", l2)):
    _regularizer.fused_kernel = _name
    REGULARIZERS.register(_name, _regularizer)


def regularization(kind: str, tensors: list[torch.Tensor], complex_valued: bool,
                   batch_size: int) -> torch.Tensor:
    """The registered regulariser ``kind`` of the batch's embeddings, per edge."""
    return REGULARIZERS.get(kind, "model.regularizer")(tensors, complex_valued) / batch_size
