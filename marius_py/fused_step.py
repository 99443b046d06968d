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

try:  # Triton ships with CUDA builds of torch; CPU builds use the torch versions.
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - depends on the torch build
    triton = None

FUSED_DECODERS = ("dot", "distmult")
_TILE = 4096  # elements of one [edges or rows, d] tile per Triton program


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
        source, ids = (nodes, plan) if gathered is None else (gathered, plan.in_row_positions())
        dim, batch = nodes.shape[1], len(plan.edges)
        # Zeroed beside the score block. Made on the side stream, used on this one: safe without
        # record_stream because the side stream's next allocation follows its wait on this stream.
        with _on_stream(unique_stream):
            grad_rows = torch.zeros(len(plan.rows), dim, dtype=nodes.dtype, device=source.device)
        score_dtype = torch.float64 if nodes.dtype == torch.float64 else self.score_dtype
        relations = None if self.relations is None else self.relations.detach()
        loss, grad_queries, grad_candidates, grad_positive, head_offset = self._score_block(
            source, relations, ids, score_dtype)

        _join(unique_stream)  # from here on the plan's rows are needed
        scatter_add_rows_(grad_rows, plan.local[2 * batch:], grad_candidates.reshape(-1, grad_candidates.shape[-1]))
        grad_relations = None if relations is None else torch.zeros_like(relations)
        edge_backward_(grad_rows, grad_relations, source, relations, ids.edges, plan.local,
                       grad_queries.reshape(-1, grad_queries.shape[-1]), grad_positive.reshape(-1), head_offset)
        with _on_stream(unique_stream, fork=True):  # beside the node update
            if grad_relations is not None:
                self._step_relations(grad_relations)
            loss_sum.add_(loss * batch)
        count = plan.unique_count if plan.unique_count is not None else len(plan.rows)
        sparse_adagrad_(nodes, state, plan.rows, grad_rows, count, self.adagrad.lr, self.adagrad.eps)
        _join(unique_stream)

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


def _use_triton(table: torch.Tensor) -> bool:
    return table.is_cuda and triton is not None and table.dtype == torch.float32


def _blocks(dim: int) -> tuple[int, int]:
    """(rows per program, padded d) of a [rows, d] tile."""
    block_d = triton.next_power_of_2(dim)
    return max(1, _TILE // block_d), block_d


def edge_queries(nodes: torch.Tensor, relations: torch.Tensor | None, edges: torch.Tensor,
                 score_dtype: torch.dtype, width: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """([2B, width] queries: h*r_fwd of every edge, then t*r_inv, zero beyond d; [2B] positive scores).

    ``relations`` is [2R, d] (forward then inverse vectors) or None (Dot).
    """
    batch, dim = len(edges), nodes.shape[1]
    width = width or dim
    if _use_triton(nodes):
        queries = torch.empty(2 * batch, width, dtype=score_dtype, device=nodes.device)
        positive = torch.empty(2 * batch, dtype=torch.float32, device=nodes.device)
        block_e, block_d = _blocks(width)
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
    if _use_triton(nodes):
        block_e, block_d = _blocks(dim)
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


def sparse_adagrad_(nodes: torch.Tensor, state: torch.Tensor, rows: torch.Tensor, grad: torch.Tensor,
                    count: torch.Tensor | int, lr: float, eps: float) -> None:
    """Adagrad on table rows ``rows[:count]`` (unique) with gradients ``grad``, in place.

    ``state`` has one column (row-wise Adagrad) or d. ``count`` may be a
    one-element device tensor (a plan's padded rows), read by the kernel.
    """
    dim = nodes.shape[1]
    if _use_triton(grad):  # the tables may be in pinned host memory: the kernel writes them over PCIe
        block_r, block_d = _blocks(dim)
        on_device = isinstance(count, torch.Tensor)
        _sparse_adagrad_kernel[(triton.cdiv(len(rows), block_r),)](
            nodes, state, rows, grad, count if on_device else rows, len(rows) if not on_device else 0,
            lr, eps, dim, COUNT_ON_DEVICE=on_device, ROWWISE=state.shape[1] == 1, BLOCK_R=block_r,
            BLOCK_D=block_d)
        return
    count = int(count)
    rows, grad = rows[:count], grad[:count]
    squared = grad * grad
    if state.shape[1] == 1:
        squared = squared.mean(dim=1, keepdim=True)
    accumulated = state[rows] + squared
    nodes.index_add_(0, rows, grad * (-lr / (torch.sqrt(accumulated) + eps)))
    state[rows] = accumulated


def triton_available() -> bool:
    return triton is not None


def zero_copy_available() -> bool:
    """Whether GPU kernels can read and write pinned host tables in place (CUDA with Triton)."""
    return triton is not None and torch.cuda.is_available()


def gather_rows(table: torch.Tensor, rows: torch.Tensor, out: torch.Tensor,
                count: torch.Tensor | None = None) -> torch.Tensor:
    """``out[u] = table[rows[u]]`` (cast to out's dtype, zeros past d) for u < count (a device tensor).

    ``table`` may be pinned host memory: the GPU reads it over PCIe in place
    (its address is valid on the device under unified addressing), with no
    staging copy and no host work.
    """
    dim, width = table.shape[1], out.shape[1]
    if triton is None or not out.is_cuda or table.dtype != torch.float32:
        limit = len(rows) if count is None else int(count)
        out[:limit] = F.pad(table[rows[:limit]].to(out.dtype), (0, width - dim))
        return out
    block_r, block_d = _blocks(width)
    _gather_rows_kernel[(triton.cdiv(len(rows), block_r),)](
        table, rows, rows if count is None else count, out, len(rows), dim, width,
        COUNT_ON_DEVICE=count is not None, BLOCK_R=block_r, BLOCK_D=block_d)
    return out


def scatter_add_rows_(target: torch.Tensor, positions: torch.Tensor, source: torch.Tensor) -> None:
    """``target[positions[i]] += source[i, :d]`` (repeated positions add up); ``source`` may be wider, any dtype."""
    dim = target.shape[1]
    if not _use_triton(target):
        target.index_add_(0, positions, source[:, :dim].to(target.dtype))
        return
    block_r, block_d = _blocks(dim)
    _scatter_add_rows_kernel[(triton.cdiv(len(positions), block_r),)](
        target, positions, source, len(positions), dim, source.stride(0), BLOCK_R=block_r, BLOCK_D=block_d)


if triton is not None:
    @triton.jit
    def _row_block(rows, count, num_rows, BLOCK_R: tl.constexpr, COUNT_ON_DEVICE: tl.constexpr):
        """This program's block of positions: (positions as int64, inside the first num_rows, rows[position])."""
        if COUNT_ON_DEVICE:
            num_rows = tl.load(count)
        r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
        inside = r < num_rows
        r = r.to(tl.int64)
        return r, inside, tl.load(rows + r, mask=inside, other=0)

    @triton.jit
    def _gather_rows_kernel(table, rows, count, out, num_rows, dim, width, COUNT_ON_DEVICE: tl.constexpr,
                            BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr):
        r, inside, table_rows = _row_block(rows, count, num_rows, BLOCK_R, COUNT_ON_DEVICE)
        cols = tl.arange(0, BLOCK_D)
        values = _rows(table, table_rows, cols, inside[:, None] & (cols < dim)[None, :], dim)
        tl.store(out + r[:, None] * width + cols[None, :], values.to(out.dtype.element_ty),
                 mask=inside[:, None] & (cols < width)[None, :])

    @triton.jit
    def _scatter_add_rows_kernel(target, positions, source, num_rows, dim, source_stride,
                                 BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr):
        r, inside, at = _row_block(positions, positions, num_rows, BLOCK_R, False)
        cols = tl.arange(0, BLOCK_D)
        mask = inside[:, None] & (cols < dim)[None, :]
        values = _rows(source, r, cols, mask, source_stride).to(tl.float32)
        tl.atomic_add(target + at[:, None] * dim + cols[None, :], values, mask=mask, sem="relaxed")

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
    def _rows(table, ids, cols, mask, stride):
        return tl.load(table + ids[:, None] * stride + cols[None, :], mask=mask, other=0.0)

    @triton.jit
    def _edge_queries_kernel(nodes, relations, edges, queries, positive, num_edges, num_relations, dim, width,
                             HAS_RELATIONS: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_D: tl.constexpr):
        e, inside, heads, rels, tails = _load_edges(edges, tl.program_id(0) * BLOCK_E, num_edges, BLOCK_E)
        cols = tl.arange(0, BLOCK_D)
        mask = inside[:, None] & (cols < dim)[None, :]
        h = _rows(nodes, heads, cols, mask, dim)
        t = _rows(nodes, tails, cols, mask, dim)
        tail_q, head_q = h, t
        if HAS_RELATIONS:
            tail_q = h * _rows(relations, rels, cols, mask, dim)
            head_q = t * _rows(relations, rels + num_relations, cols, mask, dim)
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
        h = _rows(nodes, heads, cols, mask, dim)
        t = _rows(nodes, tails, cols, mask, dim)
        pos_tail = tl.load(grad_positive + e, mask=inside, other=0.0)[:, None]
        pos_head = tl.load(grad_positive + head_offset + e, mask=inside, other=0.0)[:, None]
        grad_tail_q = _rows(grad_queries, e, cols, mask, grad_stride).to(tl.float32) + pos_tail * t
        grad_head_q = _rows(grad_queries, e + head_offset, cols, mask, grad_stride).to(tl.float32) + pos_head * h
        if HAS_RELATIONS:
            forward = _rows(relations, rels, cols, mask, dim)
            inverse = _rows(relations, rels + num_relations, cols, mask, dim)
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

    @triton.jit
    def _sparse_adagrad_kernel(nodes, state, rows, grad, count, num_rows, lr, eps, dim,
                               COUNT_ON_DEVICE: tl.constexpr, ROWWISE: tl.constexpr, BLOCK_R: tl.constexpr,
                               BLOCK_D: tl.constexpr):
        r, inside, table_rows = _row_block(rows, count, num_rows, BLOCK_R, COUNT_ON_DEVICE)
        cols = tl.arange(0, BLOCK_D)
        mask = inside[:, None] & (cols < dim)[None, :]
        g = _rows(grad, r, cols, mask, dim)
        squared = g * g
        if ROWWISE:
            accumulated = tl.load(state + table_rows, mask=inside, other=0.0) + tl.sum(squared, 1) / dim
            tl.store(state + table_rows, accumulated, mask=inside)
            step = -lr / (tl.sqrt_rn(accumulated) + eps)[:, None]
        else:
            accumulated = _rows(state, table_rows, cols, mask, dim) + squared
            tl.store(state + table_rows[:, None] * dim + cols[None, :], accumulated, mask=mask)
            step = -lr / (tl.sqrt_rn(accumulated) + eps)
        target = nodes + table_rows[:, None] * dim + cols[None, :]
        tl.store(target, tl.load(target, mask=mask, other=0.0) + g * step, mask=mask)
