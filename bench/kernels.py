"""Variants of the step's hottest kernels on one GPU, timed in isolation (CUDA events, median).

    python bench/kernels.py --json bench/results/kernels.json

The softmax row kernel of the fused loss over the issue's score block
(2 x 10 chunks x 5,000 queries x 1,000 candidates, bfloat16) for each
rows-per-program and warp count; and the batch's unique-row sort on 64- and
32-bit keys. Each row prints the achieved bandwidth against the bytes the
kernel must move. ``--edge``: the per-edge backward kernel's tile and warps;
``--zero-copy``: rows read from pinned host memory; ``--pairwise``: the distance
score blocks of TransE-L1 and RotatE (scores and gradients, each gradient tile),
against a float32 matmul of the same block and the floor the GPU's CUDA cores
and special-function units put under them.
"""

from __future__ import annotations

import argparse
import json
import subprocess
from pathlib import Path

import torch


from marius_py.step.fused_loss import _softmax_rows_triton  # noqa: E402


def time_ms(work) -> float:
    import triton.testing
    return triton.testing.do_bench(work, warmup=50, rep=300, return_mode="median")


def softmax_rows(args) -> list[dict]:
    groups, rows, candidates = 2 * args.chunks, args.queries, args.candidates
    scores = torch.randn(groups, rows, candidates, device="cuda").to(torch.bfloat16)
    positive = torch.randn(groups, rows, device="cuda")
    target_ids = torch.randint(10**6, (groups, rows), device="cuda")
    candidate_ids = torch.randint(10**6, (groups, candidates), device="cuda")
    weight = torch.full((groups, rows), 1e-5, device="cuda")
    bytes_moved = 2 * scores.numel() * scores.element_size()
    results = []
    for per_program in (1, 2, 4):
        for warps in (4, 8, 16):
            block = scores.clone()
            try:
                ms = time_ms(lambda: _softmax_rows_triton(block, positive, target_ids, candidate_ids, weight,
                                                          rows=per_program, num_warps=warps))
            except Exception as error:  # a variant Triton cannot compile: say so, keep sweeping
                print(f"softmax_rows rows={per_program} warps={warps}: {type(error).__name__}", flush=True)
                continue
            results.append({"kernel": "softmax_rows", "rows": per_program, "warps": warps, "ms": ms,
                            "gb_per_s": bytes_moved / ms / 1e6})
    return results


def zero_copy_gather(args) -> list[dict]:
    """Rows of a pinned host table read by a GPU kernel over PCIe (no staging copy), against a device table."""
    from marius_py.pipeline.row_kernels import gather_rows
    results = []
    for dim in (100, 400):
        host = torch.randn(args.nodes, dim).pin_memory()
        rows = torch.randperm(args.nodes, device="cuda")[:args.unique_rows]
        count = torch.tensor([args.unique_rows], device="cuda")
        out = torch.empty(args.unique_rows, dim, device="cuda")
        gather_rows(host, rows, out, count)
        torch.cuda.synchronize()
        assert torch.equal(out.cpu(), host[rows.cpu()]), "zero-copy gather read wrong rows"
        for source, table in (("pinned host", host), ("device", host.cuda())):
            ms = time_ms(lambda: gather_rows(table, rows, out, count))
            results.append({"kernel": "gather_rows", "table": source, "dim": dim, "ms": ms,
                            "gb_per_s": out.numel() * 4 / ms / 1e6})
    return results


def edge_backward(args) -> list[dict]:
    """The per-edge backward kernel (gradients of h, t and relations) for each elements-per-program tile and
    warp count: B edges over ``--unique-rows`` gathered rows and 2 x 100 relation vectors."""
    from marius_py.step.edge_kernels import EdgeMaths, _edge_backward_triton
    results = []
    for operator, comparator in (("diagonal", "dot"), ("complex", "dot"), ("translation", "l2")):
        maths = EdgeMaths(operator, "n3", True, comparator)
        for dim in (100, 400):
            rows = torch.randn(args.unique_rows, dim, device="cuda")
            relations = torch.randn(200, dim, device="cuda")
            edges = torch.stack([torch.randint(args.unique_rows, (args.batch,)), torch.randint(100, (args.batch,)),
                                 torch.randint(args.unique_rows, (args.batch,))], 1).cuda()
            local = torch.cat([edges[:, 0], edges[:, 2]])
            grad_queries = torch.randn(2 * args.batch, dim, device="cuda")
            grad_positive = torch.randn(2 * args.batch, device="cuda")
            grad_rows, grad_relations = torch.zeros_like(rows), torch.zeros_like(relations)
            # rows + relations read, the two query gradients read, the h/t/relation gradients added
            bytes_moved = 4 * args.batch * dim * 4 + 2 * args.batch * dim * 4 + 4 * args.batch * dim * 4
            for tile in (1024, 2048, 4096):
                for warps in (2, 4, 8):
                    def work():
                        _edge_backward_triton(grad_rows, grad_relations, rows, relations, edges, local, grad_queries,
                                              grad_positive, args.batch, maths, None, 1e-3, tile=tile,
                                              num_warps=warps)
                    ms = time_ms(work)
                    results.append({"kernel": "edge_backward", "operator": operator, "dim": dim, "tile": tile,
                                    "warps": warps, "ms": ms, "gb_per_s": bytes_moved / ms / 1e6})
                    print(results[-1], flush=True)
    return results


# Instructions per (query, candidate, coordinate) triple (complex coordinate for modulus) that no kernel of
# these formulas avoids, every multiply and add that can be fused counted fused. An SM issues one warp
# instruction (32 lanes) a clock from each of its four schedulers, whatever the unit:
# - l1: forward, the difference and an add of its absolute value (2); each of the two gradient kernels, the
#   difference, the sign-bit flip (integer unit) and an add (3);
# - modulus: forward, two differences, a multiply and a fused multiply-add for the squared modulus, its
#   square root and an add (6); each gradient kernel, the two differences, the multiply and fused
#   multiply-add, the reciprocal square root, the scale by the weight and two fused multiply-adds (8).
INSTRUCTIONS_PER_TRIPLE = {"l1": 2 + 2 * 3, "modulus": 6 + 2 * 8}
FP32_PER_TRIPLE = {"l1": 2 + 2 * 2, "modulus": 5 + 2 * 7}  # of those, on the FP32 lanes
SFU_PER_TRIPLE = {"l1": 0, "modulus": 3}  # of those, square roots on the special-function units
ISSUE_SLOTS_PER_SM, SFU_LANES_PER_SM = 4 * 32, 16  # per clock, Volta to Hopper
NARROW_FP32 = {(7, 0), (8, 0)}  # V100 and A100 have 64 FP32 lanes per SM; later chips 128


def block_floors(kind: str, triples: int, sms: int, clock_hz: float, capability: tuple[int, int]) -> dict:
    """Milliseconds the block's scores and both gradients need at 100% of the issue slots, of the FP32 lanes
    and of the special-function units, no memory stall; ``block_floor_ms`` is the largest."""
    if not clock_hz:
        return {"block_floor_ms": 0.0, "issue_floor_ms": 0.0, "fp32_floor_ms": 0.0, "sfu_floor_ms": 0.0}
    fp32_lanes = 64 if tuple(capability) in NARROW_FP32 else 128
    per_clock = {"issue_floor_ms": (INSTRUCTIONS_PER_TRIPLE[kind], ISSUE_SLOTS_PER_SM),
                 "fp32_floor_ms": (FP32_PER_TRIPLE[kind], fp32_lanes),
                 "sfu_floor_ms": (SFU_PER_TRIPLE[kind], SFU_LANES_PER_SM)}
    floors = {name: triples * work / (sms * lanes * clock_hz) * 1e3 for name, (work, lanes) in per_clock.items()}
    return {"block_floor_ms": max(floors.values()), **floors}


def sm_clock_hz(device: int) -> float:
    """The SM's maximum clock: from nvidia-smi (the GPU named by its UUID, since nvidia-smi's indices ignore
    CUDA_VISIBLE_DEVICES; by index where torch gives no UUID), else torch's device properties (kHz), else 0
    (no floor)."""
    properties = torch.cuda.get_device_properties(device)
    uuid = getattr(properties, "uuid", None)
    for name in ([f"GPU-{uuid}"] if uuid else []) + [str(device)]:
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=clocks.max.sm", "--format=csv,noheader,nounits",
                                  "-i", name], capture_output=True, text=True, timeout=30)
            return float(out.stdout.split()[0]) * 1e6
        except (OSError, ValueError, IndexError, subprocess.TimeoutExpired):
            continue
    return getattr(properties, "clock_rate", 0) * 1e3


# (BM, BN, BK, warps) tried for the gradient kernels besides the shipped pairwise.GRAD_TILE of the kind.
GRAD_TILES = [(16, 32, 8, 4), (32, 32, 8, 4), (16, 64, 8, 4), (32, 32, 4, 4), (16, 32, 16, 4), (8, 32, 16, 4),
              (16, 32, 32, 4), (32, 64, 4, 8), (64, 32, 4, 8)]


def pairwise_blocks(args) -> list[dict]:
    """Scores and gradients of the TransE-L1 / RotatE score block (``--chunks`` groups of 2 x ``--queries``
    queries against ``--candidates``), each gradient tile of marius_py/step/pairwise.py, a float32 matmul of
    the same block, and the floors (``block_floors``) under the scores and both gradients together. A tile
    Triton cannot compile is recorded with ``error`` and no time."""
    from marius_py.step import pairwise
    groups, queries, candidates = args.chunks, 2 * args.queries, args.candidates
    device = torch.cuda.current_device()
    properties = torch.cuda.get_device_properties(device)
    sms, clock, capability = properties.multi_processor_count, sm_clock_hz(device), (properties.major,
                                                                                     properties.minor)
    default_tiles, results = pairwise.GRAD_TILE, []
    for dim in (100, 400):
        q = torch.randn(groups, queries, dim, device="cuda")
        c = torch.randn(groups, candidates, dim, device="cuda")
        w = torch.randn(groups, queries, candidates, device="cuda")
        matmul_ms = time_ms(lambda: torch.bmm(q, c.transpose(1, 2)))
        for kind in pairwise.KINDS:
            triples = groups * queries * candidates * (dim // 2 if kind == "modulus" else dim)
            floors = block_floors(kind, triples, sms, clock, capability)
            scores_ms = time_ms(lambda: pairwise.pairwise_scores(q, c, dim, kind))
            for tile in dict.fromkeys([default_tiles[kind], *(GRAD_TILES if args.grad_tiles == "all" else [])]):
                row = {"kernel": f"pairwise-{kind}", "dim": dim, "grad_tile": list(tile),
                       **{key: round(value, 4) for key, value in
                          {"scores_ms": scores_ms, "matmul_ms": matmul_ms, **floors}.items()}}
                pairwise.GRAD_TILE = {**default_tiles, kind: tile}
                try:
                    row["ms"] = time_ms(lambda: pairwise.pairwise_backward(w, q, c, dim, kind))
                except Exception as error:  # a tile Triton cannot compile: record it, keep sweeping
                    row.update(ms=float("nan"), error=type(error).__name__)
                finally:
                    pairwise.GRAD_TILE = default_tiles
                results.append(row)
                print(results[-1], flush=True)
    return results


def unique_sort(args) -> list[dict]:
    ids = torch.randint(args.nodes, (2 * args.batch + 2 * args.chunks * args.candidates,), device="cuda")
    results = []
    for dtype in (torch.int64, torch.int32):
        keys = ids.to(dtype)
        ms = time_ms(lambda: torch.sort(keys))
        results.append({"kernel": "sort", "dtype": str(dtype), "ms": ms,
                        "gb_per_s": 2 * keys.numel() * keys.element_size() / ms / 1e6})
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chunks", type=int, default=10)
    parser.add_argument("--queries", type=int, default=5000)
    parser.add_argument("--candidates", type=int, default=1000)
    parser.add_argument("--batch", type=int, default=50_000)
    parser.add_argument("--nodes", type=int, default=1_000_000)
    parser.add_argument("--unique-rows", type=int, default=80_000)
    parser.add_argument("--zero-copy", action="store_true", help="only the pinned-host row gather")
    parser.add_argument("--edge", action="store_true", help="only the per-edge backward kernel")
    parser.add_argument("--pairwise", action="store_true", help="only the TransE-L1 / RotatE score blocks")
    parser.add_argument("--grad-tiles", choices=("all", "default"), default="all",
                        help="--pairwise: sweep the gradient tiles, or time the shipped one only")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    if args.zero_copy:
        rows = zero_copy_gather(args)
    elif args.edge:
        rows = edge_backward(args)
    elif args.pairwise:
        rows = pairwise_blocks(args)
    else:
        rows = softmax_rows(args) + unique_sort(args)
    for row in rows:
        settings = "  ".join(f"{k}={v}" for k, v in row.items() if k not in ("kernel", "ms", "gb_per_s"))
        bandwidth = f"  {row['gb_per_s']:7.0f} GB/s" if "gb_per_s" in row else ""  # (compute-bound kernels: none)
        print(f"{row['kernel']:<13} {settings:<28} {row['ms'] * 1e3:8.1f} us{bandwidth}")
    if args.json:
        Path(args.json).write_text(json.dumps({"device": torch.cuda.get_device_name(), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
