"""Distance score blocks (TransE-L1, RotatE's modulus) and their two gradients: the NVRTC kernels
(marius_py/step/pairwise_cuda.py) against the Triton kernels they replaced, and variants (one GPU).

    python bench/pairwise_cuda.py --json bench/results/gpu-pairwise-cuda.json

The block is the step's: 10 groups of 10,000 queries against 1,000 candidates, dim 100 and 400. Rows:

- ``triton ... (before)``: pairwise.py's Triton kernels, which served before the NVRTC kernels;
- ``nvrtc ... (shipped)``: what ``pairwise_scores`` / ``pairwise_backward`` run now;
- ``nvrtc scores half2`` (L1, not shipped): the coordinates in packed halves, two a PTX f16x2
  instruction, each pair's sums flushed into float32 every 16 coordinates;
- ``{kind}_{kernel}_b{blocks} [x{slices}]``: a kernel compiled with a launch bound of ``blocks`` blocks per
  SM (the shipped choice is pairwise_cuda.MIN_BLOCKS) and, for the gradients, the reduction cut in
  ``slices`` summed afterwards (the shipped choice follows pairwise_cuda.WAVES; the queries' is 1 here).

Each row: median ms, the share of the issue floor it reaches (INSTRUCTIONS below), the largest error
against the Triton kernel's output relative to that output's largest magnitude, and the registers and
spilled bytes a thread.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch


from kernels import sm_clock_hz, time_ms  # noqa: E402  (bench/kernels.py, beside this file)
from marius_py.step import pairwise, pairwise_cuda  # noqa: E402

ISSUE_SLOTS_PER_SM = 4 * 32
# Instructions a triple (a complex coordinate for the modulus): (scores, each gradient), as bench/kernels.py
# counts them. The modulus's square roots go to 16 special-function lanes an SM: its floor there is the
# issue floor times 8 / 6 (scores) and 8 / 8 (gradients); the table gives the issue floor only.
INSTRUCTIONS = {"l1": (2, 3), "modulus": (6, 8)}
# (kind, kernel, launch bound's blocks per SM) compiled besides the shipped pairwise_cuda.MIN_BLOCKS
VARIANTS = [(kind, kernel, blocks) for kind in ("l1", "modulus") for kernel, counts in
            (("scores", (1, 2)), ("grad_queries", (1, 2, 3)), ("grad_candidates", (1, 2, 3))) for blocks in counts]

SCORES_HALF2_SOURCE = r"""
// Packed halves through PTX (f16x2), so that no CUDA header is needed.
__device__ __forceinline__ unsigned pack_half2(float lo, float hi) {
    unsigned r; asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo)); return r;
}
__device__ __forceinline__ unsigned add_abs_difference(unsigned total, unsigned a, unsigned b) {
    unsigned r;
    asm("{ .reg .b32 t; sub.f16x2 t, %1, %2; abs.f16x2 t, t; add.f16x2 %0, %3, t; }"
        : "=r"(r) : "r"(a), "r"(b), "r"(total));
    return r;
}
__device__ __forceinline__ float half2_sum(unsigned v) {
    float lo, hi;
    asm("{ .reg .f16 l, h; mov.b32 {l, h}, %2; cvt.f32.f16 %0, l; cvt.f32.f16 %1, h; }" : "=f"(lo), "=f"(hi) : "r"(v));
    return lo + hi;
}
extern "C" __global__ void __launch_bounds__(256, 1)
l1_scores_half2(const float* __restrict__ q, const float* __restrict__ c, float* __restrict__ s,
                int M, int N, int dim, int imag_offset, int q_group, int q_row, int c_group, int c_row)
{
    // As the shipped L1 scores (same arguments; imag_offset unused), with coordinate pairs (2p, 2p+1) packed
    // in one register: tiles of 16 coordinates.
    __shared__ __align__(16) unsigned sq[8][128];
    __shared__ __align__(16) unsigned sc[8][128];
    const int g = blockIdx.z, m0 = blockIdx.y * 128, n0 = blockIdx.x * 128;
    const int tid = threadIdx.x, tx = tid & 15, ty = tid >> 4;
    const int lrow = tid >> 1, lk = (tid & 1) * 8;
    const float* qrow = q + (long long)g * q_group + (long long)min(m0 + lrow, M - 1) * q_row;
    const float* crow = c + (long long)g * c_group + (long long)min(n0 + lrow, N - 1) * c_row;
    float total[8][8];
    #pragma unroll
    for (int i = 0; i < 8; ++i)
        #pragma unroll
        for (int j = 0; j < 8; ++j) total[i][j] = 0.f;
    for (int k0 = 0; k0 < dim; k0 += 16) {
        #pragma unroll
        for (int p = 0; p < 4; ++p) {
            int k = k0 + lk + 2 * p;
            float q0 = k < dim ? qrow[k] : 0.f, q1 = k + 1 < dim ? qrow[k + 1] : 0.f;
            float c0 = k < dim ? crow[k] : 0.f, c1 = k + 1 < dim ? crow[k + 1] : 0.f;
            sq[lk / 2 + p][lrow] = pack_half2(q0, q1);
            sc[lk / 2 + p][lrow] = pack_half2(c0, c1);
        }
        __syncthreads();
        unsigned acc[8][8];
        #pragma unroll
        for (int i = 0; i < 8; ++i)
            #pragma unroll
            for (int j = 0; j < 8; ++j) acc[i][j] = 0u;  // +0, +0
        #pragma unroll
        for (int kk = 0; kk < 8; ++kk) {
            uint4 a0 = *(const uint4*)&sq[kk][ty * 4], a1 = *(const uint4*)&sq[kk][64 + ty * 4];
            uint4 b0 = *(const uint4*)&sc[kk][tx * 4], b1 = *(const uint4*)&sc[kk][64 + tx * 4];
            unsigned a[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
            unsigned b[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
            #pragma unroll
            for (int i = 0; i < 8; ++i)
                #pragma unroll
                for (int j = 0; j < 8; ++j) acc[i][j] = add_abs_difference(acc[i][j], a[i], b[j]);
        }
        #pragma unroll
        for (int i = 0; i < 8; ++i)
            #pragma unroll
            for (int j = 0; j < 8; ++j) total[i][j] += half2_sum(acc[i][j]);
        __syncthreads();
    }
    store_score_tile(s + (long long)g * M * N, total, 0.f, m0, n0, ty, tx, M, N);
}
"""

def compile_kernels() -> tuple[dict, dict]:
    """(kernels by name, compile errors by name): a kernel NVRTC refuses leaves its rows out."""
    sources = {"scores_half2": (pairwise_cuda.COMMON_SOURCE + SCORES_HALF2_SOURCE, "l1_scores_half2")}
    for kind, kernel, min_blocks in VARIANTS:
        name = f"{kind}_{kernel}_b{min_blocks}"
        sources[name] = (pairwise_cuda.kernel_source(kind, kernel, min_blocks, name), name)
    kernels, errors = {}, {}
    for name, (source, entry) in sources.items():
        try:
            kernels[name] = pairwise_cuda.compile_kernel(source, entry)
        except Exception as error:  # noqa: BLE001 - reported in the table and the JSON
            errors[name] = str(error)
            print(f"{name}: not compiled: {error}", file=sys.stderr)
    return kernels, errors


def kernel_attributes(kernel) -> dict:
    """Registers a thread and local (spilled) bytes a thread, as the driver reports them."""
    import ctypes
    libcuda = torch.cuda._utils._get_gpu_runtime_library()
    values = {}
    for name, attribute in (("registers", 4), ("local_bytes", 3)):  # CU_FUNC_ATTRIBUTE_NUM_REGS, _LOCAL_SIZE_BYTES
        value = ctypes.c_int()
        libcuda.cuFuncGetAttribute(ctypes.byref(value), attribute, kernel.func)
        values[name] = value.value
    return values


def relative_error(values, reference) -> float:
    """Largest difference relative to the reference's largest magnitude; of the worse one for pairs."""
    if isinstance(values, tuple):
        return max(relative_error(v, r) for v, r in zip(values, reference))
    return ((values.double() - reference.double()).abs().max() / reference.double().abs().max()).item()


def issue_floor_ms(triples: int, instructions: int, properties, clock_hz: float) -> float:
    return triples * instructions / (properties.multi_processor_count * ISSUE_SLOTS_PER_SM * clock_hz) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=10)
    parser.add_argument("--queries", type=int, default=10_000)
    parser.add_argument("--candidates", type=int, default=1000)
    parser.add_argument("--dims", type=int, nargs="+", default=[100, 400])
    parser.add_argument("--kinds", nargs="+", default=["l1", "modulus"], choices=["l1", "modulus"])
    parser.add_argument("--splits", type=int, nargs="+", default=[2, 4, 8],
                        help="slices of the candidates' gradient reduction tried with each variant")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    torch.manual_seed(0)
    kernels, compile_errors = compile_kernels()
    properties, clock = torch.cuda.get_device_properties(0), sm_clock_hz(0)
    rows = []
    for kind, dim in [(kind, dim) for kind in args.kinds for dim in args.dims]:
        q = torch.randn(args.groups, args.queries, dim, device="cuda") * 0.3  # TransE-scale rows
        c = torch.randn(args.groups, args.candidates, dim, device="cuda") * 0.3
        weights = torch.randn(args.groups, args.queries, args.candidates, device="cuda") * 1e-3
        assert pairwise_cuda.serves(kind, weights, q, c), "the NVRTC kernels do not serve this block"
        triples = args.groups * args.queries * args.candidates * pairwise._coordinates(dim, kind)[0]
        count = INSTRUCTIONS[kind]
        triton_scores = pairwise._scores_triton(q, c, dim, kind)
        triton_q, triton_c = pairwise._backward_triton(weights, q, c, dim, kind)
        measured = {  # name: (work, instructions a triple, reference output, bench kernel it needs)
            "triton scores (before)": (lambda: pairwise._scores_triton(q, c, dim, kind), count[0], None, None),
            "nvrtc scores (shipped)": (lambda: pairwise.pairwise_scores(q, c, dim, kind), count[0], triton_scores,
                                       None),
            "triton gradients, both (before)": (lambda: pairwise._backward_triton(weights, q, c, dim, kind),
                                                2 * count[1], None, None),
            "nvrtc gradients, both (shipped)": (lambda: pairwise.pairwise_backward(weights, q, c, dim, kind),
                                                2 * count[1], (triton_q, triton_c), None),
        }
        layout = (kind, *pairwise._coordinates(dim, kind))
        if kind == "l1" and "scores_half2" in kernels:
            measured["nvrtc scores half2"] = (lambda: pairwise_cuda.scores(q, c, *layout, kernels["scores_half2"]),
                                              count[0], triton_scores, "scores_half2")
        strides = weights.stride()
        for variant_kind, kernel, blocks in VARIANTS:
            name = f"{variant_kind}_{kernel}_b{blocks}"
            if variant_kind != kind or name not in kernels:
                continue
            if kernel == "scores":
                measured[name] = (lambda name=name: pairwise_cuda.scores(q, c, *layout, kernels[name]), count[0],
                                  triton_scores, name)
                continue
            side = (q, c, (strides[0], strides[1], strides[2]), [1], triton_q) if kernel == "grad_queries" else \
                (c, q, (strides[0], strides[2], strides[1]), args.splits, triton_c)
            x, y, weight_strides, slices, reference = side
            for splits in slices:
                measured[f"{name} x{splits}"] = (
                    lambda name=name, kernel=kernel, x=x, y=y, weight_strides=weight_strides, splits=splits:
                    pairwise_cuda.gradient(kernel, weights, x, y, *layout, weight_strides, splits, kernels[name]),
                    count[1], reference, name)
        for name, (work, instructions, reference, needs) in measured.items():
            ms = time_ms(work)
            floor = issue_floor_ms(triples, instructions, properties, clock) if clock else None
            rows.append({"kind": kind, "kernel": name, "dim": dim, "ms": ms, "issue_floor_ms": floor,
                         **(kernel_attributes(kernels[needs]) if needs else {}),
                         "share_of_issue_rate": floor / ms if clock else None,
                         "error_vs_triton": relative_error(work(), reference) if reference is not None else None})
    print(f"{'kind':<8} {'kernel':<36} {'dim':>4} {'ms':>8} {'floor ms':>9} {'of issue rate':>14} "
          f"{'error vs Triton':>16} {'regs':>5} {'spill B':>8}")
    for row in rows:
        error = f"{row['error_vs_triton']:.1e}" if row["error_vs_triton"] is not None else "-"
        share = f"{row['share_of_issue_rate']:.0%}" if row["share_of_issue_rate"] is not None else "-"
        floor = f"{row['issue_floor_ms']:9.3f}" if row["issue_floor_ms"] is not None else f"{'-':>9}"
        print(f"{row['kind']:<8} {row['kernel']:<36} {row['dim']:>4} {row['ms']:8.3f} {floor} "
              f"{share:>14} {error:>16} {row.get('registers', '-'):>5} {row.get('local_bytes', '-'):>8}")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "device": torch.cuda.get_device_name(), "clock_hz": clock, "torch": torch.__version__,
            "compile_errors": compile_errors, "args": vars(args), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
