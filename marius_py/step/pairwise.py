"""Score block and its backward for distance decoders: TransE with L1 distance and RotatE.

Dot-product decoders score G chunks of M queries against N shared candidates with one matmul, S = Q C^T,
and get their gradients from two more. Distance scores have no matmul form: S[g, i, j] = -dist(q_i, c_j)
needs every (query, candidate, coordinate) triple. Autograd of the broadcast formula would hold a
[G, M, N, dim] tensor (tens of GB for a training batch); here the block and the gradients of
sum(weights * S) are computed directly, tile by tile, with explicit formulas:

- ``l1``: dist = sum_k |q_k - c_k|; dS/dq_k = -sign(q_k - c_k), dS/dc_k = +sign(q_k - c_k);
- ``modulus`` (RotatE): columns [0, dim/2) hold real parts, [dim/2, dim) imaginary parts;
  dist = sum_k m_k with m_k = sqrt(re_k^2 + im_k^2 + eps) of the difference q - c;
  dS/dq = -(q - c) / m per part, dS/dc = +(q - c) / m.

Each function has Triton kernels for float32 CUDA inputs and a torch version (CPU, float64, CUDA without
Triton) that the tests use as reference. On float32 CUDA inputs, CUDA C++ kernels compiled at run time
(``pairwise_cuda.py``) come first where torch can compile them: per kernel, L1 1.4-1.9x and modulus
1.1-1.3x faster than the Triton ones (one H100). Columns past ``dim`` (row padding) are ignored and get zero
gradients. At an exact L1 tie (q_k == c_k) the two take different subgradients of |x| at 0: torch's
sign(0) = 0, the kernels the sign bit of the difference (+1 for q_k - c_k = +0).
"""

from __future__ import annotations

import math

import torch

from marius_py.step import pairwise_cuda
from marius_py.pipeline.row_kernels import use_triton

try:  # Triton ships with CUDA builds of torch; CPU builds use the torch versions.
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - depends on the torch build
    triton = None

KINDS = ("l1", "modulus")
MODULUS_EPS = pairwise_cuda.MODULUS_EPS  # (the NVRTC and torch versions' value; Triton's kernels write 1e-12)

# The torch version builds [G, m, n, dim] tiles of at most this many elements.
BROADCAST_ELEMENTS = 1 << 24

# (BM queries, BN candidates, BK coordinates, warps) of the Triton programs. Each keeps a [BM, BN, BK]
# accumulator in registers (two for modulus) and reduces it once, after its loop. Measured on an H100 at
# G=10, M=10000, N=1000: scores at dim=200 2.7 ms (l1) / 4.4 ms (modulus) with 32 x 32 x 8 (an earlier
# sweep); both gradient kernels at dim 100 / 400 (`python bench/kernels.py --pairwise`, one call): l1
# 5.2 / 16.7 ms with 16 x 32 x 16 against 5.7 / 23.4 ms with 16 x 32 x 8; modulus 6.7 / 23.6 ms with
# 16 x 32 x 8 against 7.9 / 24.9 ms with 16 x 32 x 16.
SCORE_TILE = (32, 32, 8, 4)
GRAD_TILE = {"l1": (16, 32, 16, 4), "modulus": (16, 32, 8, 4)}


def pairwise_scores(queries: torch.Tensor, candidates: torch.Tensor, dim: int, kind: str) -> torch.Tensor:
    """queries [G, M, w], candidates [G, N, w] (w >= dim; columns >= dim are ignored) ->
    S [G, M, N] = -dist(q[g, i, :dim], c[g, j, :dim]), float32 (float64 for float64 inputs).

    kind "l1": dist = sum_k |q_k - c_k| over k < dim.
    kind "modulus": columns [0, dim/2) are real parts, [dim/2, dim) imaginary parts (dim even);
        dist = sum_k sqrt((q_re_k - c_re_k)^2 + (q_im_k - c_im_k)^2 + 1e-12).
    """
    _check(queries, candidates, dim, kind)
    if inputs := _compiled_inputs(kind, queries, candidates):
        return pairwise_cuda.scores(*inputs, kind, *_coordinates(dim, kind))
    if _triton_serves(queries, candidates):
        return _scores_triton(queries, candidates, dim, kind)
    return _scores_torch(queries, candidates, dim, kind)


def pairwise_backward(weights: torch.Tensor, queries: torch.Tensor, candidates: torch.Tensor, dim: int,
                      kind: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Gradients of sum_{g,i,j} weights[g,i,j] * S[g,i,j] (S as ``pairwise_scores``) with respect to
    queries and candidates: (grad_queries [G, M, w], grad_candidates [G, N, w]), columns >= dim zero,
    float32 (float64 for float64 inputs). At exact l1 ties the GPU kernels (NVRTC and Triton) and the torch
    version take different subgradients (module docstring)."""
    _check(queries, candidates, dim, kind)
    if weights.shape != (queries.shape[0], queries.shape[1], candidates.shape[1]):
        raise ValueError(f"weights {tuple(weights.shape)} do not match queries {tuple(queries.shape)} "
                         f"and candidates {tuple(candidates.shape)}")
    if inputs := _compiled_inputs(kind, weights, queries, candidates):
        return pairwise_cuda.backward(*inputs, kind, *_coordinates(dim, kind))
    if _triton_serves(queries, candidates):
        return _backward_triton(weights, queries, candidates, dim, kind)
    return _backward_torch(weights, queries, candidates, dim, kind)


def _check(queries: torch.Tensor, candidates: torch.Tensor, dim: int, kind: str) -> None:
    if kind not in KINDS:
        raise ValueError(f"unknown pairwise distance {kind!r}; known: {', '.join(KINDS)}")
    if queries.dim() != 3 or candidates.dim() != 3 or queries.shape[0] != candidates.shape[0]:
        raise ValueError(f"expected queries [G, M, w] and candidates [G, N, w], got {tuple(queries.shape)} "
                         f"and {tuple(candidates.shape)}")
    if not 0 <= dim <= min(queries.shape[2], candidates.shape[2]):
        raise ValueError(f"dim {dim} exceeds the row width of {tuple(queries.shape)} or {tuple(candidates.shape)}")
    if kind == "modulus" and dim % 2:
        raise ValueError(f"modulus distance needs an even dim (real and imaginary halves), got {dim}")


def _compiled_inputs(kind: str, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...] | None:
    """The tensors (rows made unit-stride) where the NVRTC kernels of ``pairwise_cuda`` take this block
    (float32 CUDA tensors); None otherwise (then the Triton or torch version)."""
    if not pairwise_cuda.enabled() or not all(t.is_cuda and t.dtype == torch.float32 for t in tensors):
        return None
    tensors = tuple(_rows_contiguous(t) for t in tensors)
    return tensors if pairwise_cuda.serves(kind, *tensors) else None


def _triton_serves(queries: torch.Tensor, candidates: torch.Tensor) -> bool:
    # Empty blocks would launch empty grids: the torch version returns them at no cost.
    return use_triton(queries) and use_triton(candidates) and queries.numel() > 0 and candidates.numel() > 0


def _result_dtype(*tensors: torch.Tensor) -> torch.dtype:
    return torch.float64 if any(t.dtype == torch.float64 for t in tensors) else torch.float32


# ---- torch version: explicit formulas over bounded [G, m, n, dim] tiles ----

def _tiles(num_queries: int, num_candidates: int, elements_per_pair: int):
    """(query slice, candidate slice) tiles of about BROADCAST_ELEMENTS pair coordinates each, near square."""
    if num_queries == 0 or num_candidates == 0:
        return
    pairs = max(1, BROADCAST_ELEMENTS // max(1, elements_per_pair))
    rows = min(num_queries, max(1, math.isqrt(pairs)))
    cols = min(num_candidates, max(1, pairs // rows))
    rows = min(num_queries, max(1, pairs // cols))  # few candidates: take more queries instead
    for row in range(0, num_queries, rows):
        for col in range(0, num_candidates, cols):
            yield slice(row, row + rows), slice(col, col + cols)


def _distance(q: torch.Tensor, c: torch.Tensor, kind: str) -> torch.Tensor:
    """dist of every pair: q [G, m, dim], c [G, n, dim] -> [G, m, n]."""
    diff = q[:, :, None, :] - c[:, None, :, :]
    if kind == "l1":
        return diff.abs().sum(-1)
    re, im = diff.chunk(2, dim=-1)
    return torch.sqrt(re * re + im * im + MODULUS_EPS).sum(-1)


def _direction(q: torch.Tensor, c: torch.Tensor, kind: str) -> torch.Tensor:
    """d dist / d q of every pair, [G, m, n, dim] (d dist / d c is its negative)."""
    diff = q[:, :, None, :] - c[:, None, :, :]
    if kind == "l1":
        return diff.sign()  # sign(0) = 0, as the gradient of torch.abs
    re, im = diff.chunk(2, dim=-1)
    modulus = torch.sqrt(re * re + im * im + MODULUS_EPS)
    return diff / torch.cat([modulus, modulus], dim=-1)


def _scores_torch(queries, candidates, dim, kind):
    dtype = _result_dtype(queries, candidates)
    q, c = queries[..., :dim].to(dtype), candidates[..., :dim].to(dtype)
    groups, num_queries, num_candidates = q.shape[0], q.shape[1], c.shape[1]
    scores = torch.empty(groups, num_queries, num_candidates, dtype=dtype, device=q.device)
    for rows, cols in _tiles(num_queries, num_candidates, groups * dim):
        scores[:, rows, cols] = -_distance(q[:, rows], c[:, cols], kind)
    return scores


def _backward_torch(weights, queries, candidates, dim, kind):
    dtype = _result_dtype(queries, candidates)
    q, c, w = queries[..., :dim].to(dtype), candidates[..., :dim].to(dtype), weights.to(dtype)
    grad_queries = torch.zeros(queries.shape, dtype=dtype, device=q.device)
    grad_candidates = torch.zeros(candidates.shape, dtype=dtype, device=q.device)
    for rows, cols in _tiles(q.shape[1], c.shape[1], q.shape[0] * dim):
        direction = _direction(q[:, rows], c[:, cols], kind)
        tile_weights = w[:, rows, cols]
        grad_queries[:, rows, :dim] -= torch.einsum("gmn,gmnk->gmk", tile_weights, direction)
        grad_candidates[:, cols, :dim] += torch.einsum("gmn,gmnk->gnk", tile_weights, direction)
    return grad_queries, grad_candidates


# ---- Triton version ----

def _rows_contiguous(tensor: torch.Tensor) -> torch.Tensor:
    """The kernels take group and row strides but need unit stride along a row."""
    return tensor if tensor.stride(-1) == 1 else tensor.contiguous()


def _coordinates(dim: int, kind: str) -> tuple[int, int]:
    """(coordinates the kernels loop over, column offset of the imaginary parts): complex ones for modulus."""
    return (dim // 2, dim // 2) if kind == "modulus" else (dim, 0)


def _scores_triton(queries, candidates, dim, kind):
    q, c = _rows_contiguous(queries), _rows_contiguous(candidates)
    groups, num_queries, num_candidates = q.shape[0], q.shape[1], c.shape[1]
    scores = torch.empty(groups, num_queries, num_candidates, dtype=torch.float32, device=q.device)
    coordinates, imag_offset = _coordinates(dim, kind)
    block_m, block_n, block_k, warps = SCORE_TILE
    grid = (groups * triton.cdiv(num_queries, block_m) * triton.cdiv(num_candidates, block_n),)
    _scores_kernel[grid](q, c, scores, num_queries, num_candidates, coordinates, imag_offset,
                         q.stride(0), q.stride(1), c.stride(0), c.stride(1),
                         MODULUS=kind == "modulus", BM=block_m, BN=block_n, BK=block_k, num_warps=warps)
    return scores


def _backward_triton(weights, queries, candidates, dim, kind):
    q, c, w = _rows_contiguous(queries), _rows_contiguous(candidates), _rows_contiguous(weights)
    groups, num_queries, num_candidates = q.shape[0], q.shape[1], c.shape[1]
    grad_queries = torch.empty(q.shape, dtype=torch.float32, device=q.device)
    grad_candidates = torch.empty(c.shape, dtype=torch.float32, device=q.device)
    grad_queries[..., dim:].zero_()  # the kernels write columns < dim only
    grad_candidates[..., dim:].zero_()
    coordinates, imag_offset = _coordinates(dim, kind)
    if coordinates == 0:
        return grad_queries.zero_(), grad_candidates.zero_()
    block_m, block_n, block_k, warps = GRAD_TILE[kind]
    k_blocks = triton.cdiv(coordinates, block_k)
    shape_args = (num_queries, num_candidates, coordinates, imag_offset, w.stride(0), w.stride(1),
                  q.stride(0), q.stride(1), c.stride(0), c.stride(1))
    meta = {"MODULUS": kind == "modulus", "BM": block_m, "BN": block_n, "BK": block_k, "num_warps": warps}
    _grad_queries_kernel[(groups * triton.cdiv(num_queries, block_m) * k_blocks,)](
        w, q, c, grad_queries, *shape_args, grad_queries.stride(0), grad_queries.stride(1), **meta)
    _grad_candidates_kernel[(groups * triton.cdiv(num_candidates, block_n) * k_blocks,)](
        w, q, c, grad_candidates, *shape_args, grad_candidates.stride(0), grad_candidates.stride(1), **meta)
    return grad_queries, grad_candidates


if triton is not None:
    @triton.jit
    def _row_pointers(base, group, group_stride, index, count, row_stride):
        """[len(index), 1] pointers to the rows ``index`` of one group; indices past ``count`` read the last
        row, so that loads need no row mask (their results are masked out or never stored)."""
        rows = tl.minimum(index, count - 1).to(tl.int64)
        return base + group * group_stride + rows[:, None] * row_stride

    @triton.jit
    def _load_chunk(rows, k, imag_offset, inside, MODULUS: tl.constexpr):
        """(real or only part, imaginary part or None) of coordinates ``k`` of the rows, as [rows, BK]."""
        real = tl.load(rows + k[None, :], mask=inside, other=0.0)
        if MODULUS:
            imag = tl.load(rows + imag_offset + k[None, :], mask=inside, other=0.0)
        else:
            imag = real
        return real, imag

    @triton.jit
    def score_tile(num_queries, num_candidates, BM: tl.constexpr, BN: tl.constexpr):
        """(group, query rows, candidate columns) of this program's [BM, BN] tile of the score block.
        Programs of one query block are adjacent: they sweep the group's candidates, which stay in L2."""
        query_blocks, candidate_blocks = tl.cdiv(num_queries, BM), tl.cdiv(num_candidates, BN)
        pid = tl.program_id(0)
        candidate_block = pid % candidate_blocks
        query_block = (pid // candidate_blocks) % query_blocks
        group = (pid // (candidate_blocks * query_blocks)).to(tl.int64)
        return group, query_block * BM + tl.arange(0, BM), candidate_block * BN + tl.arange(0, BN)

    @triton.jit
    def _scores_kernel(queries, candidates, scores, num_queries, num_candidates, coordinates, imag_offset,
                       q_group_stride, q_row_stride, c_group_stride, c_row_stride,
                       MODULUS: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
        group, rows, cols = score_tile(num_queries, num_candidates, BM, BN)
        q_rows = _row_pointers(queries, group, q_group_stride, rows, num_queries, q_row_stride)
        c_rows = _row_pointers(candidates, group, c_group_stride, cols, num_candidates, c_row_stride)
        # Per-coordinate partial sums, reduced once after the loop: no cross-thread reduction per chunk.
        total = tl.zeros((BM, BN, BK), tl.float32)
        for start in range(0, coordinates, BK):
            k = start + tl.arange(0, BK)
            inside = (k < coordinates)[None, :]
            q_re, q_im = _load_chunk(q_rows, k, imag_offset, inside, MODULUS)
            c_re, c_im = _load_chunk(c_rows, k, imag_offset, inside, MODULUS)
            diff = q_re[:, None, :] - c_re[None, :, :]
            if MODULUS:
                diff_im = q_im[:, None, :] - c_im[None, :, :]
                total += tl.sqrt(diff * diff + diff_im * diff_im + 1e-12)
            else:
                total += tl.abs(diff)
        distance = tl.sum(total, axis=2)
        if MODULUS:  # each padded coordinate of the last chunk added sqrt(eps) = 1e-6
            distance -= (tl.cdiv(coordinates, BK) * BK - coordinates) * 1e-6
        out = scores + group * num_queries * num_candidates + rows.to(tl.int64)[:, None] * num_candidates
        inside = (rows < num_queries)[:, None] & (cols < num_candidates)[None, :]
        tl.store(out + cols[None, :], -distance, mask=inside)

    @triton.jit
    def _weighted_direction(weight, diff, diff_im, MODULUS: tl.constexpr):
        """(weight * d dist / d q) of the real (or only) and imaginary parts, [BM, BN, BK] each."""
        weight = weight[:, :, None]
        if MODULUS:
            scale = weight * tl.rsqrt(diff * diff + diff_im * diff_im + 1e-12)
            real, imag = scale * diff, scale * diff_im
        else:
            # weight * sign(diff) as one bit operation: weight's sign bit flipped by diff's (two compares and
            # two selects before: the gradient kernels took 7.2 ms instead of 5.7 at dim 100). So a tie takes
            # the sign bit of its zero: q_k == c_k gives +0, +weight (about one pair in 10^8 of random float32
            # rows ties); -0 - (+0) = -0 gives -weight. Both are subgradients of |x| at 0, as torch's 0 is.
            sign = diff.to(tl.uint32, bitcast=True) & 0x80000000
            real = (weight.to(tl.uint32, bitcast=True) ^ sign).to(tl.float32, bitcast=True)
            imag = real
        return real, imag

    @triton.jit
    def _store_grad(grad, group, group_stride, index, count, row_stride, k, coordinates, imag_offset,
                    real, imag, MODULUS: tl.constexpr):
        rows = grad + group * group_stride + index.to(tl.int64)[:, None] * row_stride + k[None, :]
        inside = (index < count)[:, None] & (k < coordinates)[None, :]
        tl.store(rows, real, mask=inside)
        if MODULUS:
            tl.store(rows + imag_offset, imag, mask=inside)

    @triton.jit
    def _grad_queries_kernel(weights, queries, candidates, grad, num_queries, num_candidates, coordinates,
                             imag_offset, w_group_stride, w_row_stride, q_group_stride, q_row_stride,
                             c_group_stride, c_row_stride, g_group_stride, g_row_stride,
                             MODULUS: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
        # grad_q[i, k] = -sum_j w[i, j] * d dist / d q_k, over all candidate blocks. Programs of one query
        # block (all its coordinate blocks) are adjacent: they read the same weight tiles, from L2.
        k_blocks, query_blocks = tl.cdiv(coordinates, BK), tl.cdiv(num_queries, BM)
        pid = tl.program_id(0)
        k_block = pid % k_blocks
        query_block = (pid // k_blocks) % query_blocks
        group = (pid // (k_blocks * query_blocks)).to(tl.int64)
        rows = query_block * BM + tl.arange(0, BM)
        k = k_block * BK + tl.arange(0, BK)
        k_inside = (k < coordinates)[None, :]
        q_re, q_im = _load_chunk(_row_pointers(queries, group, q_group_stride, rows, num_queries, q_row_stride),
                                 k, imag_offset, k_inside, MODULUS)
        w_rows = weights + group * w_group_stride + rows.to(tl.int64)[:, None] * w_row_stride
        row_inside = (rows < num_queries)[:, None]
        # Partial sums per (query, candidate lane, coordinate), reduced once after the loop.
        total_re = tl.zeros((BM, BN, BK), tl.float32)
        total_im = tl.zeros((BM, BN, BK), tl.float32)
        for start in range(0, num_candidates, BN):
            cols = start + tl.arange(0, BN)
            # Zero weights outside the block: those pairs add nothing.
            weight = tl.load(w_rows + cols[None, :], mask=row_inside & (cols < num_candidates)[None, :],
                             other=0.0).to(tl.float32)
            c_rows = _row_pointers(candidates, group, c_group_stride, cols, num_candidates, c_row_stride)
            c_re, c_im = _load_chunk(c_rows, k, imag_offset, k_inside, MODULUS)
            part_re, part_im = _weighted_direction(weight, q_re[:, None, :] - c_re[None, :, :],
                                                   q_im[:, None, :] - c_im[None, :, :], MODULUS)
            total_re += part_re
            if MODULUS:
                total_im += part_im
        _store_grad(grad, group, g_group_stride, rows, num_queries, g_row_stride, k, coordinates, imag_offset,
                    -tl.sum(total_re, axis=1), -tl.sum(total_im, axis=1), MODULUS)

    @triton.jit
    def _grad_candidates_kernel(weights, queries, candidates, grad, num_queries, num_candidates, coordinates,
                                imag_offset, w_group_stride, w_row_stride, q_group_stride, q_row_stride,
                                c_group_stride, c_row_stride, g_group_stride, g_row_stride,
                                MODULUS: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
        # grad_c[j, k] = +sum_i w[i, j] * d dist / d q_k, over all query blocks (same tile as the queries').
        k_blocks, candidate_blocks = tl.cdiv(coordinates, BK), tl.cdiv(num_candidates, BN)
        pid = tl.program_id(0)
        k_block = pid % k_blocks
        candidate_block = (pid // k_blocks) % candidate_blocks
        group = (pid // (k_blocks * candidate_blocks)).to(tl.int64)
        cols = candidate_block * BN + tl.arange(0, BN)
        k = k_block * BK + tl.arange(0, BK)
        k_inside = (k < coordinates)[None, :]
        c_rows = _row_pointers(candidates, group, c_group_stride, cols, num_candidates, c_row_stride)
        c_re, c_im = _load_chunk(c_rows, k, imag_offset, k_inside, MODULUS)
        w_cols = weights + group * w_group_stride + cols[None, :]
        col_inside = (cols < num_candidates)[None, :]
        total_re = tl.zeros((BM, BN, BK), tl.float32)  # reduced over queries after the loop
        total_im = tl.zeros((BM, BN, BK), tl.float32)
        for start in range(0, num_queries, BM):
            rows = start + tl.arange(0, BM)
            weight = tl.load(w_cols + rows.to(tl.int64)[:, None] * w_row_stride,
                             mask=(rows < num_queries)[:, None] & col_inside, other=0.0).to(tl.float32)
            q_rows = _row_pointers(queries, group, q_group_stride, rows, num_queries, q_row_stride)
            q_re, q_im = _load_chunk(q_rows, k, imag_offset, k_inside, MODULUS)
            part_re, part_im = _weighted_direction(weight, q_re[:, None, :] - c_re[None, :, :],
                                                   q_im[:, None, :] - c_im[None, :, :], MODULUS)
            total_re += part_re
            if MODULUS:
                total_im += part_im
        _store_grad(grad, group, g_group_stride, cols, num_candidates, g_row_stride, k, coordinates, imag_offset,
                    tl.sum(total_re, axis=0), tl.sum(total_im, axis=0), MODULUS)
