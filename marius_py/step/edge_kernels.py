"""Per-edge maths of the fused step: queries, positive scores, regulariser, and their gradients.

For the dot-product decoders (Dot, DistMult, ComplEx) an edge (h, r, t) gives
two queries, q_t = op(h, r_fwd) and q_h = op(t, r_inv), optionally scaled by a
dropout mask; the positive scores are <q_t, t> and <q_h, h>, and every
negative score is the query against a candidate row (``fused_loss``). The
operator is the identity (Dot), elementwise (DistMult) or the complex product
of [re | im] halves (ComplEx), whose backward is dh = dq * conj(r),
dr = dq * conj(h). N3 (sum of |x|^3, or of the complex moduli cubed) and L2
regularise the batch's h, t and relation rows, as ``models.regularization``.

The distance decoders have the same structure with other parts: TransE's
operator is a translation (h + r), RotatE's a rotation by relation phases
(h * e^{i phi}, whose phase gradient is Im(conj(q) dq)); their positive
scores and candidates are compared by -||q - t|| (L2, L1, or RotatE's sum of
complex moduli; RotatE with norm 2 takes L2: ``EdgeMaths.comparator``).

``edge_queries`` computes the forward part, ``edge_backward_`` adds each
edge's gradients of h, t (into per-row gradients) and of its relation
vectors. Each has Triton kernels for float32 CUDA tables (a real form, and a
complex one over [re | im] halves for ComplEx and RotatE); the torch versions
(CPU, float64) are what the tests compare with autograd, and the GPU tests
compare the kernels with them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.nn import functional as F

from marius_py.models import complex_product, regularization
from marius_py.step.fused_loss import to_16_bytes
from marius_py.pipeline.row_kernels import tile_shape, triton, use_triton

if triton is not None:
    import triton.language as tl

    from marius_py.pipeline.row_kernels import load_rows

_OPERATOR_CODE = {"identity": 0, "diagonal": 1, "translation": 2}
_COMPARATOR_CODE = {"dot": 0, "l2": 1, "l1": 2, "modulus": 3}
_REGULARIZER_CODE = {"none": 0, "n3": 1, "l2": 2}
# Elements of one [edges, d] tile per program, for the query and the backward kernels (``_launch``). The
# backward kernels hold ~20 such tiles live; at 4096 they spilled registers: ComplEx with N3 took 1.25 ms
# (d=100) and 3.2 ms (d=400) for 50k edges against ~0.09 and 0.28 ms at 1024, where every operator moves
# ~2.8 TB/s on an H100 (bench/kernels.py --edge, docs/design.md). The query kernels were measured only within
# the step (bench/throughput.py --parts step).
EDGE_TILE = 1024


@dataclass(frozen=True)
class EdgeMaths:
    """What the fused step computes per edge besides the softmax: the operator and the regulariser."""

    operator: str                   # identity (Dot), diagonal (DistMult), complex (ComplEx), translation
                                    # (TransE), rotation (RotatE)
    regularizer: str = "none"       # none, n3, l2
    reg_relations: bool = False     # whether the relation rows are regularised too (not with identity
                                    # or rotation: RotatE's phases are not)
    comparator: str = "dot"         # dot, l2 (TransE, RotatE with norm 2), l1 (TransE), modulus (RotatE:
                                    # sum of complex moduli)

    @classmethod
    def of(cls, model) -> "EdgeMaths":
        m = model.config.model
        regularizer = m.regularizer if m.reg_weight > 0 else "none"
        decoder = model.decoder  # (each decoder class declares its operator and comparator: marius_py/models.py)
        return cls(decoder.edge_operator, regularizer,
                   decoder.edge_operator != "identity" and decoder.regularize_relations, decoder.comparator)

    @property
    def complex(self) -> bool:
        """ComplEx's complex product."""
        return self.operator == "complex"

    @property
    def complex_moduli(self) -> bool:
        """Rows are [re | im] complex vectors: N3 regularises the moduli."""
        return self.operator in ("complex", "rotation")


def edge_queries(nodes: torch.Tensor, relations: torch.Tensor | None, edges: torch.Tensor,
                 score_dtype: torch.dtype, width: int | None, maths: EdgeMaths,
                 mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """([2B, width] queries q_t of every edge then q_h, scaled by ``mask`` ([2B, d]) and zero beyond d;
    [2B] positive scores; the regulariser's sums, per edge (Triton) or in one (torch), or None).

    ``relations`` is [2R, d] (forward then inverse vectors) or None (Dot).
    """
    dim = nodes.shape[1]
    width = width or dim
    if use_triton(nodes):  # every decoder's per-edge part, on float32 CUDA tables
        return _edge_queries_triton(nodes, relations, edges, score_dtype, width, maths, mask)
    heads, tails = nodes[edges[:, 0]], nodes[edges[:, 2]]
    forward, inverse = _relation_rows(relations, edges[:, 1])
    queries = torch.cat([_operator(heads, forward, maths), _operator(tails, inverse, maths)])
    if mask is not None:
        queries = queries * mask
    positive = _pair_scores(queries, torch.cat([tails, heads]), maths)
    regularised = [heads, tails] + ([forward, inverse] if maths.reg_relations and forward is not None else [])
    reg = None if maths.regularizer == "none" else \
        regularization(maths.regularizer, regularised, maths.complex_moduli, 1).reshape(1)  # the batch's sum
    return F.pad(queries.to(score_dtype), (0, width - dim)), positive, reg


def edge_backward_(grad_rows: torch.Tensor, grad_relations: torch.Tensor | None, nodes: torch.Tensor,
                   relations: torch.Tensor | None, edges: torch.Tensor, local: torch.Tensor,
                   grad_queries: torch.Tensor, grad_positive: torch.Tensor, head_offset: int,
                   maths: EdgeMaths, mask: torch.Tensor | None = None,
                   reg_scale: float = 0.0) -> None:
    """Add each edge's gradients of h, t (into ``grad_rows`` at ``local``) and of its relation vectors.

    ``grad_queries``/``grad_positive`` hold the tail-corruption rows of the
    edges at [0, B) and the head-corruption rows at [head_offset, head_offset + B);
    ``grad_queries`` may be wider than d (aligned rows: the extra columns are
    ignored). ``reg_scale``: the regulariser's weight over the batch size.
    """
    batch, dim = len(edges), nodes.shape[1]
    if use_triton(nodes):  # every decoder's per-edge part, on float32 CUDA tables
        _edge_backward_triton(grad_rows, grad_relations, nodes, relations, edges, local, grad_queries,
                              grad_positive, head_offset, maths, mask, reg_scale)
        return
    heads, tails = nodes[edges[:, 0]], nodes[edges[:, 2]]
    forward, inverse = _relation_rows(relations, edges[:, 1])
    ones = torch.ones((), dtype=nodes.dtype, device=nodes.device)
    mask_tail, mask_head = (ones, ones) if mask is None else (mask[:batch], mask[batch:2 * batch])
    pos_tail = grad_positive[:batch, None].to(nodes.dtype)
    pos_head = grad_positive[head_offset:head_offset + batch, None].to(nodes.dtype)
    # the positive scores' gradients: d/d (dropped query) and d/d its target
    by_query_tail, by_target_tail = _pair_gradients(_operator(heads, forward, maths) * mask_tail, tails, maths)
    by_query_head, by_target_head = _pair_gradients(_operator(tails, inverse, maths) * mask_head, heads, maths)
    # d loss / d (dropped query): the softmax's part plus the positive score's
    grad_tail_q = (grad_queries[:batch, :dim].to(nodes.dtype) + pos_tail * by_query_tail) * mask_tail
    grad_head_q = (grad_queries[head_offset:head_offset + batch, :dim].to(nodes.dtype)
                   + pos_head * by_query_head) * mask_head
    grad_heads, grad_forward = _operator_backward(grad_tail_q, heads, forward, maths)
    grad_tails, grad_inverse = _operator_backward(grad_head_q, tails, inverse, maths)
    grad_heads = grad_heads + pos_head * by_target_head
    grad_tails = grad_tails + pos_tail * by_target_tail
    if maths.regularizer != "none":
        grad_heads = grad_heads + reg_scale * _reg_gradient(heads, maths)
        grad_tails = grad_tails + reg_scale * _reg_gradient(tails, maths)
        if maths.reg_relations and forward is not None:
            grad_forward = grad_forward + reg_scale * _reg_gradient(forward, maths)
            grad_inverse = grad_inverse + reg_scale * _reg_gradient(inverse, maths)
    if grad_relations is not None:
        grad_relations.index_add_(0, edges[:, 1], grad_forward)
        grad_relations.index_add_(0, edges[:, 1] + len(relations) // 2, grad_inverse)
    grad_rows.index_add_(0, local[:batch], grad_heads)
    grad_rows.index_add_(0, local[batch:2 * batch], grad_tails)


def relation_prediction_(grad_rows: torch.Tensor, grad_relations: torch.Tensor, nodes: torch.Tensor,
                         relations: torch.Tensor, edges: torch.Tensor, local: torch.Tensor, maths: EdgeMaths,
                         weight: float, features) -> torch.Tensor:
    """The relation-prediction objective (``StepModel.relation_prediction_loss``) times ``weight``: returns it and
    adds its gradients into ``grad_rows`` (at ``local``) and ``grad_relations``.

    Logits [2B, 2R] = phi @ relations^T with phi = ``features(h, t)``
    (``Decoder.relation_features``) for the tail direction and phi(t, h) for
    the head one; d logits = weight (softmax - onehot) / B. Torch operations
    (two small matmuls), on every device.
    """
    batch, count = len(edges), len(relations)
    heads, tails = nodes[edges[:, 0]], nodes[edges[:, 2]]
    phi = torch.cat([features(heads, tails), features(tails, heads)])
    # On CUDA, relations padded to whole 16-byte logit rows (cuBLAS's aligned kernels), their logits -inf.
    table = F.pad(relations.to(phi.dtype), (0, 0, 0, to_16_bytes(count, phi.dtype) if phi.is_cuda else 0))
    logits = phi @ table.T
    if len(table) > count:
        logits[:, count:] = float("-inf")
    targets = torch.cat([edges[:, 1], edges[:, 1] + count // 2])
    log_norm = torch.logsumexp(logits, 1)
    loss = (log_norm - logits.gather(1, targets[:, None]).squeeze(1)).sum() * (weight / batch)
    grad_logits = torch.softmax(logits, 1)
    grad_logits[torch.arange(2 * batch, device=logits.device), targets] -= 1
    grad_logits *= weight / batch
    grad_relations.add_((grad_logits.T @ phi)[:count].to(grad_relations.dtype))
    grad_features = grad_logits @ table
    grad_heads, grad_tails = _relation_features_backward(grad_features[:batch], heads, tails, maths)
    grad_tails_2, grad_heads_2 = _relation_features_backward(grad_features[batch:], tails, heads, maths)
    grad_rows.index_add_(0, local[:batch], (grad_heads + grad_heads_2).to(grad_rows.dtype))
    grad_rows.index_add_(0, local[batch:2 * batch], (grad_tails + grad_tails_2).to(grad_rows.dtype))
    return loss


def _relation_features_backward(grad: torch.Tensor, heads: torch.Tensor, tails: torch.Tensor, maths: EdgeMaths):
    """(d/d h, d/d t) of ``Decoder.relation_features`` given d/d phi (ComplEx's phi = conj(h) * t:
    conj(grad * conj(t)) and grad * h)."""
    if not maths.complex:
        return grad * tails, grad * heads
    return _conjugate(complex_product(grad, _conjugate(tails))), complex_product(grad, heads)


def _relation_rows(relations: torch.Tensor | None, relation_ids: torch.Tensor):
    if relations is None:
        return None, None
    return relations[relation_ids], relations[relation_ids + len(relations) // 2]


def _conjugate(x: torch.Tensor) -> torch.Tensor:
    real, imaginary = x.chunk(2, dim=-1)
    return torch.cat([real, -imaginary], dim=-1)


def _rotation(phases: torch.Tensor) -> torch.Tensor:
    return torch.cat([torch.cos(phases), torch.sin(phases)], dim=-1)


def _operator(nodes: torch.Tensor, relations: torch.Tensor | None, maths: EdgeMaths) -> torch.Tensor:
    if maths.operator == "identity":
        return nodes
    if maths.operator == "translation":
        return nodes + relations
    if maths.operator == "rotation":
        return complex_product(nodes, _rotation(relations))
    if maths.complex:
        return complex_product(nodes, relations)
    return nodes * relations


def _operator_backward(grad: torch.Tensor, nodes: torch.Tensor, relations: torch.Tensor | None, maths: EdgeMaths):
    """(d/d nodes, d/d relations) of ``_operator`` given d/d its output."""
    if maths.operator == "identity":
        return grad, None
    if maths.operator == "translation":
        return grad, grad
    if maths.operator == "rotation":  # q = h e^{i phi}: d q / d phi = i q, so d phi = Im(conj(q) dq) per coordinate
        rotation = _rotation(relations)
        q_re, q_im = complex_product(nodes, rotation).chunk(2, dim=-1)
        g_re, g_im = grad.chunk(2, dim=-1)
        return complex_product(grad, _conjugate(rotation)), g_im * q_re - g_re * q_im
    if maths.complex:
        return complex_product(grad, _conjugate(relations)), complex_product(grad, _conjugate(nodes))
    return grad * relations, grad * nodes


def _pair_scores(queries: torch.Tensor, targets: torch.Tensor, maths: EdgeMaths) -> torch.Tensor:
    """Each query's score against its own target (``Decoder.compare_pairs``)."""
    if maths.comparator == "dot":
        return (queries * targets).sum(-1)
    return -_distance(queries - targets, maths.comparator)


def _distance(difference: torch.Tensor, comparator: str) -> torch.Tensor:
    if comparator == "l2":
        return torch.linalg.vector_norm(difference, dim=-1)
    if comparator == "l1":
        return difference.abs().sum(-1)
    return _moduli(difference).sum(-1) / 2  # the moduli come twice, once per half


def _moduli(x: torch.Tensor) -> torch.Tensor:
    """Each complex coordinate's modulus, for both halves (RotatE's distance, with its 1e-12)."""
    real, imaginary = x.chunk(2, dim=-1)
    modulus = torch.sqrt(real * real + imaginary * imaginary + 1e-12)
    return torch.cat([modulus, modulus], dim=-1)


def _pair_gradients(queries: torch.Tensor, targets: torch.Tensor, maths: EdgeMaths):
    """(d score / d query, d score / d target) of ``_pair_scores`` (0 at distance 0, as autograd's norms)."""
    if maths.comparator == "dot":
        return targets, queries
    difference = queries - targets
    if maths.comparator == "l1":
        by_query = -torch.sign(difference)
    elif maths.comparator == "l2":
        norm = torch.linalg.vector_norm(difference, dim=-1, keepdim=True)
        by_query = -difference / torch.where(norm > 0, norm, torch.ones_like(norm))
    else:
        by_query = -difference / _moduli(difference)
    return by_query, -by_query


def _reg_gradient(x: torch.Tensor, maths: EdgeMaths) -> torch.Tensor:
    if maths.regularizer == "l2":
        return 2 * x
    if maths.complex_moduli:
        real, imaginary = x.chunk(2, dim=-1)
        modulus = torch.sqrt(real * real + imaginary * imaginary)
        return 3 * x * torch.cat([modulus, modulus], dim=-1)
    return 3 * x * x.abs()


# ---- Triton ----

def _edge_queries_triton(nodes, relations, edges, score_dtype, width, maths, mask):
    batch, dim = len(edges), nodes.shape[1]
    device = nodes.device
    queries = (torch.zeros if width > dim else torch.empty)(2 * batch, width, dtype=score_dtype, device=device)
    positive = torch.empty(2 * batch, dtype=torch.float32, device=device)
    reg = torch.empty(batch, dtype=torch.float32, device=device) if maths.regularizer != "none" else positive
    args = (nodes, nodes if relations is None else relations, edges, positive if mask is None else mask,
            queries, positive, reg, batch, 0 if relations is None else len(relations) // 2, dim, width)
    _launch(_complex_queries_kernel, _real_queries_kernel, args, batch, width, maths, mask, relations)
    return queries, positive, reg if maths.regularizer != "none" else None


def _edge_backward_triton(grad_rows, grad_relations, nodes, relations, edges, local, grad_queries, grad_positive,
                          head_offset, maths, mask, reg_scale, tile=None, num_warps=None):
    """``tile`` (elements per program) and ``num_warps`` override the defaults (bench/kernels.py sweeps them)."""
    batch, dim = len(edges), nodes.shape[1]
    common = (nodes, nodes if relations is None else relations, edges, local,
              grad_queries if mask is None else mask, grad_queries, grad_positive, grad_rows,
              grad_rows if grad_relations is None else grad_relations, batch,
              0 if relations is None else len(relations) // 2, dim, grad_queries.stride(0), head_offset, reg_scale)
    _launch(_complex_backward_kernel, _real_backward_kernel, common, batch, dim, maths, mask, relations, tile,
            num_warps)


def _warps_for(elements: int) -> int:
    """8 elements of a tile per thread up to 16 warps (wide rows make tiles past EDGE_TILE; past 4096
    elements a thread holds more): 4 to 16 warps."""
    return max(4, min(16, elements // 256))


def _launch(complex_kernel, real_kernel, args, batch: int, width: int, maths: EdgeMaths, mask, relations,
            tile=None, num_warps=None) -> None:
    """One program per block of edges: the complex kernel over [re | im] halves (ComplEx, RotatE), the real one
    over rows of ``width``."""
    flags = dict(DROPOUT=mask is not None, REG=_REGULARIZER_CODE[maths.regularizer],
                 REG_RELATIONS=maths.reg_relations and relations is not None
                 and maths.operator not in ("identity", "rotation"),
                 COMPARATOR=_COMPARATOR_CODE[maths.comparator])
    tile = tile or EDGE_TILE
    if maths.complex_moduli:
        block_e, block_h = tile_shape(args[0].shape[1] // 2, tile)  # args[0]: the node table
        flags["num_warps"] = num_warps or _warps_for(block_e * block_h)
        complex_kernel[(triton.cdiv(batch, block_e),)](*args, ROTATION=maths.operator == "rotation", **flags,
                                                       BLOCK_E=block_e, BLOCK_H=block_h)
    else:
        block_e, block_d = tile_shape(width, tile)
        flags["num_warps"] = num_warps or _warps_for(block_e * block_d)
        real_kernel[(triton.cdiv(batch, block_e),)](*args, OPERATOR=_OPERATOR_CODE[maths.operator], **flags,
                                                    BLOCK_E=block_e, BLOCK_D=block_d)


if triton is not None:
    @triton.jit
    def _load_edges(edges, first, num_edges, BLOCK_E: tl.constexpr):
        e = first + tl.arange(0, BLOCK_E)
        inside = e < num_edges
        e = e.to(tl.int64)
        heads = tl.load(edges + 3 * e, mask=inside, other=0)
        rels = tl.load(edges + 3 * e + 1, mask=inside, other=0)
        tails = tl.load(edges + 3 * e + 2, mask=inside, other=0)
        return e, inside, heads, rels, tails

    @triton.jit
    def _reg_sum(x, REG: tl.constexpr):
        """Per row: sum |x|^3 (N3) or sum x^2 (L2) of a real tile."""
        if REG == 1:
            return tl.sum(tl.abs(x) * x * x, 1)
        return tl.sum(x * x, 1)

    @triton.jit
    def _reg_grad(x, REG: tl.constexpr):
        if REG == 1:
            return 3.0 * x * tl.abs(x)
        return 2.0 * x

    @triton.jit
    def _tile_pair_score(q, target, COMPARATOR: tl.constexpr):
        """Per row: <q, target>, -||q - target||_2 or -||q - target||_1 (columns past d are 0 in both)."""
        if COMPARATOR == 0:
            return tl.sum(q * target, 1)
        difference = q - target
        if COMPARATOR == 1:
            return -tl.sqrt(tl.sum(difference * difference, 1))
        return -tl.sum(tl.abs(difference), 1)

    @triton.jit
    def _tile_pair_gradients(q, target, COMPARATOR: tl.constexpr):
        """(d score / d q, d score / d target) of ``_tile_pair_score``; 0 at distance 0, as autograd's norms."""
        if COMPARATOR == 0:
            return target, q
        difference = q - target
        if COMPARATOR == 1:
            norm = tl.sqrt(tl.sum(difference * difference, 1))[:, None]
            by_q = -difference / tl.where(norm > 0, norm, 1.0)
        else:
            by_q = tl.where(difference > 0, -1.0, tl.where(difference < 0, 1.0, 0.0))
        return by_q, -by_q

    @triton.jit
    def _real_operator(nodes, relations, OPERATOR: tl.constexpr):
        if OPERATOR == 1:
            return nodes * relations
        if OPERATOR == 2:
            return nodes + relations
        return nodes

    @triton.jit
    def _real_edges(nodes, edges, num_edges, dim, BLOCK_E: tl.constexpr, BLOCK_D: tl.constexpr):
        """This program's edges and the rows of their h and t."""
        e, inside, heads, rels, tails = _load_edges(edges, tl.program_id(0) * BLOCK_E, num_edges, BLOCK_E)
        cols = tl.arange(0, BLOCK_D)
        mask_cols = inside[:, None] & (cols < dim)[None, :]
        h = load_rows(nodes, heads, cols, mask_cols, dim)
        t = load_rows(nodes, tails, cols, mask_cols, dim)
        return e, inside, rels, cols, mask_cols, h, t

    @triton.jit
    def _real_queries_kernel(nodes, relations, edges, mask, queries, positive, reg_out, num_edges, num_relations,
                             dim, width, OPERATOR: tl.constexpr, COMPARATOR: tl.constexpr, DROPOUT: tl.constexpr,
                             REG: tl.constexpr, REG_RELATIONS: tl.constexpr, BLOCK_E: tl.constexpr,
                             BLOCK_D: tl.constexpr):
        e, inside, rels, cols, mask_cols, h, t = _real_edges(nodes, edges, num_edges, dim, BLOCK_E, BLOCK_D)
        tail_q, head_q = h, t
        if OPERATOR != 0:
            forward = load_rows(relations, rels, cols, mask_cols, dim)
            inverse = load_rows(relations, rels + num_relations, cols, mask_cols, dim)
            tail_q, head_q = _real_operator(h, forward, OPERATOR), _real_operator(t, inverse, OPERATOR)
        if DROPOUT:
            tail_q = tail_q * load_rows(mask, e, cols, mask_cols, dim)
            head_q = head_q * load_rows(mask, e + num_edges, cols, mask_cols, dim)
        out_mask = inside[:, None] & (cols < width)[None, :]  # columns past d get the zeros loaded there
        tl.store(queries + e[:, None] * width + cols[None, :], tail_q.to(queries.dtype.element_ty), mask=out_mask)
        tl.store(queries + (e + num_edges)[:, None] * width + cols[None, :], head_q.to(queries.dtype.element_ty),
                 mask=out_mask)
        tl.store(positive + e, _tile_pair_score(tail_q, t, COMPARATOR), mask=inside)
        tl.store(positive + num_edges + e, _tile_pair_score(head_q, h, COMPARATOR), mask=inside)
        if REG != 0:
            value = _reg_sum(h, REG) + _reg_sum(t, REG)
            if REG_RELATIONS:
                value += _reg_sum(forward, REG) + _reg_sum(inverse, REG)
            tl.store(reg_out + e, value, mask=inside)

    @triton.jit
    def _real_backward_kernel(nodes, relations, edges, local, mask, grad_queries, grad_positive, grad_rows,
                              grad_relations, num_edges, num_relations, dim, grad_stride, head_offset, reg_scale,
                              OPERATOR: tl.constexpr, COMPARATOR: tl.constexpr, DROPOUT: tl.constexpr,
                              REG: tl.constexpr, REG_RELATIONS: tl.constexpr, BLOCK_E: tl.constexpr,
                              BLOCK_D: tl.constexpr):
        e, inside, rels, cols, mask_cols, h, t = _real_edges(nodes, edges, num_edges, dim, BLOCK_E, BLOCK_D)
        pos_tail = tl.load(grad_positive + e, mask=inside, other=0.0)[:, None]
        pos_head = tl.load(grad_positive + head_offset + e, mask=inside, other=0.0)[:, None]
        keep_tail = 1.0
        keep_head = 1.0
        if DROPOUT:
            keep_tail = load_rows(mask, e, cols, mask_cols, dim)
            keep_head = load_rows(mask, e + num_edges, cols, mask_cols, dim)
        forward = h  # unused unless OPERATOR != 0
        inverse = t
        if OPERATOR != 0:
            forward = load_rows(relations, rels, cols, mask_cols, dim)
            inverse = load_rows(relations, rels + num_relations, cols, mask_cols, dim)
        # the positive scores' gradients: d/d (dropped query) and d/d its target
        by_query_tail, by_target_tail = _tile_pair_gradients(_real_operator(h, forward, OPERATOR) * keep_tail, t,
                                                        COMPARATOR)
        by_query_head, by_target_head = _tile_pair_gradients(_real_operator(t, inverse, OPERATOR) * keep_head, h,
                                                        COMPARATOR)
        grad_tail_q = (load_rows(grad_queries, e, cols, mask_cols, grad_stride).to(tl.float32)
                       + pos_tail * by_query_tail) * keep_tail
        grad_head_q = (load_rows(grad_queries, e + head_offset, cols, mask_cols, grad_stride).to(tl.float32)
                       + pos_head * by_query_head) * keep_head
        if OPERATOR != 0:
            if OPERATOR == 1:
                grad_h, grad_t = grad_tail_q * forward, grad_head_q * inverse
                grad_forward, grad_inverse = grad_tail_q * h, grad_head_q * t
            else:  # translation: the query's gradient, to the node and to the relation
                grad_h, grad_t = grad_tail_q, grad_head_q
                grad_forward, grad_inverse = grad_tail_q, grad_head_q
            grad_h += pos_head * by_target_head
            grad_t += pos_tail * by_target_tail
            if REG != 0 and REG_RELATIONS:
                grad_forward += reg_scale * _reg_grad(forward, REG)
                grad_inverse += reg_scale * _reg_grad(inverse, REG)
            tl.atomic_add(grad_relations + rels[:, None] * dim + cols[None, :], grad_forward, mask=mask_cols,
                          sem="relaxed")
            tl.atomic_add(grad_relations + (rels + num_relations)[:, None] * dim + cols[None, :], grad_inverse,
                          mask=mask_cols, sem="relaxed")
        else:
            grad_h = grad_tail_q + pos_head * by_target_head
            grad_t = grad_head_q + pos_tail * by_target_tail
        if REG != 0:
            grad_h += reg_scale * _reg_grad(h, REG)
            grad_t += reg_scale * _reg_grad(t, REG)
        local_heads = tl.load(local + e, mask=inside, other=0)
        local_tails = tl.load(local + num_edges + e, mask=inside, other=0)
        tl.atomic_add(grad_rows + local_heads[:, None] * dim + cols[None, :], grad_h, mask=mask_cols, sem="relaxed")
        tl.atomic_add(grad_rows + local_tails[:, None] * dim + cols[None, :], grad_t, mask=mask_cols, sem="relaxed")

    @triton.jit
    def _halves(table, ids, cols, mask, dim):
        """The [re | im] halves of rows ``ids`` of a [rows, dim] table."""
        half = dim // 2
        return load_rows(table, ids, cols, mask, dim), load_rows(table + half, ids, cols, mask, dim)

    @triton.jit
    def _relation_halves(relations, rels, cols, mask, dim, ROTATION: tl.constexpr):
        """A relation row as [re | im] halves: ComplEx's as stored, RotatE's e^{i phi} from its dim/2 phases."""
        if ROTATION:
            phases = load_rows(relations, rels, cols, mask, dim // 2)
            return tl.cos(phases), tl.sin(phases)
        return _halves(relations, rels, cols, mask, dim)

    @triton.jit
    def _complex_edges(nodes, relations, edges, num_edges, num_relations, dim, ROTATION: tl.constexpr,
                       BLOCK_E: tl.constexpr, BLOCK_H: tl.constexpr):
        """This program's edges and the [re | im] halves of their h, t, forward and inverse relation rows."""
        e, inside, heads, rels, tails = _load_edges(edges, tl.program_id(0) * BLOCK_E, num_edges, BLOCK_E)
        cols = tl.arange(0, BLOCK_H)
        mask_cols = inside[:, None] & (cols < dim // 2)[None, :]
        h_re, h_im = _halves(nodes, heads, cols, mask_cols, dim)
        t_re, t_im = _halves(nodes, tails, cols, mask_cols, dim)
        f_re, f_im = _relation_halves(relations, rels, cols, mask_cols, dim, ROTATION)
        i_re, i_im = _relation_halves(relations, rels + num_relations, cols, mask_cols, dim, ROTATION)
        return e, inside, rels, cols, mask_cols, h_re, h_im, t_re, t_im, f_re, f_im, i_re, i_im

    @triton.jit
    def _complex_pair_score(q_re, q_im, t_re, t_im, mask, COMPARATOR: tl.constexpr):
        """Per row: Re <q, conj(t)>, -||q - t||_2, or -(sum of the complex moduli of q - t, each with RotatE's
        1e-12 under its square root; coordinates outside ``mask`` count 0)."""
        tl.static_assert(COMPARATOR != 2, "L1 has no complex form")
        if COMPARATOR == 0:
            return tl.sum(q_re * t_re + q_im * t_im, 1)
        d_re = q_re - t_re
        d_im = q_im - t_im
        squared = d_re * d_re + d_im * d_im
        if COMPARATOR == 1:
            return -tl.sqrt(tl.sum(squared, 1))
        return -tl.sum(tl.where(mask, tl.sqrt(squared + 1e-12), 0.0), 1)

    @triton.jit
    def _complex_pair_gradients(q_re, q_im, t_re, t_im, COMPARATOR: tl.constexpr):
        """(d score / d q, d score / d t) of ``_complex_pair_score`` as re, im halves; 0 at distance 0 (L2)."""
        tl.static_assert(COMPARATOR != 2, "L1 has no complex form")
        if COMPARATOR == 0:
            return t_re, t_im, q_re, q_im
        d_re = q_re - t_re
        d_im = q_im - t_im
        if COMPARATOR == 1:
            norm = tl.sqrt(tl.sum(d_re * d_re + d_im * d_im, 1))[:, None]
            scale = -1.0 / tl.where(norm > 0, norm, 1.0)
        else:
            scale = -1.0 / tl.sqrt(d_re * d_re + d_im * d_im + 1e-12)
        return d_re * scale, d_im * scale, -d_re * scale, -d_im * scale

    @triton.jit
    def _complex_product(a_re, a_im, b_re, b_im):
        return a_re * b_re - a_im * b_im, a_re * b_im + a_im * b_re

    @triton.jit
    def _complex_reg_sum(real, imaginary, REG: tl.constexpr):
        squared = real * real + imaginary * imaginary
        if REG == 1:
            return tl.sum(squared * tl.sqrt(squared), 1)
        return tl.sum(squared, 1)

    @triton.jit
    def _complex_reg_grad(real, imaginary, REG: tl.constexpr):
        """(d/d re, d/d im) of N3's modulus cubed, or of L2."""
        if REG == 1:
            modulus = tl.sqrt(real * real + imaginary * imaginary)
            return 3.0 * real * modulus, 3.0 * imaginary * modulus
        return 2.0 * real, 2.0 * imaginary

    @triton.jit
    def _store_halves(out, rows, cols, real, imaginary, mask, stride, half):
        tl.store(out + rows[:, None] * stride + cols[None, :], real, mask=mask)
        tl.store(out + rows[:, None] * stride + half + cols[None, :], imaginary, mask=mask)

    @triton.jit
    def _add_halves(out, rows, cols, real, imaginary, mask, dim):
        half = dim // 2
        tl.atomic_add(out + rows[:, None] * dim + cols[None, :], real, mask=mask, sem="relaxed")
        tl.atomic_add(out + rows[:, None] * dim + half + cols[None, :], imaginary, mask=mask, sem="relaxed")

    @triton.jit
    def _complex_queries_kernel(nodes, relations, edges, mask, queries, positive, reg_out, num_edges,
                                num_relations, dim, width, ROTATION: tl.constexpr, COMPARATOR: tl.constexpr,
                                DROPOUT: tl.constexpr, REG: tl.constexpr, REG_RELATIONS: tl.constexpr,
                                BLOCK_E: tl.constexpr, BLOCK_H: tl.constexpr):
        e, inside, rels, cols, mask_cols, h_re, h_im, t_re, t_im, f_re, f_im, i_re, i_im = _complex_edges(
            nodes, relations, edges, num_edges, num_relations, dim, ROTATION, BLOCK_E, BLOCK_H)
        half = dim // 2
        tail_re, tail_im = _complex_product(h_re, h_im, f_re, f_im)
        head_re, head_im = _complex_product(t_re, t_im, i_re, i_im)
        if DROPOUT:
            keep_re, keep_im = _halves(mask, e, cols, mask_cols, dim)
            tail_re, tail_im = tail_re * keep_re, tail_im * keep_im
            keep_re, keep_im = _halves(mask, e + num_edges, cols, mask_cols, dim)
            head_re, head_im = head_re * keep_re, head_im * keep_im
        kind = queries.dtype.element_ty
        _store_halves(queries, e, cols, tail_re.to(kind), tail_im.to(kind), mask_cols, width, half)
        _store_halves(queries, e + num_edges, cols, head_re.to(kind), head_im.to(kind), mask_cols, width, half)
        tl.store(positive + e, _complex_pair_score(tail_re, tail_im, t_re, t_im, mask_cols, COMPARATOR), mask=inside)
        tl.store(positive + num_edges + e, _complex_pair_score(head_re, head_im, h_re, h_im, mask_cols, COMPARATOR),
                 mask=inside)
        if REG != 0:
            value = _complex_reg_sum(h_re, h_im, REG) + _complex_reg_sum(t_re, t_im, REG)
            if REG_RELATIONS:
                value += _complex_reg_sum(f_re, f_im, REG) + _complex_reg_sum(i_re, i_im, REG)
            tl.store(reg_out + e, value, mask=inside)

    @triton.jit
    def _complex_backward_kernel(nodes, relations, edges, local, mask, grad_queries, grad_positive, grad_rows,
                                 grad_relations, num_edges, num_relations, dim, grad_stride, head_offset, reg_scale,
                                 ROTATION: tl.constexpr, COMPARATOR: tl.constexpr, DROPOUT: tl.constexpr,
                                 REG: tl.constexpr, REG_RELATIONS: tl.constexpr, BLOCK_E: tl.constexpr,
                                 BLOCK_H: tl.constexpr):
        e, inside, rels, cols, mask_cols, h_re, h_im, t_re, t_im, f_re, f_im, i_re, i_im = _complex_edges(
            nodes, relations, edges, num_edges, num_relations, dim, ROTATION, BLOCK_E, BLOCK_H)
        half = dim // 2
        pos_tail = tl.load(grad_positive + e, mask=inside, other=0.0)[:, None]
        pos_head = tl.load(grad_positive + head_offset + e, mask=inside, other=0.0)[:, None]
        tail_re, tail_im = _complex_product(h_re, h_im, f_re, f_im)  # the queries, for the positives
        head_re, head_im = _complex_product(t_re, t_im, i_re, i_im)
        full_tail_re, full_tail_im, full_head_re, full_head_im = tail_re, tail_im, head_re, head_im
        keep_tail_re, keep_tail_im, keep_head_re, keep_head_im = 1.0, 1.0, 1.0, 1.0
        if DROPOUT:
            keep_tail_re, keep_tail_im = _halves(mask, e, cols, mask_cols, dim)
            keep_head_re, keep_head_im = _halves(mask, e + num_edges, cols, mask_cols, dim)
            tail_re, tail_im = tail_re * keep_tail_re, tail_im * keep_tail_im
            head_re, head_im = head_re * keep_head_re, head_im * keep_head_im
        # the positive scores' gradients: d/d (dropped query) and d/d its target
        bq_tail_re, bq_tail_im, bt_tail_re, bt_tail_im = _complex_pair_gradients(tail_re, tail_im, t_re, t_im,
                                                                                 COMPARATOR)
        bq_head_re, bq_head_im, bt_head_re, bt_head_im = _complex_pair_gradients(head_re, head_im, h_re, h_im,
                                                                                 COMPARATOR)
        # d loss / d (dropped query) of each direction: the softmax's part plus the positive score's
        gq_re = (load_rows(grad_queries, e, cols, mask_cols, grad_stride).to(tl.float32)
                 + pos_tail * bq_tail_re) * keep_tail_re
        gq_im = (load_rows(grad_queries + half, e, cols, mask_cols, grad_stride).to(tl.float32)
                 + pos_tail * bq_tail_im) * keep_tail_im
        gk_re = (load_rows(grad_queries, e + head_offset, cols, mask_cols, grad_stride).to(tl.float32)
                 + pos_head * bq_head_re) * keep_head_re
        gk_im = (load_rows(grad_queries + half, e + head_offset, cols, mask_cols, grad_stride).to(tl.float32)
                 + pos_head * bq_head_im) * keep_head_im
        # dq * conj(r) for the node; dq * conj(node) for a ComplEx relation, Im(conj(q) dq) for RotatE's phase
        gh_re = gq_re * f_re + gq_im * f_im + pos_head * bt_head_re
        gh_im = gq_im * f_re - gq_re * f_im + pos_head * bt_head_im
        gt_re = gk_re * i_re + gk_im * i_im + pos_tail * bt_tail_re
        gt_im = gk_im * i_re - gk_re * i_im + pos_tail * bt_tail_im
        if REG != 0:
            reg_re, reg_im = _complex_reg_grad(h_re, h_im, REG)
            gh_re, gh_im = gh_re + reg_scale * reg_re, gh_im + reg_scale * reg_im
            reg_re, reg_im = _complex_reg_grad(t_re, t_im, REG)
            gt_re, gt_im = gt_re + reg_scale * reg_re, gt_im + reg_scale * reg_im
        if ROTATION:  # the phases are not regularised (RotatE's regularize_relations)
            phase_f = gq_im * full_tail_re - gq_re * full_tail_im
            phase_i = gk_im * full_head_re - gk_re * full_head_im
            tl.atomic_add(grad_relations + rels[:, None] * half + cols[None, :], phase_f, mask=mask_cols,
                          sem="relaxed")
            tl.atomic_add(grad_relations + (rels + num_relations)[:, None] * half + cols[None, :], phase_i,
                          mask=mask_cols, sem="relaxed")
        else:
            gf_re, gf_im = gq_re * h_re + gq_im * h_im, gq_im * h_re - gq_re * h_im
            gi_re, gi_im = gk_re * t_re + gk_im * t_im, gk_im * t_re - gk_re * t_im
            if REG != 0 and REG_RELATIONS:
                reg_re, reg_im = _complex_reg_grad(f_re, f_im, REG)
                gf_re, gf_im = gf_re + reg_scale * reg_re, gf_im + reg_scale * reg_im
                reg_re, reg_im = _complex_reg_grad(i_re, i_im, REG)
                gi_re, gi_im = gi_re + reg_scale * reg_re, gi_im + reg_scale * reg_im
            _add_halves(grad_relations, rels, cols, gf_re, gf_im, mask_cols, dim)
            _add_halves(grad_relations, rels + num_relations, cols, gi_re, gi_im, mask_cols, dim)
        local_heads = tl.load(local + e, mask=inside, other=0)
        local_tails = tl.load(local + num_edges + e, mask=inside, other=0)
        _add_halves(grad_rows, local_heads, cols, gh_re, gh_im, mask_cols, dim)
        _add_halves(grad_rows, local_tails, cols, gt_re, gt_im, mask_cols, dim)
