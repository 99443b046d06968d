"""Distance score blocks and their gradients (``pairwise.py``'s L1 and modulus) as CUDA C++ compiled at run
time (NVRTC), for float32 CUDA blocks.

The Triton kernels of ``pairwise.py`` hold a [BM, BN, BK] broadcast per program and reach about 35-40% of
the GPU's instruction issue rate on the L1 triple loop. These kernels keep SGEMM's shape instead: each
thread owns a register micro-tile of outputs and streams shared-memory columns through it; for L1, 2
instructions a (query, candidate, coordinate) triple for the scores and 3 for each gradient (difference,
sign-bit flip of the weight, add). On one H100 at the step's block (10 x 10,000 x 1,000), L1: scores 1.6 ->
0.96 ms at d=100 and 6.4 -> 3.3 ms at d=400; both gradients 5.2 -> 3.8 ms and 16.7 -> 12.2 ms; the modulus
kernels gain 1.1-1.3x (``bench/pairwise_cuda.py``, docs/design.md).

NVRTC comes with CUDA builds of torch and ``torch.cuda._compile_kernel`` (torch >= 2.8) compiles and
launches through it: no CUDA toolkit and no build step, the source ships as text as Triton's does. Where
that function is missing (silently: torch < 2.8 is supported), compilation fails (warned once), a size
exceeds the kernels' 32-bit arguments or CUDA's grid, or MARIUS_PY_NVRTC is 0 (or false, off, no),
``serves`` says no and ``pairwise.py`` takes its Triton kernels.

Conventions are the Triton kernels': columns >= dim are ignored and get zero gradients; at an exact L1 tie the
sign bit of q_k - c_k (+0: +1) decides the subgradient; the modulus adds 1e-12 under each square root, and
both take the approximate square roots (PTX sqrt.approx / rsqrt.approx) Triton's tl.sqrt and tl.rsqrt do.
"""

from __future__ import annotations

import os
import threading
import warnings

import torch

OPT_OUT = "MARIUS_PY_NVRTC"
INT32_MAX = 2**31 - 1

# Defines: MODULUS (0: L1; 1: RotatE's modulus, real parts in columns [0, imag_offset), imaginary parts from
# imag_offset), MIN_BLOCKS (the launch bound's blocks per SM, which caps registers), KERNEL_NAME.
SCORES_SOURCE = r"""
#if MODULUS
#define KT 4  // coordinates a tile: complex ones, their 4 real parts then their 4 imaginary parts in 8 columns
#else
#define KT 8
#endif
extern "C" __global__ void __launch_bounds__(256, MIN_BLOCKS)
KERNEL_NAME(const float* __restrict__ q, const float* __restrict__ c, float* __restrict__ s,
            int M, int N, int coordinates, int imag_offset, int q_group, int q_row, int c_group, int c_row)
{
    // A 128 x 128 tile of group blockIdx.z. Thread (ty, tx) owns rows {ty*4..+3, 64+ty*4..+3} and the same
    // columns: 64 sums, fed from shared columns (float4 reads without bank conflicts).
    __shared__ __align__(16) float sq[8][128];
    __shared__ __align__(16) float sc[8][128];
    const int g = blockIdx.z, m0 = blockIdx.y * 128, n0 = blockIdx.x * 128;
    const int tid = threadIdx.x, tx = tid & 15, ty = tid >> 4;
    const int lrow = tid >> 1, half = tid & 1;  // this thread loads 4 of the tile's 8 columns of row lrow
#if MODULUS
    #define COORDINATE(k0, i) ((k0) + (i))
    #define COLUMN(k0, i) ((k0) + (i) + half * imag_offset)
#else
    #define COORDINATE(k0, i) ((k0) + half * 4 + (i))
    #define COLUMN(k0, i) COORDINATE(k0, i)
#endif
    // Rows past the block read the last row: their sums are computed and never stored.
    const float* qrow = q + (long long)g * q_group + (long long)min(m0 + lrow, M - 1) * q_row;
    const float* crow = c + (long long)g * c_group + (long long)min(n0 + lrow, N - 1) * c_row;
    float acc[8][8];
    #pragma unroll
    for (int i = 0; i < 8; ++i)
        #pragma unroll
        for (int j = 0; j < 8; ++j) acc[i][j] = 0.f;
    float pq[4], pc[4];  // the next columns, loaded while the current ones compute
    #pragma unroll
    for (int i = 0; i < 4; ++i) {  // coordinates past the last are 0 on both sides
        pq[i] = COORDINATE(0, i) < coordinates ? qrow[COLUMN(0, i)] : 0.f;
        pc[i] = COORDINATE(0, i) < coordinates ? crow[COLUMN(0, i)] : 0.f;
    }
    for (int k0 = 0; k0 < coordinates; k0 += KT) {
        #pragma unroll
        for (int i = 0; i < 4; ++i) { sq[half * 4 + i][lrow] = pq[i]; sc[half * 4 + i][lrow] = pc[i]; }
        __syncthreads();
        if (k0 + KT < coordinates) {
            #pragma unroll
            for (int i = 0; i < 4; ++i) {
                bool inside = COORDINATE(k0 + KT, i) < coordinates;
                pq[i] = inside ? qrow[COLUMN(k0 + KT, i)] : 0.f;
                pc[i] = inside ? crow[COLUMN(k0 + KT, i)] : 0.f;
            }
        }
#if MODULUS
        #pragma unroll
        for (int kk = 0; kk < 4; ++kk) {
            float ar[8], ai[8], br[8], bi[8];
            LOAD8(ar, sq[kk], ty); LOAD8(ai, sq[4 + kk], ty); LOAD8(br, sc[kk], tx); LOAD8(bi, sc[4 + kk], tx);
            #pragma unroll
            for (int i = 0; i < 8; ++i)
                #pragma unroll
                for (int j = 0; j < 8; ++j) {
                    float dr = ar[i] - br[j], di = ai[i] - bi[j];
                    acc[i][j] += sqrt_approx(fmaf(di, di, fmaf(dr, dr, MODULUS_EPS)));
                }
        }
#else
        #pragma unroll
        for (int kk = 0; kk < 8; ++kk) {
            float a[8], b[8];
            LOAD8(a, sq[kk], ty); LOAD8(b, sc[kk], tx);
            #pragma unroll
            for (int i = 0; i < 8; ++i)
                #pragma unroll
                for (int j = 0; j < 8; ++j) acc[i][j] += fabsf(a[i] - b[j]);
        }
#endif
        __syncthreads();
    }
#if MODULUS  // each padded coordinate of the last tile added sqrt(eps)
    const float padding = ((coordinates + KT - 1) / KT * KT - coordinates) * sqrt_approx(MODULUS_EPS);
#else
    const float padding = 0.f;
#endif
    store_score_tile(s + (long long)g * M * N, acc, padding, m0, n0, ty, tx, M, N);
}
"""

# Defines as the scores', and X_MINUS_Y (1: d = x - y; 0: d = y - x).
GRADIENT_SOURCE = r"""
extern "C" __global__ void __launch_bounds__(256, MIN_BLOCKS)
KERNEL_NAME(const float* __restrict__ w, const float* __restrict__ x, const float* __restrict__ y,
            float* __restrict__ out, int A, int B, int coordinates, int imag_offset, int w_group, int w_a, int w_b,
            int x_group, int x_row, int y_group, int y_row, int out_group, int out_row, int out_split,
            int b_per_split)
{
    // out[split, g, a, k] = (X_MINUS_Y ? -1 : 1) * sum over this split's b of w(a, b) * D(d), d the difference
    // of coordinate k: L1: D = +-1 by d's sign bit (+0 counts as positive), as a flip of w's sign bit;
    // modulus: D = d / m per part, m the modulus of the complex difference.
    // Block: 128 rows x 32 coordinates. Thread (ta, tk) owns rows ta*4..+3 and coordinates tk*4..+3, its x
    // values in registers.
    __shared__ __align__(16) float sw[16][132];  // padded: the b-contiguous loads store with 2-way bank conflicts, not 16
    __shared__ __align__(16) float sy[16][32];
#if MODULUS
    __shared__ __align__(16) float syi[16][32];
#endif
    const int a_tiles = (A + 127) / 128;
    const int g = blockIdx.z, split = blockIdx.y / a_tiles, a0 = (blockIdx.y % a_tiles) * 128, k0 = blockIdx.x * 32;
    const int tid = threadIdx.x, tk = tid & 7, ta = tid >> 3;
    const int b_begin = split * b_per_split, b_end = min(B, b_begin + b_per_split);
    const float* wg = w + (long long)g * w_group;
    const float* yg = y + (long long)g * y_group;
    float xv[4][4], acc[4][4];
#if MODULUS
    float xi[4][4], acci[4][4];
#endif
    #pragma unroll
    for (int i = 0; i < 4; ++i) {
        const float* xrow = x + (long long)g * x_group + (long long)min(a0 + ta * 4 + i, A - 1) * x_row;
        #pragma unroll
        for (int j = 0; j < 4; ++j) {
            int k = k0 + tk * 4 + j;
            xv[i][j] = k < coordinates ? xrow[k] : 0.f;
            acc[i][j] = 0.f;
#if MODULUS
            xi[i][j] = k < coordinates ? xrow[imag_offset + k] : 0.f;
            acci[i][j] = 0.f;
#endif
        }
    }
    const bool a_fast = w_a == 1;  // which weight axis is contiguous decides the load order
    float pw[8], py[2];  // the next tile, loaded while this one computes
#if MODULUS
    float pyi[2];
    #define LOAD_Y_IMAG(i, address) pyi[i] = inside ? (address)[imag_offset] : 0.f;
#else
    #define LOAD_Y_IMAG(i, address)
#endif
    // Weights past the split are 0: their pairs add +-0.
    #define LOAD_TILE(bb) \
        _Pragma("unroll") for (int i = 0; i < 8; ++i) { \
            int idx = tid + i * 256, ra = a_fast ? (idx & 127) : (idx >> 4), rb = a_fast ? (idx >> 7) : (idx & 15); \
            int a = min(a0 + ra, A - 1), b = (bb) + rb; \
            pw[i] = b < b_end ? wg[(long long)a * w_a + (long long)b * w_b] : 0.f; \
        } \
        _Pragma("unroll") for (int i = 0; i < 2; ++i) { \
            int idx = tid + i * 256, k = k0 + (idx & 31), b = min((bb) + (idx >> 5), B - 1); \
            bool inside = k < coordinates; \
            const float* address = yg + (long long)b * y_row + k; \
            py[i] = inside ? *address : 0.f; \
            LOAD_Y_IMAG(i, address) \
        }
    LOAD_TILE(b_begin)
    for (int bb0 = b_begin; bb0 < b_end; bb0 += 16) {
        #pragma unroll
        for (int i = 0; i < 8; ++i) {
            int idx = tid + i * 256, ra = a_fast ? (idx & 127) : (idx >> 4), rb = a_fast ? (idx >> 7) : (idx & 15);
            sw[rb][ra] = pw[i];
        }
        #pragma unroll
        for (int i = 0; i < 2; ++i) {
            int idx = tid + i * 256;
            sy[idx >> 5][idx & 31] = py[i];
#if MODULUS
            syi[idx >> 5][idx & 31] = pyi[i];
#endif
        }
        __syncthreads();
        if (bb0 + 16 < b_end) { LOAD_TILE(bb0 + 16) }
        #pragma unroll
        for (int rb = 0; rb < 16; ++rb) {
            float wv[4], yv[4];
            LOAD4(wv, sw[rb], ta); LOAD4(yv, sy[rb], tk);
#if MODULUS
            float yi[4];
            LOAD4(yi, syi[rb], tk);
#endif
            #pragma unroll
            for (int i = 0; i < 4; ++i)
                #pragma unroll
                for (int j = 0; j < 4; ++j) {
                    float d = X_MINUS_Y ? xv[i][j] - yv[j] : yv[j] - xv[i][j];  // chosen at compile time
#if MODULUS
                    float di = X_MINUS_Y ? xi[i][j] - yi[j] : yi[j] - xi[i][j];
                    float scale = wv[i] * rsqrt_approx(fmaf(di, di, fmaf(d, d, MODULUS_EPS)));
                    acc[i][j] = fmaf(scale, d, acc[i][j]);
                    acci[i][j] = fmaf(scale, di, acci[i][j]);
#else
                    acc[i][j] += __int_as_float(__float_as_int(wv[i]) ^ (__float_as_int(d) & 0x80000000));
#endif
                }
        }
        __syncthreads();
    }
    float* o = out + (long long)split * out_split + (long long)g * out_group;
    #pragma unroll
    for (int i = 0; i < 4; ++i) {
        int row = a0 + ta * 4 + i;
        if (row >= A) continue;
        #pragma unroll
        for (int j = 0; j < 4; ++j) {
            int k = k0 + tk * 4 + j;
            if (k >= coordinates) continue;
            // The queries' side (d = q - c) takes -sum: S = -dist.
            o[(long long)row * out_row + k] = X_MINUS_Y ? -acc[i][j] : acc[i][j];
#if MODULUS
            o[(long long)row * out_row + imag_offset + k] = X_MINUS_Y ? -acci[i][j] : acci[i][j];
#endif
        }
    }
}
"""

# Shared by the kernels: float4 reads of a thread's columns in shared rows, the approximate square roots
# Triton's tl.sqrt and tl.rsqrt use, and the score tile's store (bench/pairwise_cuda.py's variant uses it too).
# (MODULUS_EPS is defined from this module's MODULUS_EPS by kernel_source.)
COMMON_SOURCE = r"""
#define LOAD4(v, row, t) { float4 f = *(const float4*)&(row)[(t) * 4]; v[0] = f.x; v[1] = f.y; v[2] = f.z; v[3] = f.w; }
#define LOAD8(v, row, t) { float4 f0 = *(const float4*)&(row)[(t) * 4], f1 = *(const float4*)&(row)[64 + (t) * 4]; \
    v[0] = f0.x; v[1] = f0.y; v[2] = f0.z; v[3] = f0.w; v[4] = f1.x; v[5] = f1.y; v[6] = f1.z; v[7] = f1.w; }
__device__ __forceinline__ float sqrt_approx(float v) { float r; asm("sqrt.approx.f32 %0, %1;" : "=f"(r) : "f"(v)); return r; }
__device__ __forceinline__ float rsqrt_approx(float v) { float r; asm("rsqrt.approx.f32 %0, %1;" : "=f"(r) : "f"(v)); return r; }
// S[row, col] = offset - sums[i][j] for the 128 x 128 score tile at (m0, n0) of one group's [M, N] block:
// thread (ty, tx) owns rows {ty*4..+3, 64+ty*4..+3} and the same columns.
__device__ __forceinline__ void store_score_tile(float* out, const float (&sums)[8][8], float offset, int m0,
                                                 int n0, int ty, int tx, int M, int N) {
    #pragma unroll
    for (int i = 0; i < 8; ++i) {
        int row = m0 + (i < 4 ? ty * 4 + i : 60 + ty * 4 + i);
        if (row >= M) continue;
        #pragma unroll
        for (int j = 0; j < 8; ++j) {
            int col = n0 + (j < 4 ? tx * 4 + j : 60 + tx * 4 + j);
            if (col < N) out[(long long)row * N + col] = offset - sums[i][j];
        }
    }
}
"""

# Launch bounds (blocks per SM) measured fastest on one H100 (bench/pairwise_cuda.py). A higher bound caps the
# registers a thread: L1's gradient spilled at 3 blocks; the modulus gradient (222 registers at 1 block) ran
# 23-36% slower at d=100 when held to 128 registers at 2.
MIN_BLOCKS = {("l1", "scores"): 2, ("l1", "gradient"): 2, ("modulus", "scores"): 2, ("modulus", "gradient"): 1}
SPLIT_MIN_REDUCTION = 256  # a reduction slice of the gradients covers at least this many rows
WAVES = 4  # a gradient launch aims at this many blocks per SM, slicing its reduction when rows are few
KERNELS = ("scores", "grad_queries", "grad_candidates")
GRID_YZ_MAX = 65535  # CUDA's limit on a grid's y and z dimensions (x: 2^31 - 1)
ROWS_PER_BLOCK = 128  # rows of a block in both kernels (the scores' 128 x 128 tile, the gradients' 128 rows)
GRADIENT_COORDINATES_PER_BLOCK = 32  # the gradient kernel's block: 128 rows x 32 coordinates
SWITCHED_OFF = ("0", "false", "off", "no")
MODULUS_EPS = 1e-12  # as RotatE.distance in marius_py/models.py: keeps d m / d diff finite at diff = 0 (pairwise's
                     # torch version takes it from here; its Triton kernels write the same 1e-12)


def kernel_source(kind: str, kernel: str, min_blocks: int | None = None, name: str | None = None) -> str:
    """CUDA source of ``kernel`` ("scores", "grad_queries" or "grad_candidates") for ``kind``, entry ``name``."""
    role = "scores" if kernel == "scores" else "gradient"
    defines = {"MODULUS": int(kind == "modulus"), "X_MINUS_Y": int(kernel == "grad_queries"),
               "MIN_BLOCKS": min_blocks or MIN_BLOCKS[kind, role], "KERNEL_NAME": name or f"{kind}_{kernel}",
               "MODULUS_EPS": f"{MODULUS_EPS!r}f"}
    return "".join(f"#define {key} {value}\n" for key, value in defines.items()) + COMMON_SOURCE + \
        (SCORES_SOURCE if role == "scores" else GRADIENT_SOURCE)


_lock = threading.Lock()
_kernels: dict[tuple[int, str], dict | None] = {}  # (device index, kind) -> kernels, None where compilation failed


def compile_kernel(source: str, name: str):
    """NVRTC through torch (torch >= 2.8), for the current device; raises where that is not possible."""
    return torch.cuda._compile_kernel(source, name)


def enabled() -> bool:
    """Whether these kernels may serve at all: torch can compile them and MARIUS_PY_NVRTC does not say no."""
    return hasattr(torch.cuda, "_compile_kernel") and os.environ.get(OPT_OUT, "1").lower() not in SWITCHED_OFF


def _device_kernels(device: torch.device, kind: str) -> dict | None:
    key = (device.index if device.index is not None else torch.cuda.current_device(), kind)
    if key not in _kernels:
        with _lock:
            if key not in _kernels:
                try:
                    with torch.cuda.device(key[0]):
                        _kernels[key] = {kernel: compile_kernel(kernel_source(kind, kernel), f"{kind}_{kernel}")
                                         for kernel in KERNELS}
                except Exception as error:  # noqa: BLE001 - any failure means: use the Triton kernels
                    warnings.warn(f"the CUDA {kind} kernels did not compile on cuda:{key[0]} ({error}); "
                                  "the Triton kernels serve instead", RuntimeWarning, stacklevel=3)
                    _kernels[key] = None
    return _kernels[key]


def serves(kind: str, *blocks: torch.Tensor) -> bool:
    """Whether these kernels take a ``kind`` block of these float32 CUDA tensors, each [G, rows, ...]: rows of
    unit stride, nothing empty, the integers the kernels take within 32 bits (shapes, strides, and the
    element counts of the query and candidate rows, the last two tensors), the grid within CUDA's limits;
    and the kernels compile on their device."""
    if not enabled():
        return False
    if not all(t.is_cuda and t.dtype == torch.float32 and t.numel() > 0 and t.stride(-1) == 1 for t in blocks):
        return False
    if any(max(*t.shape, *t.stride()) > INT32_MAX for t in blocks) or \
            any(t.numel() > INT32_MAX for t in blocks[-2:]):
        return False
    if any(t.shape[0] > GRID_YZ_MAX or -(-t.shape[1] // ROWS_PER_BLOCK) > GRID_YZ_MAX for t in blocks):
        return False
    return _device_kernels(blocks[0].device, kind) is not None


def scores(queries: torch.Tensor, candidates: torch.Tensor, kind: str, coordinates: int, imag_offset: int,
           compiled=None) -> torch.Tensor:
    """S [G, M, N] = -dist (as ``pairwise.pairwise_scores``); ``coordinates`` and ``imag_offset`` as
    ``pairwise._coordinates`` gives them; ``compiled``: another kernel of the same arguments (benchmarks)."""
    groups, num_queries, num_candidates = queries.shape[0], queries.shape[1], candidates.shape[1]
    out = torch.empty(groups, num_queries, num_candidates, dtype=torch.float32, device=queries.device)
    _launch(compiled or _device_kernels(queries.device, kind)["scores"], queries.device,
            (-(-num_candidates // ROWS_PER_BLOCK), -(-num_queries // ROWS_PER_BLOCK), groups),
            [queries, candidates, out, num_queries, num_candidates, coordinates, imag_offset, queries.stride(0),
             queries.stride(1), candidates.stride(0), candidates.stride(1)])
    return out


def backward(weights: torch.Tensor, queries: torch.Tensor, candidates: torch.Tensor, kind: str, coordinates: int,
             imag_offset: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(grad_queries, grad_candidates) of sum(weights * S) (as ``pairwise.pairwise_backward``)."""
    w_group, w_query, w_candidate = weights.stride()
    layout = (kind, coordinates, imag_offset)
    grad_queries = gradient("grad_queries", weights, queries, candidates, *layout, (w_group, w_query, w_candidate))
    grad_candidates = gradient("grad_candidates", weights, candidates, queries, *layout,
                               (w_group, w_candidate, w_query))
    return grad_queries, grad_candidates


def gradient(side: str, weights, x, y, kind: str, coordinates: int, imag_offset: int,
             weight_strides: tuple[int, int, int], splits: int | None = None, compiled=None) -> torch.Tensor:
    """The gradient of ``side`` ("grad_queries": x = queries, y = candidates; "grad_candidates": the other way
    round); ``weight_strides``: (group, along x, along y). ``splits`` (slices of the reduction over y) and
    ``compiled`` (another kernel of the same arguments) are for benchmarks."""
    groups, rows, others = x.shape[0], x.shape[1], y.shape[1]
    if coordinates == 0:
        return torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    row_blocks = -(-rows // ROWS_PER_BLOCK)
    if splits is None:
        blocks = -(-coordinates // GRADIENT_COORDINATES_PER_BLOCK) * row_blocks * groups
        sms = torch.cuda.get_device_properties(x.device).multi_processor_count
        splits = max(1, min(-(-WAVES * sms // blocks), others // SPLIT_MIN_REDUCTION, GRID_YZ_MAX // row_blocks))
    out = torch.zeros(splits, *x.shape, dtype=torch.float32, device=x.device)  # columns >= dim stay 0
    _launch(compiled or _device_kernels(x.device, kind)[side], x.device,
            (-(-coordinates // GRADIENT_COORDINATES_PER_BLOCK), splits * row_blocks, groups),
            [weights, x, y, out, rows, others, coordinates, imag_offset, *weight_strides, x.stride(0), x.stride(1),
             y.stride(0), y.stride(1), out.stride(1), out.stride(2), out.stride(0), -(-others // splits)])
    return out[0] if splits == 1 else out.sum(0)


def _launch(compiled, device: torch.device, grid: tuple[int, int, int], args: list) -> None:
    # Given no stream, the launcher takes torch.cuda.current_stream(): inside this block, the device's.
    with torch.cuda.device(device):  # the kernel belongs to this device's context
        compiled(grid=grid, block=(256, 1, 1), args=args)
