"""Emulated bfloat16 storage of node embeddings and their Adagrad state (a benchmark, not a feature).

Out of core, a buffer's bytes bound how many partitions it holds. Stored as
bfloat16, rows and state take half the bytes: the memory of a 16:4 float32
buffer holds 16:8, and each partition read or write moves half the bytes.
This measured the accuracy that costs before ``storage.dtype=bfloat16`` was
built (docs/design.md): after every
node update (the fused step's ``sparse_adagrad_``, or the pipeline's
``add_rows_`` where the autograd step runs) the whole node and state tables are
rounded to bfloat16 values, kept in their float32 tensors. Rounding
is stochastic (unbiased: small Adagrad steps and state increments survive on
average) or to nearest (they are lost when under half a bfloat16 step).
Rounding a value already representable leaves it unchanged, so rounding the
whole table equals rounding the updated rows.
"""

from __future__ import annotations

import contextlib

import torch

from marius_py.step import fused
from marius_py.pipeline import span_runner
from marius_py.storage.rounding import LOW_BITS, round_stochastic_bfloat16

PRECISIONS = ("float32", "bfloat16", "bfloat16-nearest")


def round_to_bfloat16_(table: torch.Tensor, stochastic: bool) -> None:
    """Round a float32 tensor in place to bfloat16 values: to nearest (even), or stochastically as
    ``storage.dtype=bfloat16`` training does (``round_stochastic_bfloat16``, a fresh seed per call)."""
    if table.dtype != torch.float32:
        raise TypeError(f"round_to_bfloat16_: expected float32, got {table.dtype}")
    if stochastic:
        table.copy_(round_stochastic_bfloat16(table, int(torch.randint(1 << 62, (1,)))))
    else:
        table.copy_(table.to(torch.bfloat16))


@contextlib.contextmanager
def emulated_storage(precision: str):
    """Within it, every node update (fused or autograd step) leaves the node and state tables rounded to
    ``precision``."""
    if precision not in PRECISIONS:
        raise ValueError(f"storage precision {precision!r}: expected one of {', '.join(PRECISIONS)}")
    if precision == "float32":
        yield
        return
    stochastic = precision == "bfloat16"
    sites = [(fused, "sparse_adagrad_"), (span_runner, "add_rows_")]
    originals = [getattr(module, name) for module, name in sites]

    def rounding_after(update):
        def update_then_round(nodes, state, *args, **kwargs):
            update(nodes, state, *args, **kwargs)
            round_to_bfloat16_(nodes, stochastic)
            round_to_bfloat16_(state, stochastic)
        return update_then_round

    for (module, name), original in zip(sites, originals):
        setattr(module, name, rounding_after(original))
    try:
        yield
    finally:
        for (module, name), original in zip(sites, originals):
            setattr(module, name, original)


def share_representable(model) -> float:
    """The share of a trained model's embedding values that are bfloat16 values (1.0 after an emulated run; about
    2^-16 by chance for float32 training)."""
    held = total = 0
    for _, block in model.table.blocks():
        bits = block.float().contiguous().view(torch.int32)
        held += int((bits & (LOW_BITS - 1)).eq(0).sum())
        total += bits.numel()
    return held / total


def emulation_overrides(precision: str) -> list[str]:
    """Config overrides an emulated run needs: no CUDA graphs, so that the rounding runs eagerly after every step
    rather than depending on what a graph capture supports."""
    return [] if precision == "float32" else ["training.cuda_graphs=false"]
