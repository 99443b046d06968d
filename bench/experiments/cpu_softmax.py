"""The softmax rows of the step on the CPU (`fused_loss.softmax_rows_`, torch version) at the bundled job's block.

    python bench/experiments/cpu_softmax.py --json bench/results/cpu-softmax-rows.json

The allocator settings of the command (marius_py/resources.py) are applied first where the code has them,
as in `marius-py train`.

Block: 2 directions x 1,000 queries x 2,000 shared candidates (CoDEx-M's `codex-m` config), for float32,
float32 squared-L2 (TransE-L2's form), float64 and bfloat16 scores. Each row: median milliseconds of 10 calls
on a fresh copy of the scores, and a checksum of the outputs (the same checksum from two versions of the code
means the same results).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # bench/, for its shared helpers

from marius_py.step.fused_loss import softmax_rows_  # noqa: E402

CASES = [("float32", torch.float32, False), ("float32 squared-L2", torch.float32, True),
         ("float64", torch.float64, False), ("bfloat16", torch.bfloat16, False)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=2)
    parser.add_argument("--queries", type=int, default=1000)
    parser.add_argument("--candidates", type=int, default=2000)
    parser.add_argument("--calls", type=int, default=10)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    try:
        from marius_py.resources import keep_freed_memory
        allocator = "command's" if keep_freed_memory() else "glibc defaults"
    except ImportError:  # code from before the settings
        allocator = "glibc defaults"
    rows = []
    for name, dtype, squared_l2 in CASES:
        torch.manual_seed(0)
        shape = (args.groups, args.queries, args.candidates)
        scores = (torch.randn(shape) * 3).to(dtype)
        if squared_l2:
            scores = scores.abs()
        exact = torch.float64 if dtype == torch.float64 else torch.float32
        positive, weight = torch.randn(shape[:2], dtype=exact), torch.rand(shape[:2], dtype=exact)
        target_ids = torch.randint(0, 50, shape[:2])
        candidate_ids = torch.randint(0, 50, (args.groups, args.candidates))
        work, times = scores.clone(), []
        for _ in range(args.calls + 1):  # the first call warms up
            work.copy_(scores)
            start = time.perf_counter()
            loss, grad_positive = softmax_rows_(work, positive, target_ids, candidate_ids, weight, squared_l2)
            times.append(time.perf_counter() - start)
        checksum = float(work.double().sum() + loss.double().sum() + grad_positive.double().sum())
        rows.append({"scores": name, "ms": statistics.median(times[1:]) * 1e3, "checksum": checksum})
    print(f"allocator: {allocator}")
    print(f"{'scores':<20} {'ms':>8}  checksum")
    for row in rows:
        print(f"{row['scores']:<20} {row['ms']:8.1f}  {row['checksum']!r}")
    if args.json:
        Path(args.json).write_text(json.dumps({"threads": torch.get_num_threads(), "allocator": allocator, "block": [
            args.groups, args.queries, args.candidates], "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
