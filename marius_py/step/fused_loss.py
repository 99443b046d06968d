"""Softmax cross-entropy against chunk-shared negatives, with its gradient made in the forward pass.

For dot-product decoders the negative scores of a batch are one [G, M, N]
block S = Q C^T (G chunks of M queries, N shared candidates each). The loss is
summed over queries into a scalar whose upstream gradient is a constant, so
the gradient of S, P = softmax over [positive, masked S] (without the positive
column), can be made as soon as S is known: one row-wise pass turns S into P in
place (a Triton kernel on CUDA: one read and one write of S, instead of the
dozen passes of masked_fill, cat, logsumexp and their backward), then
dQ = P C and dC = P^T Q are two more matmuls. The block never exists twice.

Scores may be computed and held in bfloat16 (``score_dtype``), halving the
memory traffic of the block; the per-row reductions run in float32.

Distance decoders (TransE, RotatE) score -dist(q, c) instead (``ScoreForm``):
the L2 distance expands into the same matmul (|q|^2 + |c|^2 - 2 q.c, turned
into -dist by the row kernel, whose output is then d loss / d squared
distance); L1 and RotatE's sum of complex moduli have no matmul form and take
the pairwise kernels of ``pairwise.py``. Their blocks are float32: the
expansion cancels in bfloat16.
"""

from __future__ import annotations

import torch
from torch.nn import functional as F

SCORE_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}  # training.score_dtype

# (rows per program, warps) of the softmax row kernel: the first whose rows divide M. Two rows share a
# program's candidate ids; bench/kernels.py measured 218 us for 2 x 8 and 223 us for 1 x 4 (H100, issue block).
SOFTMAX_TILES = ((2, 8), (1, 4))

# A [G, M, N] score block larger than this (1-vs-all over many nodes) is computed in candidate tiles, twice
# (the row statistics, then the gradients), instead of being held whole.
SCORE_BLOCK_BYTES = 2 << 30

try:  # Triton ships with CUDA builds of torch; CPU builds use the torch-ops path below.
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - depends on the torch build
    triton = None


class ScoreForm:
    """How a [G, M, N] block of scores of queries against candidates is made and differentiated: <q, c>.

    Candidates are [G, N, d], or [1, N, d] shared by every group (1-vs-all:
    both directions score every node); d/d c then sums over the groups.
    """

    squared_l2 = False  # the block holds squared distances that the row kernel turns into -distance
    matmul = True  # the block is made and differentiated by matmuls (cuBLAS)

    def scores(self, q: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        return _by_groups(q, c.transpose(1, 2))

    def backward(self, grad: torch.Tensor, q: torch.Tensor, c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(d/d q, d/d c) given d loss / d (the block ``scores`` made)."""
        return _by_groups(grad, c), _transposed_by_groups(grad, q, len(c))


def _by_groups(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """x [G, M, K] @ y [G, K, N], or y [1, K, N] shared by the groups: one matmul over all G x M rows."""
    if len(y) == 1 and len(x) > 1:
        return (x.reshape(-1, x.shape[-1]) @ y[0]).view(*x.shape[:2], -1)
    return torch.bmm(x, y)


def _transposed_by_groups(x: torch.Tensor, y: torch.Tensor, groups: int) -> torch.Tensor:
    """x^T y per group ([G, N, K] from x [G, M, N], y [G, M, K]), or summed over the groups ([1, N, K]) when
    ``groups`` is 1: one matmul with G x M terms."""
    if groups == 1 and len(x) > 1:
        return (x.reshape(-1, x.shape[-1]).T @ y.reshape(-1, y.shape[-1]))[None]
    return torch.bmm(x.transpose(1, 2), y)


class SquaredL2Form(ScoreForm):
    """-||q - c||_2 through one matmul: the block holds |q|^2 + |c|^2 - 2 <q, c>.

    The norms ride in extra columns of the matmul operands ([q, |q|^2, 1] x [-2c, 1, |c|^2]), and the
    backward's row and column sums of the gradient in a column of ones ([c, 1], [q, 1]), so no pass over
    the [G, M, N] block is made besides the matmuls and the row kernel (adding the norms as a broadcast
    block, and reducing the gradient block twice, cost the step ~45% at d=100 on an H100).
    """

    squared_l2 = True

    def scores(self, q, c):
        ones_q, ones_c = q.new_ones(q.shape[:2]), c.new_ones(c.shape[:2])
        # Each norm as two columns (the part a TF32 matmul keeps, and the rest), times 1: TF32 inputs carry
        # 10 mantissa bits, so one column would add ~1e-3 of |q|^2 to distances that may be far smaller.
        q_hi, q_lo = _tf32_split((q * q).sum(-1))
        c_hi, c_lo = _tf32_split((c * c).sum(-1))
        return _by_groups(_widened(q, q_hi, q_lo, ones_q, ones_q),
                          _widened(-2 * c, ones_c, ones_c, c_hi, c_lo).transpose(1, 2))

    def backward(self, grad, q, c):
        dim = q.shape[-1]
        by_c = _by_groups(grad, _widened(c, c.new_ones(c.shape[:2])))
        by_q = _transposed_by_groups(grad, _widened(q, q.new_ones(q.shape[:2])), len(c))
        grad_q = 2 * (q * by_c[..., dim:dim + 1] - by_c[..., :dim])
        grad_c = 2 * (c * by_q[..., dim:dim + 1] - by_q[..., :dim])
        return grad_q, grad_c


def _tf32_split(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(hi, lo) with hi + lo == x and hi exact in TF32 (float32 with 10 mantissa bits); float64: (x, 0)."""
    if x.dtype != torch.float32:
        return x, torch.zeros_like(x)
    hi = (x.view(torch.int32) & ~0x1FFF).view(torch.float32)
    return hi, x - hi


def _widened(x: torch.Tensor, *columns: torch.Tensor) -> torch.Tensor:
    """[G, R, d] ``x`` with ``columns`` ([G, R] each) appended, zero-padded to a multiple of 8 columns
    (aligned rows for the tensor cores)."""
    dim = x.shape[-1]
    width = -(-(dim + len(columns)) // 8) * 8
    out = x.new_zeros(*x.shape[:-1], width)
    out[..., :dim] = x
    for k, column in enumerate(columns):
        out[..., dim + k] = column
    return out


class PairwiseForm(ScoreForm):
    """-dist(q, c) without a matmul form: L1 (``l1``) or the sum of complex moduli (``modulus``, RotatE)."""

    matmul = False

    def __init__(self, kind: str, dim: int):
        self.kind, self.dim = kind, dim

    def scores(self, q, c):
        from marius_py.step.pairwise import pairwise_scores
        return pairwise_scores(q, c, self.dim, self.kind)

    def backward(self, grad, q, c):
        from marius_py.step.pairwise import pairwise_backward
        return pairwise_backward(grad, q, c, self.dim, self.kind)


def score_form(comparator: str, dim: int) -> ScoreForm:
    """The ``ScoreForm`` of a comparator: dot, l2, l1 or modulus."""
    if comparator == "dot":
        return ScoreForm()
    if comparator == "l2":
        return SquaredL2Form()
    return PairwiseForm(comparator, dim)


def shared_negative_softmax_ce(queries: torch.Tensor, candidates: torch.Tensor, positive: torch.Tensor,
                               target_ids: torch.Tensor, candidate_ids: torch.Tensor, weight: torch.Tensor,
                               score_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """sum_r weight_r * (logsumexp([pos_r, S_r with candidates equal to the target masked]) - pos_r).

    queries [G, M, d], candidates [G, N, d], positive/target_ids/weight [G, M],
    candidate_ids [G, N] (candidates may be [1, N, d], shared by the groups). Differentiable in queries,
    candidates and positive.
    """
    if queries.dtype == torch.float64:  # exact checks against dense autograd run in float64
        score_dtype = torch.float64
    return _SharedNegativeSoftmaxCE.apply(queries, candidates, positive, target_ids, candidate_ids, weight,
                                          score_dtype)


class _SharedNegativeSoftmaxCE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, queries, candidates, positive, target_ids, candidate_ids, weight, score_dtype):
        loss, grad_queries, grad_candidates, grad_positive = softmax_ce_gradients(
            queries.detach(), candidates.detach(), positive.detach(), target_ids, candidate_ids, weight, score_dtype)
        ctx.grads = (grad_queries.to(queries.dtype), grad_candidates.to(candidates.dtype),
                     grad_positive.to(positive.dtype))
        return loss.to(positive.dtype)

    @staticmethod
    def backward(ctx, grad):
        grad_queries, grad_candidates, grad_positive = ctx.grads
        del ctx.grads
        return grad_queries * grad, grad_candidates * grad, grad_positive * grad, None, None, None, None


def softmax_ce_gradients(queries: torch.Tensor, candidates: torch.Tensor, positive: torch.Tensor,
                         target_ids: torch.Tensor, candidate_ids: torch.Tensor, weight: torch.Tensor,
                         score_dtype: torch.dtype, form: ScoreForm | None = None) -> tuple[torch.Tensor, ...]:
    """(loss, d loss/d queries, d loss/d candidates, d loss/d positive) of ``shared_negative_softmax_ce``,
    with the scores of ``form`` (default: dot products).

    The two matrix gradients come in ``score_dtype``; the loss and the positive's in float32 (float64 for
    float64 scores).
    """
    form = form or ScoreForm()
    q, c = queries.to(score_dtype), candidates.to(score_dtype)
    columns = c.shape[1]
    pad = candidate_padding(columns, c.dtype, c.device, form)
    if pad:  # callers on the hot path (FusedStep) gather their candidates padded already
        c, candidate_ids = F.pad(c, (0, 0, 0, pad)), pad_candidate_ids(candidate_ids, pad)
    exact = torch.float64 if score_dtype == torch.float64 else torch.float32
    column_bytes = q.shape[0] * q.shape[1] * q.element_size()  # one candidate's column of the block
    if column_bytes * c.shape[1] > SCORE_BLOCK_BYTES:
        # A tile lives as scores, their float32 copy and its exponentials at once.
        tile = SCORE_BLOCK_BYTES // (q.shape[0] * q.shape[1] * (q.element_size() + 2 * exact.itemsize))
        if c.is_cuda and form.matmul:  # aligned tiles too (see candidate_padding)
            tile = max(16, tile - tile % 16)
        loss, grad_q, grad_c, grad_positive = _tiled_softmax_ce_gradients(
            q, c, positive.to(exact), target_ids, candidate_ids, weight.to(exact), max(1, tile), form)
    else:
        scores = form.scores(q, c)
        loss_rows, grad_positive = softmax_rows_(scores, positive.to(exact), target_ids, candidate_ids,
                                                 weight.to(exact), form.squared_l2)
        loss = (loss_rows * weight.to(loss_rows.dtype)).sum()
        grad_q, grad_c = form.backward(scores, q, c)
    return loss, grad_q, grad_c[:, :columns], grad_positive


def to_16_bytes(count: int, dtype: torch.dtype) -> int:
    """Elements to append to ``count`` of ``dtype`` to fill whole 16 bytes (cuBLAS's aligned matmul kernels)."""
    return -count % max(1, 16 // dtype.itemsize)


def candidate_padding(columns: int, dtype: torch.dtype, device: torch.device, form: ScoreForm) -> int:
    """Candidates to append (id -1: left out of the softmax, gradient exactly 0) so that score rows fill whole
    16 bytes.

    cuBLAS's Hopper tensor-core kernels need the block's row length to be a
    multiple of 16 bytes; a 1-vs-all block has a column per node (FB15k-237:
    14,541), and there it fell back to unaligned kernels, 2.1x slower, in the
    scores and in both gradient matmuls that read the block (an H100).
    """
    return to_16_bytes(columns, dtype) if device.type == "cuda" and form.matmul else 0


def pad_candidate_ids(candidate_ids: torch.Tensor, pad: int, value: int = -1) -> torch.Tensor:
    """[G, N] ids (or positions) followed by ``pad`` columns of ``value`` per group."""
    return F.pad(candidate_ids, (0, pad), value=value)


def _masked(target_ids: torch.Tensor, candidate_ids: torch.Tensor) -> torch.Tensor:
    """[G, M, N]: candidates equal to the row's target, or padding (id -1), left out of the softmax."""
    return (target_ids[:, :, None] == candidate_ids[:, None, :]) | (candidate_ids < 0)[:, None, :]


def _tiled_softmax_ce_gradients(q, c, positive, target_ids, candidate_ids, weight, tile: int, form: ScoreForm):
    """``softmax_ce_gradients`` over candidate tiles of ``tile``: no [G, M, N] block is ever held
    (d/d queries comes in float32: a sum over tiles).

    Pass 1 keeps per row the running max and sum of exponentials (the positive
    column included, candidates equal to the target masked); pass 2 recomputes
    each tile's scores and turns them into the weighted softmax, adding
    its d/d queries (P C for dot products) and writing the tile's d/d candidates.
    """
    def raw_scores(start):
        return form.scores(q, c[:, start:start + tile]).to(positive.dtype)

    def tile_scores(start):
        ids = candidate_ids[:, start:start + tile]
        s = raw_scores(start)
        if form.squared_l2:
            s = -s.clamp_min(0).sqrt()
        return s.masked_fill(_masked(target_ids, ids), float("-inf"))

    top, total = positive.clone(), torch.ones_like(positive)
    for start in range(0, c.shape[1], tile):
        s = tile_scores(start)
        new_top = torch.maximum(top, s.amax(-1))
        total = total * torch.exp(top - new_top) + torch.exp(s - new_top[..., None]).sum(-1)
        top = new_top
    log_total = top + torch.log(total)
    grad_queries = torch.zeros(q.shape, dtype=positive.dtype, device=q.device)  # summed over tiles in float32
    grad_candidates = torch.empty_like(c)
    for start in range(0, c.shape[1], tile):
        s = tile_scores(start)
        p = torch.exp(s - log_total[..., None]) * weight[..., None]
        if form.squared_l2:  # d loss / d squared distance
            p = p * _squared_l2_gradient(s)
        tile_q, tile_c = form.backward(p.to(q.dtype), q, c[:, start:start + tile])
        grad_queries += tile_q.to(grad_queries.dtype)
        grad_candidates[:, start:start + tile] = tile_c
    loss = ((log_total - positive) * weight).sum()
    return loss, grad_queries, grad_candidates, (torch.exp(positive - log_total) - 1) * weight


def softmax_rows_(scores: torch.Tensor, positive: torch.Tensor, target_ids: torch.Tensor,
                  candidate_ids: torch.Tensor, weight: torch.Tensor,
                  squared_l2: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row: loss, and d loss / d positive; ``scores`` becomes weight * d loss / d scores in place.

    ``squared_l2``: ``scores`` holds squared distances, scored as -distance;
    it becomes d loss / d squared distance."""
    if scores.is_cuda and triton is not None and scores.dtype != torch.float64:
        return _softmax_rows_triton(scores, positive, target_ids, candidate_ids, weight, squared_l2=squared_l2)
    s = scores.to(positive.dtype)  # scores themselves where the dtypes agree: the passes below work in place
    if squared_l2:
        s = -s.clamp_min(0).sqrt()
    # In place: on a CPU each pass over the block is memory traffic, and each new block an allocation.
    grad = s.clone() if squared_l2 else s  # s is still needed for the chain rule through sqrt
    grad.masked_fill_(_masked(target_ids, candidate_ids), float("-inf"))
    top = torch.maximum(grad.amax(-1), positive)
    total = grad.sub_(top[..., None]).exp_().sum(-1) + torch.exp(positive - top)
    log_total = top + torch.log(total)
    grad.mul_((weight / total)[..., None])
    if squared_l2:
        grad.mul_(_squared_l2_gradient(s))
    if grad is not scores:
        scores.copy_(grad)
    return log_total - positive, (torch.exp(positive - log_total) - 1) * weight


def _squared_l2_gradient(scores: torch.Tensor) -> torch.Tensor:
    """d (-sqrt(x)) / d x = 1 / (2 score) for scores -sqrt(x); 0 at distance 0, as autograd's norm."""
    return torch.where(scores < 0, 0.5 / scores, torch.zeros_like(scores))


if triton is not None:
    @triton.jit
    def _scores_of(loaded, SQUARED_L2: tl.constexpr):
        """float32 scores of a loaded tile: as stored, or -sqrt of stored squared distances."""
        s = loaded.to(tl.float32)
        if SQUARED_L2:
            s = tl.where(s == float("-inf"), s, -tl.sqrt(tl.maximum(s, 0.0)))  # padding stays -inf
        return s

    @triton.jit
    def _squared_l2_factor(s):
        """d (-sqrt(x)) / d x for scores s = -sqrt(x): 1 / (2 s), 0 at distance 0."""
        return tl.where(s < 0.0, 0.5 / tl.minimum(s, -1e-30), 0.0)

    @triton.jit
    def _softmax_rows_kernel(scores, positive, target_ids, candidate_ids, weight, loss, grad_positive,
                             num_candidates, rows_per_group, ROWS: tl.constexpr, BLOCK: tl.constexpr,
                             ONE_BLOCK: tl.constexpr, VECTOR: tl.constexpr, SQUARED_L2: tl.constexpr):
        # ROWS rows of one group per program: they share the group's candidate ids, loaded once.
        row = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
        group = (tl.program_id(0).to(tl.int64) * ROWS) // rows_per_group
        target = tl.load(target_ids + row)[:, None]
        pos = tl.load(positive + row)
        offsets = row[:, None] * num_candidates
        if VECTOR > 1:  # rows start on 16 bytes: vector loads and stores
            offsets = tl.multiple_of(offsets, (VECTOR, 1))
        row_scores = scores + offsets
        group_ids = candidate_ids + group * num_candidates
        cols = tl.arange(0, BLOCK)
        if ONE_BLOCK:  # the whole row in registers: one read and one write of the scores
            inside = cols < num_candidates
            s = _scores_of(tl.load(row_scores + cols[None, :], mask=inside[None, :], other=float("-inf")),
                           SQUARED_L2)
            ids = tl.load(group_ids + cols, mask=inside, other=-1)[None, :]
            s = tl.where((ids == target) | (ids < 0), float("-inf"), s)
            top = tl.maximum(tl.max(s, 1), pos)
            log_total = top + tl.log(tl.sum(tl.exp(s - top[:, None]), 1) + tl.exp(pos - top))
        else:  # pass 1: running max and sum of exponentials (online softmax)
            top = pos
            total = tl.full((ROWS,), 1.0, tl.float32)
            for start in range(0, num_candidates, BLOCK):
                inside = start + cols < num_candidates
                s = _scores_of(tl.load(row_scores + start + cols[None, :], mask=inside[None, :],
                                       other=float("-inf")), SQUARED_L2)
                ids = tl.load(group_ids + start + cols, mask=inside, other=-1)[None, :]
                s = tl.where((ids == target) | (ids < 0), float("-inf"), s)
                new_top = tl.maximum(top, tl.max(s, 1))
                total = total * tl.exp(top - new_top) + tl.sum(tl.exp(s - new_top[:, None]), 1)
                top = new_top
            log_total = top + tl.log(total)
        w = tl.load(weight + row)
        if ONE_BLOCK:
            p = tl.exp(s - log_total[:, None]) * w[:, None]  # masked candidates: exp(-inf) = 0
            if SQUARED_L2:
                p = p * _squared_l2_factor(s)
            tl.store(row_scores + cols[None, :], p.to(scores.dtype.element_ty), mask=inside[None, :])
        else:  # pass 2: the weighted softmax of every candidate, in place
            for start in range(0, num_candidates, BLOCK):
                inside = start + cols < num_candidates
                s = _scores_of(tl.load(row_scores + start + cols[None, :], mask=inside[None, :],
                                       other=float("-inf")), SQUARED_L2)
                ids = tl.load(group_ids + start + cols, mask=inside, other=-1)[None, :]
                p = tl.where((ids == target) | (ids < 0), 0.0, tl.exp(s - log_total[:, None])) * w[:, None]
                if SQUARED_L2:
                    p = p * _squared_l2_factor(s)
                tl.store(row_scores + start + cols[None, :], p.to(scores.dtype.element_ty), mask=inside[None, :])
        tl.store(loss + row, log_total - pos)
        tl.store(grad_positive + row, (tl.exp(pos - log_total) - 1.0) * w)


def _softmax_rows_triton(scores, positive, target_ids, candidate_ids, weight, rows=None, num_warps=None,
                         squared_l2=False):
    """``rows`` (rows per program) and ``num_warps`` override the tuned choice (bench/kernels.py sweeps them)."""
    groups, rows_per_group, num_candidates = scores.shape
    loss = torch.empty(groups, rows_per_group, device=scores.device, dtype=torch.float32)
    grad_positive = torch.empty_like(loss)
    block = min(1024, triton.next_power_of_2(num_candidates))
    if rows is None or rows_per_group % rows:
        rows, num_warps = next((r, w) for r, w in SOFTMAX_TILES if rows_per_group % r == 0)
    per_16_bytes = 16 // scores.element_size()
    _softmax_rows_kernel[(groups * rows_per_group // rows,)](
        scores, positive.contiguous(), target_ids.contiguous(), candidate_ids.contiguous(), weight.contiguous(),
        loss, grad_positive, num_candidates, rows_per_group, ROWS=rows, BLOCK=block,
        # (Triton 3 fails to compile the alignment hint on a [1, 1] tensor: no hint for one row per program.)
        ONE_BLOCK=num_candidates <= block,
        VECTOR=per_16_bytes if num_candidates % per_16_bytes == 0 and rows > 1 else 1, SQUARED_L2=squared_l2,
        num_warps=num_warps or 4)
    return loss, grad_positive
