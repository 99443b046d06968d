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
"""

from __future__ import annotations

import torch

try:  # Triton ships with CUDA builds of torch; CPU builds use the torch-ops path below.
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - depends on the torch build
    triton = None


def shared_negative_softmax_ce(queries: torch.Tensor, candidates: torch.Tensor, positive: torch.Tensor,
                               target_ids: torch.Tensor, candidate_ids: torch.Tensor, weight: torch.Tensor,
                               score_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """sum_r weight_r * (logsumexp([pos_r, S_r with candidates equal to the target masked]) - pos_r).

    queries [G, M, d], candidates [G, N, d], positive/target_ids/weight [G, M],
    candidate_ids [G, N]. Differentiable in queries, candidates and positive.
    """
    if queries.dtype == torch.float64:  # exact checks against dense autograd run in float64
        score_dtype = torch.float64
    return _SharedNegativeSoftmaxCE.apply(queries, candidates, positive, target_ids, candidate_ids, weight,
                                          score_dtype)


class _SharedNegativeSoftmaxCE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, queries, candidates, positive, target_ids, candidate_ids, weight, score_dtype):
        q, c = queries.detach().to(score_dtype), candidates.detach().to(score_dtype)
        scores = torch.bmm(q, c.transpose(1, 2))
        exact = torch.float64 if score_dtype == torch.float64 else torch.float32
        loss_rows, grad_positive = softmax_rows_(scores, positive.detach().to(exact), target_ids, candidate_ids,
                                                 weight.to(exact))
        ctx.grads = (torch.bmm(scores, c).to(queries.dtype),
                     torch.bmm(scores.transpose(1, 2), q).to(candidates.dtype),
                     grad_positive.to(positive.dtype))
        return (loss_rows * weight.to(loss_rows.dtype)).sum().to(positive.dtype)

    @staticmethod
    def backward(ctx, grad):
        grad_queries, grad_candidates, grad_positive = ctx.grads
        del ctx.grads
        return grad_queries * grad, grad_candidates * grad, grad_positive * grad, None, None, None, None


def softmax_rows_(scores: torch.Tensor, positive: torch.Tensor, target_ids: torch.Tensor,
                  candidate_ids: torch.Tensor, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row: loss, and d loss / d positive; ``scores`` becomes weight * d loss / d scores in place."""
    if scores.is_cuda and triton is not None and scores.dtype != torch.float64:
        return _softmax_rows_triton(scores, positive, target_ids, candidate_ids, weight)
    valid = target_ids[:, :, None] != candidate_ids[:, None, :]
    masked = scores.to(positive.dtype).masked_fill(~valid, float("-inf"))
    top = torch.maximum(masked.amax(-1), positive)
    exp = torch.exp(masked - top[..., None])
    total = exp.sum(-1) + torch.exp(positive - top)
    log_total = top + torch.log(total)
    scores.copy_(exp * (weight / total)[..., None])
    return log_total - positive, (torch.exp(positive - log_total) - 1) * weight


if triton is not None:
    @triton.jit
    def _softmax_rows_kernel(scores, positive, target_ids, candidate_ids, weight, loss, grad_positive,
                             num_candidates, rows_per_group, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        group = row // rows_per_group
        target = tl.load(target_ids + row)
        pos = tl.load(positive + row)
        row_scores = scores + row * num_candidates
        group_ids = candidate_ids + group * num_candidates
        # Pass 1: running max and sum of exponentials (online softmax).
        top = pos
        total = 1.0
        for start in range(0, num_candidates, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            inside = cols < num_candidates
            s = tl.load(row_scores + cols, mask=inside, other=float("-inf")).to(tl.float32)
            ids = tl.load(group_ids + cols, mask=inside, other=-1)
            s = tl.where(ids == target, float("-inf"), s)
            new_top = tl.maximum(top, tl.max(s, 0))
            total = total * tl.exp(top - new_top) + tl.sum(tl.exp(s - new_top), 0)
            top = new_top
        log_total = top + tl.log(total)
        w = tl.load(weight + row)
        # Pass 2: the weighted softmax of every candidate, in place (rows of ~1000 stay in L2).
        for start in range(0, num_candidates, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            inside = cols < num_candidates
            s = tl.load(row_scores + cols, mask=inside, other=float("-inf")).to(tl.float32)
            ids = tl.load(group_ids + cols, mask=inside, other=-1)
            p = tl.where(ids == target, 0.0, tl.exp(s - log_total)) * w
            tl.store(row_scores + cols, p.to(row_scores.dtype.element_ty), mask=inside)
        tl.store(loss + row, log_total - pos)
        tl.store(grad_positive + row, (tl.exp(pos - log_total) - 1.0) * w)


def _softmax_rows_triton(scores, positive, target_ids, candidate_ids, weight):
    groups, rows_per_group, num_candidates = scores.shape
    loss = torch.empty(groups, rows_per_group, device=scores.device, dtype=torch.float32)
    grad_positive = torch.empty_like(loss)
    block = min(1024, triton.next_power_of_2(num_candidates))
    _softmax_rows_kernel[(groups * rows_per_group,)](
        scores, positive.contiguous(), target_ids.contiguous(), candidate_ids.contiguous(), weight.contiguous(),
        loss, grad_positive, num_candidates, rows_per_group, BLOCK=block, num_warps=4 if block >= 512 else 2)
    return loss, grad_positive
