"""TransE-L1's score block and its gradients as CUDA C++ compiled at run time (NVRTC), for float32 CUDA blocks.

The Triton kernels of ``pairwise.py`` hold a [BM, BN, BK] broadcast per program and reach about 35-40% of
the GPU's instruction issue rate on the L1 triple loop. These kernels keep SGEMM's shape instead: each
thread owns a register micro-tile of outputs and streams shared-memory columns through it, 2 instructions
a (query, candidate, coordinate) triple for the scores and 3 for each gradient (difference, sign-bit flip
of the weight, add). On one H100 at the step's block (10 x 10,000 x 1,000): scores 1.6 -> 0.96 ms at d=100
and 6.4 -> 3.3 ms at d=400; both gradients 5.2 -> 3.8 ms and 16.7 -> 12.0 ms (``bench/pairwise_cuda.py``).

NVRTC comes with CUDA builds of torch and ``torch.cuda._compile_kernel`` (torch >= 2.8) compiles and
launches through it: no CUDA toolkit and no build step, the source ships as text as Triton's does. Where
that function is missing, compilation fails, a size exceeds the kernels' 32-bit arguments, or
MARIUS_PY_NVRTC=0, ``serves`` says no and ``pairwise.py`` takes its Triton kernels.

Conventions are the Triton kernels': S = -sum_k |q_k - c_k| over k < dim, gradient columns >= dim zero, and
at an exact tie the sign bit of q_k - c_k (+0: +1) decides the subgradient.
"""

from __future__ import annotations

import os
import threading
import warnings

import torch

OPT_OUT = "MARIUS_PY_NVRTC"
INT32_MAX = 2**31 - 1

SCORES_SOURCE = r"""
extern "C" __global__ void __launch_bounds__(256, 2)
l1_scores(const float* __restrict__ q, const float* __restrict__ c, float* __restrict__ s,
          int M, int N, int dim, int q_group, int q_row, int c_group, int c_row)
{
    // A 128 x 128 tile of group blockIdx.z. Thread (ty, tx) owns rows {ty*4..+3, 64+ty*4..+3} and the same
    // columns: 64 sums, fed from shared columns of 8 coordinates (float4 reads without bank conflicts).
    __shared__ __align__(16) float sq[8][128];
    __shared__ __align__(16) float sc[8][128];
    const int g = blockIdx.z, m0 = blockIdx.y * 128, n0 = blockIdx.x * 128;
    const int tid = threadIdx.x, tx = tid & 15, ty = tid >> 4;
    const int lrow = tid >> 1, lk = (tid & 1) * 4;  // this thread's share of each tile load
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
    for (int i = 0; i < 4; ++i) {
        pq[i] = lk + i < dim ? qrow[lk + i] : 0.f;  // coordinates past dim are 0 on both sides: |0 - 0| = 0
        pc[i] = lk + i < dim ? crow[lk + i] : 0.f;
    }
    for (int k0 = 0; k0 < dim; k0 += 8) {
        #pragma unroll
        for (int i = 0; i < 4; ++i) { sq[lk + i][lrow] = pq[i]; sc[lk + i][lrow] = pc[i]; }
        __syncthreads();
        if (k0 + 8 < dim) {
            #pragma unroll
            for (int i = 0; i < 4; ++i) {
                int k = k0 + 8 + lk + i;
                pq[i] = k < dim ? qrow[k] : 0.f;
                pc[i] = k < dim ? crow[k] : 0.f;
            }
        }
        #pragma unroll
        for (int kk = 0; kk < 8; ++kk) {
            float4 a0 = *(const float4*)&sq[kk][ty * 4], a1 = *(const float4*)&sq[kk][64 + ty * 4];
            float4 b0 = *(const float4*)&sc[kk][tx * 4], b1 = *(const float4*)&sc[kk][64 + tx * 4];
            float a[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
            float b[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
            #pragma unroll
            for (int i = 0; i < 8; ++i)
                #pragma unroll
                for (int j = 0; j < 8; ++j) acc[i][j] += fabsf(a[i] - b[j]);
        }
        __syncthreads();
    }
    float* out = s + (long long)g * M * N;
    #pragma unroll
    for (int i = 0; i < 8; ++i) {
        int row = m0 + (i < 4 ? ty * 4 + i : 60 + ty * 4 + i);
        if (row >= M) continue;
        #pragma unroll
        for (int j = 0; j < 8; ++j) {
            int col = n0 + (j < 4 ? tx * 4 + j : 60 + tx * 4 + j);
            if (col < N) out[(long long)row * N + col] = -acc[i][j];
        }
    }
}
"""

# Compiled with defines: X_MINUS_Y (1: d = x - y; 0: d = y - x), ROWS (rows a thread: 8 or 4) and
# MIN_BLOCKS (the launch bound's blocks per SM, which caps registers: at 4 rows and 2 blocks, 128 and no
# spills; more blocks spilled and ran slower, bench/pairwise_cuda.py).
GRADIENT_SOURCE = r"""
#define THREADS (1024 / ROWS)
extern "C" __global__ void __launch_bounds__(THREADS, MIN_BLOCKS)
KERNEL_NAME(const float* __restrict__ w, const float* __restrict__ x, const float* __restrict__ y,
            float* __restrict__ out, int A, int B, int dim, int w_group, int w_a, int w_b,
            int x_group, int x_row, int y_group, int y_row, int out_group, int out_row, int out_split,
            int b_per_split, int negate)
{
    // out[split, g, a, k] = (negate ? -1 : 1) * sum over this split's b of w(a, b), its sign flipped where
    // the difference d is negative (the sign bit: d = +0 counts as positive).
    // Block: 128 rows x 32 coordinates. Thread (ta, tk) owns coordinates tk*4..+3 and ROWS rows with their
    // x values in registers: ROWS 8: {ta*4..+3, 64+ta*4..+3}; ROWS 4: ta*4..+3.
    __shared__ __align__(16) float sw[16][132];  // padded: the b-contiguous loads store without bank conflicts
    __shared__ __align__(16) float sy[16][32];
    const int a_tiles = (A + 127) / 128;
    const int g = blockIdx.z, split = blockIdx.y / a_tiles, a0 = (blockIdx.y % a_tiles) * 128, k0 = blockIdx.x * 32;
    const int tid = threadIdx.x, tk = tid & 7, ta = tid >> 3;
    const int b_begin = split * b_per_split, b_end = min(B, b_begin + b_per_split);
    const float* wg = w + (long long)g * w_group;
    const float* yg = y + (long long)g * y_group;
    #define ROW(i) (ROWS == 8 && (i) >= 4 ? 60 + ta * 4 + (i) : ta * 4 + (i))
    float xv[ROWS][4], acc[ROWS][4];
    #pragma unroll
    for (int i = 0; i < ROWS; ++i) {
        int row = min(a0 + ROW(i), A - 1);
        #pragma unroll
        for (int j = 0; j < 4; ++j) {
            int k = k0 + tk * 4 + j;
            xv[i][j] = k < dim ? x[(long long)g * x_group + (long long)row * x_row + k] : 0.f;
            acc[i][j] = 0.f;
        }
    }
    const bool a_fast = w_a == 1;  // which weight axis is contiguous decides the load order
    #define W_LOADS (2048 / THREADS)
    #define Y_LOADS (512 / THREADS)
    float pw[W_LOADS], py[Y_LOADS];  // the next tile, loaded while this one computes
    // Weights past the split are 0: their pairs add +-0.
    #define LOAD_TILE(bb) \
        _Pragma("unroll") for (int i = 0; i < W_LOADS; ++i) { \
            int idx = tid + i * THREADS, ra = a_fast ? (idx & 127) : (idx >> 4), rb = a_fast ? (idx >> 7) : (idx & 15); \
            int a = min(a0 + ra, A - 1), b = (bb) + rb; \
            pw[i] = b < b_end ? wg[(long long)a * w_a + (long long)b * w_b] : 0.f; \
        } \
        _Pragma("unroll") for (int i = 0; i < Y_LOADS; ++i) { \
            int idx = tid + i * THREADS, k = k0 + (idx & 31), b = min((bb) + (idx >> 5), B - 1); \
            py[i] = k < dim ? yg[(long long)b * y_row + k] : 0.f; \
        }
    LOAD_TILE(b_begin)
    for (int bb0 = b_begin; bb0 < b_end; bb0 += 16) {
        #pragma unroll
        for (int i = 0; i < W_LOADS; ++i) {
            int idx = tid + i * THREADS, ra = a_fast ? (idx & 127) : (idx >> 4), rb = a_fast ? (idx >> 7) : (idx & 15);
            sw[rb][ra] = pw[i];
        }
        #pragma unroll
        for (int i = 0; i < Y_LOADS; ++i) {
            int idx = tid + i * THREADS;
            sy[idx >> 5][idx & 31] = py[i];
        }
        __syncthreads();
        if (bb0 + 16 < b_end) { LOAD_TILE(bb0 + 16) }
        #pragma unroll
        for (int rb = 0; rb < 16; ++rb) {
            float wv[ROWS];
            float4 w0 = *(const float4*)&sw[rb][ta * 4];
            wv[0] = w0.x; wv[1] = w0.y; wv[2] = w0.z; wv[3] = w0.w;
#if ROWS == 8
            float4 w1 = *(const float4*)&sw[rb][64 + ta * 4];
            wv[4] = w1.x; wv[5] = w1.y; wv[6] = w1.z; wv[7] = w1.w;
#endif
            float4 yy = *(const float4*)&sy[rb][tk * 4];
            float yv[4] = {yy.x, yy.y, yy.z, yy.w};
            #pragma unroll
            for (int i = 0; i < ROWS; ++i)
                #pragma unroll
                for (int j = 0; j < 4; ++j) {
                    float d = X_MINUS_Y ? xv[i][j] - yv[j] : yv[j] - xv[i][j];  // chosen at compile time
                    acc[i][j] += __int_as_float(__float_as_int(wv[i]) ^ (__float_as_int(d) & 0x80000000));
                }
        }
        __syncthreads();
    }
    float* o = out + (long long)split * out_split + (long long)g * out_group;
    #pragma unroll
    for (int i = 0; i < ROWS; ++i) {
        int row = a0 + ROW(i);
        if (row >= A) continue;
        #pragma unroll
        for (int j = 0; j < 4; ++j) {
            int k = k0 + tk * 4 + j;
            if (k < dim) o[(long long)row * out_row + k] = negate ? -acc[i][j] : acc[i][j];
        }
    }
}
"""

GRADIENT_ROWS, GRADIENT_MIN_BLOCKS = 4, 2  # fastest on both sides, d=100 and 400 (bench/pairwise_cuda.py)
SPLIT_MIN_REDUCTION = 256  # a reduction slice of the gradients covers at least this many rows
WAVES = 4  # a gradient launch aims at this many blocks per SM, slicing its reduction when rows are few

_lock = threading.Lock()
_kernels: dict[int, dict | None] = {}  # device index -> kernels, or None where compilation failed


def gradient_source(x_minus_y: bool, rows: int = GRADIENT_ROWS, min_blocks: int = GRADIENT_MIN_BLOCKS,
                    name: str = "l1_gradient") -> str:
    return (f"#define X_MINUS_Y {int(x_minus_y)}\n#define ROWS {rows}\n#define MIN_BLOCKS {min_blocks}\n"
            + GRADIENT_SOURCE.replace("KERNEL_NAME", name))


def compile_kernel(source: str, name: str):
    """NVRTC through torch (torch >= 2.8), for the current device; raises where that is not possible."""
    compile_with_nvrtc = getattr(torch.cuda, "_compile_kernel", None)
    if compile_with_nvrtc is None:
        raise RuntimeError(f"torch {torch.__version__} has no torch.cuda._compile_kernel")
    return compile_with_nvrtc(source, name)


def _device_kernels(device: torch.device) -> dict | None:
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _kernels:
        with _lock:
            if index not in _kernels:
                try:
                    with torch.cuda.device(index):
                        _kernels[index] = {
                            "scores": compile_kernel(SCORES_SOURCE, "l1_scores"),
                            "grad_queries": compile_kernel(gradient_source(True, name="l1_grad_queries"),
                                                           "l1_grad_queries"),
                            "grad_candidates": compile_kernel(gradient_source(False, name="l1_grad_candidates"),
                                                              "l1_grad_candidates")}
                except Exception as error:  # noqa: BLE001 - any failure means: use the Triton kernels
                    warnings.warn(f"the CUDA L1 kernels did not compile on cuda:{index} ({error}); "
                                  "the Triton kernels serve instead", RuntimeWarning, stacklevel=3)
                    _kernels[index] = None
    return _kernels[index]


def serves(*tensors: torch.Tensor) -> bool:
    """Whether these kernels take a block of these float32 CUDA tensors (rows of unit stride, sizes and
    strides within 32 bits, nothing empty) and compile on their device."""
    if os.environ.get(OPT_OUT, "1") == "0":
        return False
    if not all(t.is_cuda and t.dtype == torch.float32 and t.numel() > 0 and t.stride(-1) == 1 for t in tensors):
        return False
    if any(max(*t.shape, *t.stride(), t.numel()) > INT32_MAX for t in tensors):
        return False
    return _device_kernels(tensors[0].device) is not None


def scores(queries: torch.Tensor, candidates: torch.Tensor, dim: int) -> torch.Tensor:
    """S [G, M, N] = -sum_{k < dim} |q_k - c_k| (as ``pairwise.pairwise_scores`` with kind "l1")."""
    groups, num_queries, num_candidates = queries.shape[0], queries.shape[1], candidates.shape[1]
    out = torch.empty(groups, num_queries, num_candidates, device=queries.device)  # indexed in 64 bits
    _launch(queries.device, "scores", (-(-num_candidates // 128), -(-num_queries // 128), groups), 256,
            [queries, candidates, out, num_queries, num_candidates, dim, queries.stride(0), queries.stride(1),
             candidates.stride(0), candidates.stride(1)])
    return out


def backward(weights: torch.Tensor, queries: torch.Tensor, candidates: torch.Tensor,
             dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(grad_queries, grad_candidates) of sum(weights * S) (as ``pairwise.pairwise_backward``, kind "l1")."""
    w_group, w_query, w_candidate = weights.stride()
    grad_queries = _gradient("grad_queries", weights, queries, candidates, dim, w_group, w_query, w_candidate)
    grad_candidates = _gradient("grad_candidates", weights, candidates, queries, dim, w_group, w_candidate,
                                w_query)
    return grad_queries, grad_candidates


def _gradient(kernel: str, weights, x, y, dim: int, w_group: int, w_a: int, w_b: int) -> torch.Tensor:
    """Gradient for the rows ``x`` against the rows ``y``: the weights' a axis runs along x, b along y."""
    groups, rows, others = x.shape[0], x.shape[1], y.shape[1]
    if dim == 0:
        return torch.zeros(x.shape, device=x.device)
    blocks = -(-dim // 32) * -(-rows // 128) * groups
    sms = torch.cuda.get_device_properties(x.device).multi_processor_count
    splits = max(1, min(-(-WAVES * sms // blocks), others // SPLIT_MIN_REDUCTION))
    if splits * groups * rows * x.shape[2] > INT32_MAX:
        splits = 1
    out = torch.zeros(splits, groups, rows, x.shape[2], device=x.device)  # columns >= dim stay 0
    per_split = -(-others // splits)
    _launch(x.device, kernel, (-(-dim // 32), splits * -(-rows // 128), groups), 1024 // GRADIENT_ROWS,
            [weights, x, y, out, rows, others, dim, w_group, w_a, w_b, x.stride(0), x.stride(1), y.stride(0),
             y.stride(1), out.stride(1), out.stride(2), out.stride(0), per_split, int(kernel == "grad_queries")])
    return out[0] if splits == 1 else out.sum(0)


def _launch(device: torch.device, kernel: str, grid: tuple[int, int, int], threads: int, args: list) -> None:
    with torch.cuda.device(device):  # the kernel belongs to this device's context
        _device_kernels(device)[kernel](grid=grid, block=(threads, 1, 1), args=args,
                                        stream=torch.cuda.current_stream(device))
