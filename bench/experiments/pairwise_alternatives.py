"""Two rewrites of the TransE-L1 score block, timed against the shipped float32 kernel (one GPU).

    python bench/experiments/pairwise_alternatives.py --json bench/results/gpu-pairwise-alternatives.json

The block is the step's: 10 groups of 10,000 queries against 1,000 candidates, dim 100 and 400.
Each row gives the median time and the largest absolute and relative error against a float64 reference.

- ``half2``: the difference, its absolute value and the running sum in packed half precision, two
  coordinates per instruction (PTX f16x2), flushed into float32 every ``inner`` chunks of ``BK``
  coordinates: half the arithmetic instructions per (query, candidate, coordinate) triple, plus the
  conversions and flushes (instructions not counted).
- ``outer``: one coordinate at a time, as an outer product of a query column and a candidate column
  into a [BM, BN] float32 accumulator (the SGEMM loop shape), from coordinate-major copies of the rows;
  the copies' cost is timed apart (``transpose_ms``).

Neither is shipped: the lab notes (`git show 4a3116a:bench/RESULTS.md`) (eleventh session) say why.
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

from kernels import time_ms  # noqa: E402  (bench/kernels.py)
from marius_py.step import pairwise  # noqa: E402

HALF2_TILES = [(32, 32, 8, 4, 2), (32, 64, 8, 4, 8), (64, 32, 8, 4, 8), (32, 32, 16, 4, 4)]  # BM, BN, BK, warps, inner
OUTER_TILES = [(64, 32, 2), (128, 64, 4), (64, 64, 4)]  # BM, BN, warps
UNROLL = 4  # coordinates per step of the outer kernel's loop; dim must be a multiple


@triton.jit
def _add_abs_difference_half2(a, b, total):
    """total + |a - b| on packed halves."""
    return tl.inline_asm_elementwise(
        "{ .reg .b32 t; sub.f16x2 t, $1, $2; abs.f16x2 t, t; add.f16x2 $0, $3, t; }",
        "=r,r,r,r", [a, b, total], dtype=tl.float16, is_pure=True, pack=2)


@triton.jit
def _scores_half2(queries, candidates, scores, num_queries, num_candidates, dim, q_group, q_row, c_group, c_row,
                  BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, INNER: tl.constexpr):
    group, rows, cols = pairwise.score_tile(num_queries, num_candidates, BM, BN)
    q_rows = queries + group * q_group + tl.minimum(rows, num_queries - 1).to(tl.int64)[:, None] * q_row
    c_rows = candidates + group * c_group + tl.minimum(cols, num_candidates - 1).to(tl.int64)[:, None] * c_row
    total = tl.zeros((BM, BN, BK), tl.float32)
    for start in range(0, dim, BK * INNER):
        part = tl.zeros((BM, BN, BK), tl.float16)  # a few chunks in half precision, then into float32
        for chunk in tl.static_range(INNER):
            k = start + chunk * BK + tl.arange(0, BK)
            inside = (k < dim)[None, :]
            q = tl.load(q_rows + k[None, :], mask=inside, other=0.0).to(tl.float16)
            c = tl.load(c_rows + k[None, :], mask=inside, other=0.0).to(tl.float16)
            part = _add_abs_difference_half2(tl.broadcast_to(q[:, None, :], (BM, BN, BK)),
                                             tl.broadcast_to(c[None, :, :], (BM, BN, BK)), part)
        total += part.to(tl.float32)
    out = scores + group * num_queries * num_candidates + rows.to(tl.int64)[:, None] * num_candidates
    tl.store(out + cols[None, :], -tl.sum(total, axis=2),
             mask=(rows < num_queries)[:, None] & (cols < num_candidates)[None, :])


@triton.jit
def _scores_outer(queries_t, candidates_t, scores, num_queries, num_candidates, dim, q_group, q_coordinate,
                  c_group, c_coordinate, BM: tl.constexpr, BN: tl.constexpr, UNROLL: tl.constexpr):
    group, rows, cols = pairwise.score_tile(num_queries, num_candidates, BM, BN)
    q_column = queries_t + group * q_group + tl.minimum(rows, num_queries - 1)
    c_column = candidates_t + group * c_group + tl.minimum(cols, num_candidates - 1)
    total = tl.zeros((BM, BN), tl.float32)
    for start in range(0, dim, UNROLL):
        for step in tl.static_range(UNROLL):
            a = tl.load(q_column + (start + step) * q_coordinate)
            b = tl.load(c_column + (start + step) * c_coordinate)
            total += tl.abs(a[:, None] - b[None, :])
    out = scores + group * num_queries * num_candidates + rows.to(tl.int64)[:, None] * num_candidates
    tl.store(out + cols[None, :], -total, mask=(rows < num_queries)[:, None] & (cols < num_candidates)[None, :])


def half2_scores(q, c, tile):
    block_m, block_n, block_k, warps, inner = tile
    groups, num_queries, dim = q.shape
    num_candidates = c.shape[1]
    scores = torch.empty(groups, num_queries, num_candidates, device=q.device)
    grid = (groups * triton.cdiv(num_queries, block_m) * triton.cdiv(num_candidates, block_n),)
    _scores_half2[grid](q, c, scores, num_queries, num_candidates, dim, q.stride(0), q.stride(1), c.stride(0),
                        c.stride(1), BM=block_m, BN=block_n, BK=block_k, INNER=inner, num_warps=warps)
    return scores


def outer_scores(q_t, c_t, tile):
    block_m, block_n, warps = tile
    groups, dim, num_queries = q_t.shape
    assert dim % UNROLL == 0, f"the outer kernel steps {UNROLL} coordinates at a time; dim {dim} is not a multiple"
    num_candidates = c_t.shape[2]
    scores = torch.empty(groups, num_queries, num_candidates, device=q_t.device)
    grid = (groups * triton.cdiv(num_queries, block_m) * triton.cdiv(num_candidates, block_n),)
    _scores_outer[grid](q_t, c_t, scores, num_queries, num_candidates, dim, q_t.stride(0), q_t.stride(1),
                        c_t.stride(0), c_t.stride(1), BM=block_m, BN=block_n, UNROLL=UNROLL, num_warps=warps)
    return scores


def coordinate_major(rows: torch.Tensor) -> torch.Tensor:
    return rows.transpose(1, 2).contiguous()


def errors(scores: torch.Tensor, reference: torch.Tensor) -> dict:
    difference = (scores.double() - reference).abs()
    return {"max_abs_error": difference.max().item(), "max_rel_error": (difference / reference.abs()).max().item()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=10)
    parser.add_argument("--queries", type=int, default=10_000)
    parser.add_argument("--candidates", type=int, default=1000)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    torch.manual_seed(0)
    rows = []
    for dim in (100, 400):
        # TransE-scale rows: normal with standard deviation 0.3
        q = torch.randn(args.groups, args.queries, dim, device="cuda") * 0.3
        c = torch.randn(args.groups, args.candidates, dim, device="cuda") * 0.3
        reference = pairwise.pairwise_scores(q.double(), c.double(), dim, "l1")
        shipped = {"variant": "shipped float32", "dim": dim, "tile": list(pairwise.SCORE_TILE),
                   "ms": time_ms(lambda: pairwise.pairwise_scores(q, c, dim, "l1")),
                   **errors(pairwise.pairwise_scores(q, c, dim, "l1"), reference)}
        rows.append(shipped)
        for tile in HALF2_TILES:
            rows.append({"variant": "half2", "dim": dim, "tile": list(tile),
                         "ms": time_ms(lambda: half2_scores(q, c, tile)),
                         **errors(half2_scores(q, c, tile), reference)})
        q_t, c_t = coordinate_major(q), coordinate_major(c)
        transpose_ms = time_ms(lambda: (coordinate_major(q), coordinate_major(c)))
        for tile in OUTER_TILES:
            rows.append({"variant": "outer", "dim": dim, "tile": list(tile), "transpose_ms": transpose_ms,
                         "ms": time_ms(lambda: outer_scores(q_t, c_t, tile)),
                         **errors(outer_scores(q_t, c_t, tile), reference)})
        for row in rows[-1 - len(HALF2_TILES) - len(OUTER_TILES):]:
            row["speedup"] = shipped["ms"] / (row["ms"] + row.get("transpose_ms", 0.0))
    print(f"{'variant':<16} {'dim':>4} {'tile':<20} {'ms':>7} {'speedup':>8} {'max abs err':>12} {'max rel err':>12}")
    for row in rows:
        print(f"{row['variant']:<16} {row['dim']:>4} {str(row['tile']):<20} {row['ms']:7.3f} {row['speedup']:7.2f}x "
              f"{row['max_abs_error']:12.2e} {row['max_rel_error']:12.2e}")
    if args.json:
        Path(args.json).write_text(json.dumps({"device": torch.cuda.get_device_name(), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
