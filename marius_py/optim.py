"""Optimizers: additive sparse Adagrad for node embeddings, dense Adagrad or Adam for relations.

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


class RelationOptimizer:
    """A dense optimizer of the relation parameters with ``torch.optim``'s interface as this package uses it
    (``param_groups``, ``state`` by parameter, ``step``, ``state_dict``/``load_state_dict`` in its format, so
    checkpoints written with ``torch.optim.Adagrad`` or ``Adam`` load, and theirs load there).

    Written here rather than taken from ``torch.optim``: constructing a ``torch.optim`` optimizer imports
    ``torch._dynamo`` (seconds of every run's start-up). The arithmetic is ``torch.optim``'s single-tensor
    form, which it uses on the CPU (bit for bit with torch 2.13's; other versions may differ in a last bit
    now and then); on a GPU torch used its multi-tensor form, which rounds differently in the last bit."""

    defaults: dict = {}

    def __init__(self, params, lr: float):
        self.param_groups = [{**self.defaults, "lr": lr, "params": list(params)}]
        self.state: dict[torch.Tensor, dict] = {}

    def state_dict(self) -> dict:
        index = {id(p): i for i, p in enumerate(p for group in self.param_groups for p in group["params"])}
        return {"state": {index[id(p)]: dict(state) for p, state in self.state.items()},
                "param_groups": [{**{k: v for k, v in group.items() if k != "params"},
                                  "params": [index[id(p)] for p in group["params"]]} for group in self.param_groups]}

    def load_state_dict(self, saved: dict) -> None:
        params = [p for group in self.param_groups for p in group["params"]]
        groups = saved["param_groups"]
        if len(groups) != len(self.param_groups) or sum(len(g["params"]) for g in groups) != len(params):
            raise ValueError("the saved relation optimizer holds other parameters than the model's")
        by_index = dict(zip((i for g in groups for i in g["params"]), params))
        self.state = {by_index[int(i)]: {key: value.to(by_index[int(i)].device, by_index[int(i)].dtype)
                                         if torch.is_tensor(value) and key != "step" else value
                                         for key, value in state.items()}
                      for i, state in saved["state"].items()}
        for group, saved_group in zip(self.param_groups, groups):
            group.update({k: v for k, v in saved_group.items() if k != "params"})

    @torch.no_grad()
    def step(self) -> None:
        for group in self.param_groups:
            for param in group["params"]:
                if param.grad is not None:
                    self._update(param, param.grad, self._state(param), group)

    def _state(self, param: torch.Tensor) -> dict:
        raise NotImplementedError

    def _update(self, param: torch.Tensor, grad: torch.Tensor, state: dict, group: dict) -> None:
        raise NotImplementedError


class RelationAdagrad(RelationOptimizer):
    """Adagrad (``torch.optim.Adagrad`` with its defaults): ``sum += g^2``, ``p -= lr * g / (sqrt(sum) + eps)``.
    Its state exists from the start (the fused step updates ``sum`` in place)."""

    defaults = {"lr_decay": 0, "weight_decay": 0, "initial_accumulator_value": 0, "eps": 1e-10, "foreach": None,
                "maximize": False, "differentiable": False, "fused": None}

    def __init__(self, params, lr: float):
        super().__init__(params, lr)
        for param in self.param_groups[0]["params"]:
            self._state(param)

    def _state(self, param: torch.Tensor) -> dict:
        if param not in self.state:
            self.state[param] = {"step": torch.tensor(0.0), "sum": torch.zeros_like(param)}
        return self.state[param]

    def _update(self, param, grad, state, group) -> None:
        state["step"] += 1
        state["sum"].addcmul_(grad, grad, value=1)
        param.addcdiv_(grad, state["sum"].sqrt().add_(group["eps"]), value=-group["lr"])


class RelationAdam(RelationOptimizer):
    """Adam (``torch.optim.Adam`` with its defaults: betas 0.9 and 0.999, eps 1e-8, no weight decay)."""

    defaults = {"betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0, "amsgrad": False, "maximize": False,
                "foreach": None, "capturable": False, "differentiable": False, "fused": None}

    def _state(self, param: torch.Tensor) -> dict:
        if param not in self.state:
            self.state[param] = {"step": torch.tensor(0.0), "exp_avg": torch.zeros_like(param),
                                 "exp_avg_sq": torch.zeros_like(param)}
        return self.state[param]

    def _update(self, param, grad, state, group) -> None:
        beta1, beta2 = group["betas"]
        state["step"] += 1
        step = state["step"].item()
        state["exp_avg"].lerp_(grad, 1 - beta1)
        state["exp_avg_sq"].mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        denom = (state["exp_avg_sq"].sqrt() / (1 - beta2 ** step) ** 0.5).add_(group["eps"])
        param.addcdiv_(state["exp_avg"], denom, value=-group["lr"] / (1 - beta1 ** step))


RELATION_OPTIMIZERS = {"adagrad": RelationAdagrad, "adam": RelationAdam}


def build_relation_optimizer(kind: str, params, lr: float) -> RelationOptimizer:
    if kind not in RELATION_OPTIMIZERS:
        raise ValueError(f"unknown relation optimizer {kind!r}; known: {', '.join(RELATION_OPTIMIZERS)}")
    return RELATION_OPTIMIZERS[kind](params, lr)
