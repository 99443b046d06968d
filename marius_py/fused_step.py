"""The training step of Dot and DistMult with softmax cross-entropy, with hand-written gradients.

For these decoders every gradient is a product of rows the step already
reads, so a batch needs a handful of kernels where autograd launches ~90 and
makes ~20 passes over [batch, d] tensors:

1. ``edge_queries``: per edge, the queries h*r_fwd and t*r_inv (in the score
   dtype) and the positive scores, read straight from the node table.
2. The candidates' rows, and ``softmax_ce_gradients`` (marius_py/fused_loss.py):
   the loss and the gradients of queries, candidates and positive scores.
3. ``edge_backward_``: per edge, the gradients of h, t and both relation
   vectors, added (atomically) into a gradient per touched row and per relation.
4. ``sparse_adagrad_``: Adagrad on the touched rows, in place in the tables.

It computes what ``Model.compute`` + ``SparseAdagrad.apply`` compute (tests
compare them), in place, so it serves only the synchronous ``device``
placement. Each function has a Triton kernel for float32 CUDA tables and a
torch version (CPU, float64) that the tests use as reference.
"""

from __future__ import annotations

import contextlib

import torch
from torch.nn import functional as F

from marius_py.fused_loss import SCORE_DTYPES, softmax_ce_gradients
from marius_py.negatives import by_chunk, chunk_row_weights
from pipeline.row_kernels import gather_rows, scatter_add_rows_, sparse_adagrad_, tile_shape, triton, use_triton

if triton is not None:
    import triton.language as tl

    from pipeline.row_kernels import load_rows

FUSED_DECODERS = ("dot", "distmult")


def supports_fused_step(model) -> bool:
    """Whether ``FusedStep`` computes this model's step: Dot/DistMult, softmax CE, no dropout or regulariser."""
    m = model.config.model
    return (model.decoder.name in FUSED_DECODERS and m.loss == "softmax_ce" and m.dropout == 0
            and (m.reg_weight == 0 or m.regularizer == "none"))


class FusedStep:
    """One batch of a ``Model`` (see ``supports_fused_step``) applied in place to its tables."""

    def __init__(self, model):
        self.model = model
        self.score_dtype = SCORE_DTYPES[model.config.training.score_dtype]
        self.adagrad = model.node_optimizer
        self.relations = model.decoder.relations if model.decoder.relations.numel() else None
        optimizer = model.relation_optimizer
        group = optimizer.param_groups[0] if optimizer is not None else {}
        # Plain Adagrad on the relations is stepped here with tensor ops only (no host reads: capturable).
        self.own_relation_step = self.relations is None or (
            type(optimizer) is torch.optim.Adagrad and group["lr_decay"] == 0 and group["weight_decay"] == 0
            and not group["maximize"] and group["initial_accumulator_value"] == 0)

    def run(self, plan, nodes: torch.Tensor, state: torch.Tensor, loss_sum: torch.Tensor) -> None:
        """Train one planned batch (``Model.plan_batch``): update ``nodes``, ``state`` and relations."""
        self.apply(plan, nodes, state, loss_sum)
        self.count_relation_step()

    def relation_tensors(self) -> list[torch.Tensor]:
        """The relation parameters and their Adagrad sums (tensors a captured step reads)."""
        if self.relations is None:
            return []
        state = self.model.relation_optimizer.state.get(self.relations, {})
        return [self.relations] + ([state["sum"]] if "sum" in state else [])

    def count_relation_step(self) -> None:
        """Advance the relation optimizer's step count (host-side, so kept out of ``apply``)."""
        if self.relations is not None and self.own_relation_step:
            self.model.relation_optimizer.state[self.relations]["step"] += 1

    def apply(self, plan, nodes: torch.Tensor, state: torch.Tensor, loss_sum: torch.Tensor,
              gathered: torch.Tensor | None = None, unique_stream: torch.cuda.Stream | None = None) -> None:
        """``run`` without the step count: device work only when ``own_relation_step`` (a CUDA graph captures it).

        ``gathered``: the embeddings of ``plan.rows`` already on the device
        (tables in pinned host memory); the step then reads rows from it and
        writes the update into the tables through ``plan.rows``. ``unique_stream``:
        the stream still computing the plan's rows (``Model.plan_batch``); the
        scores are computed meanwhile, as they need only the edges and negatives.
        """
        grad_rows, grad_relations, loss = self.gradients(plan, nodes if gathered is None else gathered,
                                                         in_place=gathered is None, unique_stream=unique_stream)
        with _on_stream(unique_stream, fork=True):  # beside the node update
            if grad_relations is not None:
                self._step_relations(grad_relations)
            loss_sum.add_(loss * len(plan.edges))
        count = plan.unique_count if plan.unique_count is not None else len(plan.rows)
        sparse_adagrad_(nodes, state, plan.rows, grad_rows, count, self.adagrad.lr, self.adagrad.eps)
        _join(unique_stream)

    def gradients(self, plan, source: torch.Tensor, in_place: bool = False,
                  unique_stream: torch.cuda.Stream | None = None):
        """(d loss / d rows [len(plan.rows), d], d loss / d relations or None, mean loss) of a planned batch.

        ``source``: the node table (``in_place``: plan ids index it) or the
        rows ``plan.rows`` gathered into their own tensor.
        """
        ids = plan if in_place else plan.in_row_positions()
        dim, batch = source.shape[1], len(plan.edges)
        # Zeroed beside the score block. Made on the side stream, used on this one: safe without
        # record_stream because the side stream's next allocation follows its wait on this stream.
        with _on_stream(unique_stream):
            grad_rows = torch.zeros(len(plan.rows), dim, dtype=source.dtype, device=source.device)
        score_dtype = torch.float64 if source.dtype == torch.float64 else self.score_dtype
        relations = None if self.relations is None else self.relations.detach()
        loss, grad_queries, grad_candidates, grad_positive, head_offset = self._score_block(
            source, relations, ids, score_dtype)

        _join(unique_stream)  # from here on the plan's rows are needed
        scatter_add_rows_(grad_rows, plan.local[2 * batch:], grad_candidates.reshape(-1, grad_candidates.shape[-1]))
        grad_relations = None if relations is None else torch.zeros_like(relations)
        edge_backward_(grad_rows, grad_relations, source, relations, ids.edges, plan.local,
                       grad_queries.reshape(-1, grad_queries.shape[-1]), grad_positive.reshape(-1), head_offset)
        return grad_rows, grad_relations, loss

    def relation_gradients(self, gradients) -> list[torch.Tensor]:
        """The relation gradients of ``gradients()``'s result as a list (empty without relations)."""
        return [] if gradients is None else [gradients]

    def step_relations(self, gradients: list[list[torch.Tensor]]) -> None:
        """Step the relations once per gradient list (several devices' batches, in device order)."""
        for grads in gradients:
            for grad in grads:
                self.apply_relation_gradient(grad)
                self.count_relation_step()

    def apply_relation_gradient(self, grad: torch.Tensor) -> None:
        """The relation optimizer's step with this gradient, without the host-side step count."""
        self._step_relations(grad)

    def _score_block(self, source: torch.Tensor, relations: torch.Tensor | None, ids, score_dtype: torch.dtype):
        """(loss, d/d queries, d/d candidates, d/d positive scores, row of the first head-corruption query).

        ``ids``: a plan whose node ids index ``source``. The query and
        candidate rows are padded to 16 bytes for the matmuls.
        """
        edges, batch, dim = ids.edges, len(ids.edges), source.shape[1]
        num_chunks, num_candidates = ids.tail_negatives.shape
        width = _aligned_width(dim, score_dtype)
        queries, positive = edge_queries(source, relations, edges, score_dtype, width)
        candidate_ids = torch.cat([ids.tail_negatives, ids.head_negatives])
        candidates = gather_rows(source, candidate_ids.reshape(-1),
                                 torch.empty(candidate_ids.numel(), width, dtype=score_dtype, device=source.device))
        stacked = by_chunk(queries, batch, num_chunks)
        weights = chunk_row_weights(batch, stacked.shape[1], num_chunks, positive.dtype, positive.device)
        self.constants_used = weights  # cached outside any graph: a graph that captured it keeps it alive
        gradients = softmax_ce_gradients(
            stacked, candidates.reshape(2 * num_chunks, num_candidates, width), by_chunk(positive, batch, num_chunks),
            by_chunk(torch.cat([edges[:, 2], edges[:, 0]]), batch, num_chunks), candidate_ids, weights, score_dtype)
        return (*gradients, stacked.shape[1] * num_chunks)

    def _step_relations(self, grad: torch.Tensor) -> None:
        optimizer = self.model.relation_optimizer
        if not self.own_relation_step:
            self.relations.grad = grad
            optimizer.step()
            self.relations.grad = None
            return
        group, accumulated = optimizer.param_groups[0], optimizer.state[self.relations]["sum"]
        accumulated.addcmul_(grad, grad)  # torch.optim.Adagrad's arithmetic
        self.relations.data.addcdiv_(grad, accumulated.sqrt().add_(group["eps"]), value=-group["lr"])


def _on_stream(stream: torch.cuda.Stream | None, fork: bool = False):
    """Run the block on ``stream`` (after the current stream's work so far when ``fork``); None: in place."""
    if stream is None:
        return contextlib.nullcontext()
    if fork:
        stream.wait_stream(torch.cuda.current_stream(stream.device))
    return torch.cuda.stream(stream)


def _join(stream: torch.cuda.Stream | None) -> None:
    """Make the current stream wait for ``stream``'s work so far (None: nothing to wait for)."""
    if stream is not None:
        torch.cuda.current_stream(stream.device).wait_stream(stream)


def _aligned_width(dim: int, dtype: torch.dtype) -> int:
    """d rounded up to whole 16-byte rows: cuBLAS picks its fastest kernels only for aligned rows."""
    per_16_bytes = max(1, 16 // dtype.itemsize)
    return -(-dim // per_16_bytes) * per_16_bytes


def edge_queries(nodes: torch.Tensor, relations: torch.Tensor | None, edges: torch.Tensor,
                 score_dtype: torch.dtype, width: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """([2B, width] queries: h*r_fwd of every edge, then t*r_inv, zero beyond d; [2B] positive scores).

    ``relations`` is [2R, d] (forward then inverse vectors) or None (Dot).
    """
    batch, dim = len(edges), nodes.shape[1]
    width = width or dim
    if use_triton(nodes):
        queries = torch.empty(2 * batch, width, dtype=score_dtype, device=nodes.device)
        positive = torch.empty(2 * batch, dtype=torch.float32, device=nodes.device)
        block_e, block_d = tile_shape(width)
        _edge_queries_kernel[(triton.cdiv(batch, block_e),)](
            nodes, nodes if relations is None else relations, edges, queries, positive, batch,
            0 if relations is None else len(relations) // 2, dim, width, HAS_RELATIONS=relations is not None,
            BLOCK_E=block_e, BLOCK_D=block_d)
        return queries, positive
    heads, tails = nodes[edges[:, 0]], nodes[edges[:, 2]]
    tail_queries, head_queries = heads, tails
    if relations is not None:
        forward, inverse = _relation_rows(relations, edges[:, 1])
        tail_queries, head_queries = heads * forward, tails * inverse
    queries = torch.cat([tail_queries, head_queries])
    positive = (queries * torch.cat([tails, heads])).sum(-1)
    return F.pad(queries.to(score_dtype), (0, width - dim)), positive


def _relation_rows(relations: torch.Tensor, relation_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return relations[relation_ids], relations[relation_ids + len(relations) // 2]


def edge_backward_(grad_rows: torch.Tensor, grad_relations: torch.Tensor | None, nodes: torch.Tensor,
                   relations: torch.Tensor | None, edges: torch.Tensor, local: torch.Tensor,
                   grad_queries: torch.Tensor, grad_positive: torch.Tensor, head_offset: int) -> None:
    """Add each edge's gradients of h, t (into ``grad_rows`` at ``local``) and of its relation vectors.

    ``grad_queries``/``grad_positive`` hold the tail-corruption rows of the
    edges at [0, B) and the head-corruption rows at [head_offset, head_offset + B);
    ``grad_queries`` may be wider than d (aligned rows: the extra columns are ignored).
    """
    batch, dim = len(edges), nodes.shape[1]
    if use_triton(nodes):
        block_e, block_d = tile_shape(dim)
        _edge_backward_kernel[(triton.cdiv(batch, block_e),)](
            nodes, nodes if relations is None else relations, edges, local, grad_queries, grad_positive,
            grad_rows, grad_rows if grad_relations is None else grad_relations, batch,
            0 if relations is None else len(relations) // 2, dim, grad_queries.stride(0), head_offset,
            HAS_RELATIONS=relations is not None, BLOCK_E=block_e, BLOCK_D=block_d)
        return
    heads, tails = nodes[edges[:, 0]], nodes[edges[:, 2]]
    grad_tail_q = grad_queries[:batch, :dim].to(nodes.dtype)
    grad_head_q = grad_queries[head_offset:head_offset + batch, :dim].to(nodes.dtype)
    pos_tail = grad_positive[:batch, None].to(nodes.dtype)
    pos_head = grad_positive[head_offset:head_offset + batch, None].to(nodes.dtype)
    grad_tail_q = grad_tail_q + pos_tail * tails   # d loss / d (h * r_fwd), positive score included
    grad_head_q = grad_head_q + pos_head * heads
    if relations is None:
        grad_heads, grad_tails = grad_tail_q + pos_head * tails, grad_head_q + pos_tail * heads
    else:
        forward, inverse = _relation_rows(relations, edges[:, 1])
        grad_heads = grad_tail_q * forward + pos_head * (tails * inverse)
        grad_tails = grad_head_q * inverse + pos_tail * (heads * forward)
        grad_relations.index_add_(0, edges[:, 1], grad_tail_q * heads)
        grad_relations.index_add_(0, edges[:, 1] + len(relations) // 2, grad_head_q * tails)
    grad_rows.index_add_(0, local[:batch], grad_heads)
    grad_rows.index_add_(0, local[batch:2 * batch], grad_tails)


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
    def _edge_queries_kernel(nodes, relations, edges, queries, positive, num_edges, num_relations, dim, width,
                             HAS_RELATIONS: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_D: tl.constexpr):
        e, inside, heads, rels, tails = _load_edges(edges, tl.program_id(0) * BLOCK_E, num_edges, BLOCK_E)
        cols = tl.arange(0, BLOCK_D)
        mask = inside[:, None] & (cols < dim)[None, :]
        h = load_rows(nodes, heads, cols, mask, dim)
        t = load_rows(nodes, tails, cols, mask, dim)
        tail_q, head_q = h, t
        if HAS_RELATIONS:
            tail_q = h * load_rows(relations, rels, cols, mask, dim)
            head_q = t * load_rows(relations, rels + num_relations, cols, mask, dim)
        out_mask = inside[:, None] & (cols < width)[None, :]  # columns past d get the zeros loaded there
        tl.store(queries + e[:, None] * width + cols[None, :], tail_q.to(queries.dtype.element_ty), mask=out_mask)
        tl.store(queries + (e + num_edges)[:, None] * width + cols[None, :], head_q.to(queries.dtype.element_ty),
                 mask=out_mask)
        tl.store(positive + e, tl.sum(tail_q * t, 1), mask=inside)
        tl.store(positive + num_edges + e, tl.sum(head_q * h, 1), mask=inside)

    @triton.jit
    def _edge_backward_kernel(nodes, relations, edges, local, grad_queries, grad_positive, grad_rows,
                              grad_relations, num_edges, num_relations, dim, grad_stride, head_offset,
                              HAS_RELATIONS: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_D: tl.constexpr):
        e, inside, heads, rels, tails = _load_edges(edges, tl.program_id(0) * BLOCK_E, num_edges, BLOCK_E)
        cols = tl.arange(0, BLOCK_D)
        mask = inside[:, None] & (cols < dim)[None, :]
        h = load_rows(nodes, heads, cols, mask, dim)
        t = load_rows(nodes, tails, cols, mask, dim)
        pos_tail = tl.load(grad_positive + e, mask=inside, other=0.0)[:, None]
        pos_head = tl.load(grad_positive + head_offset + e, mask=inside, other=0.0)[:, None]
        grad_tail_q = load_rows(grad_queries, e, cols, mask, grad_stride).to(tl.float32) + pos_tail * t
        grad_head_q = load_rows(grad_queries, e + head_offset, cols, mask, grad_stride).to(tl.float32) + pos_head * h
        if HAS_RELATIONS:
            forward = load_rows(relations, rels, cols, mask, dim)
            inverse = load_rows(relations, rels + num_relations, cols, mask, dim)
            grad_h = grad_tail_q * forward + pos_head * (t * inverse)
            grad_t = grad_head_q * inverse + pos_tail * (h * forward)
            tl.atomic_add(grad_relations + rels[:, None] * dim + cols[None, :], grad_tail_q * h, mask=mask,
                          sem="relaxed")
            tl.atomic_add(grad_relations + (rels + num_relations)[:, None] * dim + cols[None, :],
                          grad_head_q * t, mask=mask, sem="relaxed")
        else:
            grad_h = grad_tail_q + pos_head * t
            grad_t = grad_head_q + pos_tail * h
        local_heads = tl.load(local + e, mask=inside, other=0)
        local_tails = tl.load(local + num_edges + e, mask=inside, other=0)
        tl.atomic_add(grad_rows + local_heads[:, None] * dim + cols[None, :], grad_h, mask=mask, sem="relaxed")
        tl.atomic_add(grad_rows + local_tails[:, None] * dim + cols[None, :], grad_t, mask=mask, sem="relaxed")
