"""Tried and dropped: the score block streamed through on-chip memory, in the manner of flash attention.

    python bench/experiments/streamed_score_block.py --json bench/results/gpu-streamed-score-block.json

Kept so that its figure in docs/design.md can be rerun. The trainer's
``softmax_ce_gradients`` materialises the [G, M, N] score block (cuBLAS
matmuls and a Triton row kernel); this version never writes it, at the cost
of five tile matmuls instead of three. On an H100 at the issue's block
(2 x 10 chunks x 5,000 queries x 1,000 candidates, d=104, bfloat16) it ran
1.40-1.87 ms over the tile choices below against 0.56 ms materialised.
Prints a table: each tile choice's time, and the largest difference from the
materialised gradients.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # bench/, for its shared helpers

from marius_py.step.fused_loss import softmax_ce_gradients  # noqa: E402


def streamed_softmax_ce(queries, candidates, positive, target_ids, candidate_ids, weight):
    """``softmax_ce_gradients`` without the [G, M, N] block in memory, in the manner of flash attention.

    Kernel 1, per block of queries: scores against every candidate block, a
    running log-sum-exp, then a second sweep that turns scores into
    probabilities and accumulates dQ = P C. Kernel 2, per block of candidates
    (and a slice of the queries, added atomically): recomputes P from the
    saved log-sum-exp and accumulates dC = P^T Q. Four matrix products of
    [M, N, d] instead of three, but no block written or read: at d=100 memory
    traffic, not arithmetic, bounded the materialised version.
    """
    groups, rows, width = queries.shape
    num_candidates = candidates.shape[1]
    ieee = queries.dtype == torch.float32 and torch.get_float32_matmul_precision() == "highest"
    q, c = queries.contiguous(), candidates.contiguous()
    positive, target_ids, candidate_ids, weight = (t.contiguous() for t in (positive.float(), target_ids,
                                                                             candidate_ids, weight.float()))
    grad_queries = torch.empty_like(q)
    grad_candidates = torch.zeros(c.shape, dtype=torch.float32, device=c.device)
    log_total = torch.empty(groups, rows, dtype=torch.float32, device=q.device)
    loss_rows, grad_positive = torch.empty_like(log_total), torch.empty_like(log_total)
    block_d = max(16, triton.next_power_of_2(width))
    precision = "ieee" if ieee else "tf32"
    block_m, block_n, warps, stages = STREAM_TILES["queries"]
    _streamed_queries_kernel[(triton.cdiv(rows, block_m), groups)](
        q, c, positive, target_ids, candidate_ids, weight, grad_queries, log_total, loss_rows, grad_positive,
        rows, num_candidates, width, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_d,
        PRECISION=precision, num_warps=warps, num_stages=stages)
    block_m, block_n, warps, stages = STREAM_TILES["candidates"]
    programs = groups * triton.cdiv(num_candidates, block_n)
    sms = torch.cuda.get_device_properties(q.device).multi_processor_count
    splits = max(1, min(triton.cdiv(rows, block_m), 8 * sms // programs))  # query slices, added atomically
    _streamed_candidates_kernel[(triton.cdiv(num_candidates, block_n), groups, splits)](
        q, c, target_ids, candidate_ids, weight, log_total, grad_candidates, rows, num_candidates, width,
        triton.cdiv(triton.cdiv(rows, block_m), splits) * block_m,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_d, PRECISION=precision, num_warps=warps,
        num_stages=stages)
    return loss_rows.sum(), grad_queries, grad_candidates.to(q.dtype), grad_positive


# Tiles of the streamed kernels: query rows, candidate rows, warps, pipeline stages.
STREAM_TILES = {"queries": (64, 64, 8, 2), "candidates": (64, 64, 8, 2)}


@triton.jit
def _masked_scores(q, c, ids, target, col_inside, PRECISION: tl.constexpr):
    """Scores of a query tile against a candidate tile; -inf where the candidate is the target or padding."""
    s = tl.dot(q, tl.trans(c), input_precision=PRECISION)
    return tl.where(col_inside[None, :] & (ids[None, :] != target[:, None]), s, float("-inf"))


@triton.jit
def _candidate_tile_scores(q, target, group_candidates, group_ids, start, num_candidates, width, d, d_inside,
                           BLOCK_N: tl.constexpr, PRECISION: tl.constexpr):
    """(candidate tile from ``start``, masked scores of the query tile against it)."""
    n = start + tl.arange(0, BLOCK_N)
    col_inside = n < num_candidates
    c = tl.load(group_candidates + n[:, None] * width + d[None, :], mask=col_inside[:, None] & d_inside[None, :],
                other=0.0)
    ids = tl.load(group_ids + n, mask=col_inside, other=-1)
    return c, _masked_scores(q, c, ids, target, col_inside, PRECISION)


@triton.jit
def _streamed_queries_kernel(queries, candidates, positive, target_ids, candidate_ids, weight, grad_queries,
                             log_total_out, loss_out, grad_positive_out, rows, num_candidates, width,
                             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                             PRECISION: tl.constexpr):
    group = tl.program_id(1).to(tl.int64)
    m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_inside = m < rows
    d = tl.arange(0, BLOCK_D)
    d_inside = d < width
    row = group * rows + m
    q = tl.load(queries + row[:, None] * width + d[None, :], mask=row_inside[:, None] & d_inside[None, :],
                other=0.0)
    target = tl.load(target_ids + row, mask=row_inside, other=-1)
    pos = tl.load(positive + row, mask=row_inside, other=0.0)
    group_candidates = candidates + group * num_candidates * width
    group_ids = candidate_ids + group * num_candidates
    top = pos
    total = tl.full((BLOCK_M,), 1.0, tl.float32)  # the positive's term, exp(pos - top)
    for start in range(0, num_candidates, BLOCK_N):
        c, s = _candidate_tile_scores(q, target, group_candidates, group_ids, start, num_candidates, width, d,
                                      d_inside, BLOCK_N, PRECISION)
        new_top = tl.maximum(top, tl.max(s, 1))
        total = total * tl.exp(top - new_top) + tl.sum(tl.exp(s - new_top[:, None]), 1)
        top = new_top
    log_total = top + tl.log(total)
    w = tl.load(weight + row, mask=row_inside, other=0.0)
    grad = tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float32)
    for start in range(0, num_candidates, BLOCK_N):
        c, s = _candidate_tile_scores(q, target, group_candidates, group_ids, start, num_candidates, width, d,
                                      d_inside, BLOCK_N, PRECISION)
        p = tl.exp(s - log_total[:, None]) * w[:, None]
        grad = tl.dot(p.to(c.dtype), c, grad, input_precision=PRECISION)
    tl.store(grad_queries + row[:, None] * width + d[None, :], grad.to(grad_queries.dtype.element_ty),
             mask=row_inside[:, None] & d_inside[None, :])
    tl.store(log_total_out + row, log_total, mask=row_inside)
    tl.store(loss_out + row, (log_total - pos) * w, mask=row_inside)
    tl.store(grad_positive_out + row, (tl.exp(pos - log_total) - 1.0) * w, mask=row_inside)


@triton.jit
def _streamed_candidates_kernel(queries, candidates, target_ids, candidate_ids, weight, log_total_in,
                                grad_candidates, rows, num_candidates, width, rows_per_split,
                                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                                PRECISION: tl.constexpr):
    group = tl.program_id(1).to(tl.int64)
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_inside = n < num_candidates
    d = tl.arange(0, BLOCK_D)
    d_inside = d < width
    candidate = group * num_candidates + n
    c = tl.load(candidates + candidate[:, None] * width + d[None, :], mask=col_inside[:, None] & d_inside[None, :],
                other=0.0)
    ids = tl.load(candidate_ids + candidate, mask=col_inside, other=-1)
    grad = tl.zeros((BLOCK_N, BLOCK_D), dtype=tl.float32)
    first = tl.program_id(2) * rows_per_split
    for start in range(first, tl.minimum(first + rows_per_split, rows), BLOCK_M):
        m = start + tl.arange(0, BLOCK_M)
        row_inside = m < rows
        row = group * rows + m
        q = tl.load(queries + row[:, None] * width + d[None, :], mask=row_inside[:, None] & d_inside[None, :],
                    other=0.0)
        target = tl.load(target_ids + row, mask=row_inside, other=-1)
        log_total = tl.load(log_total_in + row, mask=row_inside, other=0.0)
        w = tl.load(weight + row, mask=row_inside, other=0.0)  # 0 for padding rows: p = 0
        s = _masked_scores(q, c, ids, target, col_inside, PRECISION)
        p = tl.exp(s - log_total[:, None]) * w[:, None]
        grad = tl.dot(tl.trans(p).to(q.dtype), q, grad, input_precision=PRECISION)
    tl.atomic_add(grad_candidates + candidate[:, None] * width + d[None, :], grad,
                  mask=col_inside[:, None] & d_inside[None, :], sem="relaxed")


TILE_CHOICES = [(64, 64, 4, 2), (64, 64, 8, 2), (64, 64, 8, 3), (128, 64, 8, 2), (128, 64, 8, 3),
                (64, 128, 8, 2), (128, 128, 8, 2), (64, 32, 4, 3)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chunks", type=int, default=10)
    parser.add_argument("--queries", type=int, default=5000)
    parser.add_argument("--candidates", type=int, default=1000)
    parser.add_argument("--width", type=int, default=104)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    groups = 2 * args.chunks
    inputs = (torch.randn(groups, args.queries, args.width, device="cuda").to(torch.bfloat16),
              torch.randn(groups, args.candidates, args.width, device="cuda").to(torch.bfloat16),
              torch.randn(groups, args.queries, device="cuda"),
              torch.randint(10**6, (groups, args.queries), device="cuda"),
              torch.randint(10**6, (groups, args.candidates), device="cuda"),
              torch.full((groups, args.queries), 1e-5, device="cuda"))
    reference = softmax_ce_gradients(*inputs, torch.bfloat16)
    bench = triton.testing.do_bench
    rows = [{"mode": "materialised", "ms": bench(lambda: softmax_ce_gradients(*inputs, torch.bfloat16),
                                                 warmup=50, rep=300, return_mode="median")}]
    for kernel in ("queries", "candidates"):
        for tiles in TILE_CHOICES:
            saved = dict(STREAM_TILES)
            STREAM_TILES[kernel] = tiles
            got = streamed_softmax_ce(*inputs)
            error = max(float((g.float() - r.float()).abs().max()) for g, r in zip(got[1:], reference[1:]))
            ms = bench(lambda: streamed_softmax_ce(*inputs), warmup=50, rep=300, return_mode="median")
            STREAM_TILES.update(saved)
            rows.append({"mode": f"streamed, {kernel} tiles {tiles}", "ms": ms, "max_abs_difference": error})
    for row in rows:
        difference = f"  max |diff| {row['max_abs_difference']:.2e}" if "max_abs_difference" in row else ""
        print(f"{row['mode']:<44} {row['ms'] * 1e3:8.1f} us{difference}")
    if args.json:
        Path(args.json).write_text(json.dumps({"device": torch.cuda.get_device_name(), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
