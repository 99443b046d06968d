"""Optimizers: additive sparse Adagrad for node embeddings, dense for relations.

The node update is split in two so that a pipeline can run the halves on
different stages: ``compute`` (on the compute device) turns a gradient and the
current accumulator rows into ``delta = -lr * g / (sqrt(state + g^2) + eps)``
and ``g^2``; ``apply`` adds both with ``index_add_``. Additions commute, so
updates that overlap in an asynchronous pipeline are never lost.
"""

from __future__ import annotations

import torch

from marius_py.pipeline.step import add_rows_


def adagrad_state_dim(rowwise: bool, dim: int) -> int:
    """Optimizer state per node row: one accumulator (row-wise) or one per coordinate."""
    return 1 if rowwise else dim


class SparseAdagrad:
    """Sparse Adagrad over embedding rows, full (per element) or row-wise.

    Row-wise keeps one accumulator per row (the mean of g^2 over the row, as
    PyTorch-BigGraph does), halving optimizer memory and IO.
    """

    def __init__(self, lr: float, rowwise: bool = False, eps: float = 1e-10):
        self.lr = lr
        self.rowwise = rowwise
        self.eps = eps

    def state_dim(self, dim: int) -> int:
        return adagrad_state_dim(self.rowwise, dim)

    def compute(self, grad: torch.Tensor, state_rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(delta, g^2) for gradient rows ``grad`` and their accumulators ``state_rows``."""
        squared = grad * grad
        if self.rowwise:
            squared = squared.mean(dim=1, keepdim=True)
        delta = grad * (-self.lr / (torch.sqrt(state_rows + squared) + self.eps))
        return delta, squared

    apply = staticmethod(add_rows_)  # add the update to the stored rows, in place (the pipeline's update stage)


def build_relation_optimizer(kind: str, params, lr: float) -> torch.optim.Optimizer:
    if kind == "adagrad":
        return torch.optim.Adagrad(params, lr=lr)
    if kind == "adam":
        return torch.optim.Adam(params, lr=lr)
    raise ValueError(f"unknown relation optimizer {kind!r}; known: adagrad, adam")
