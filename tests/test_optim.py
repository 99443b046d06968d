"""SparseAdagrad against torch.optim.Adagrad and against the row-wise hand formula; the relation optimizers
against torch.optim's."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
import torch

from marius_py.optim import RelationAdagrad, RelationAdam, SparseAdagrad, build_relation_optimizer

NUM_ROWS = 10
DIM = 4


def _rel_close(actual, expected, rel=1e-6):
    torch.testing.assert_close(actual, expected, rtol=rel, atol=1e-12)


# Row subsets of successive steps: duplicate-free, in arbitrary order, some rows never touched
# (rows 8 and 9), one step touching a single row, one touching rows already touched before.
STEP_ROWS = [[0, 3, 5], [7, 2, 5, 1], [4], [3, 0, 6, 2, 7], [5, 1, 4, 6], [2]]


@pytest.mark.parametrize("lr", [0.1, 0.5])
def test_full_variant_matches_torch_adagrad(lr):
    g = torch.Generator().manual_seed(0)
    initial = torch.randn(NUM_ROWS, DIM, generator=g, dtype=torch.float64)

    # library: compute + apply on the touched rows only
    embeddings = initial.clone()
    optimizer = SparseAdagrad(lr)
    assert optimizer.state_dim(DIM) == DIM
    state = torch.zeros(NUM_ROWS, optimizer.state_dim(DIM), dtype=torch.float64)

    # reference: dense torch Adagrad, gradient zero on untouched rows
    param = torch.nn.Parameter(initial.clone())
    reference = torch.optim.Adagrad([param], lr=lr, eps=1e-10)

    for rows in STEP_ROWS:
        grad_rows = torch.randn(len(rows), DIM, generator=g, dtype=torch.float64)
        row_ids = torch.tensor(rows)
        delta, squared = optimizer.compute(grad_rows, state[row_ids])
        SparseAdagrad.apply(embeddings, state, row_ids, delta, squared)

        dense = torch.zeros(NUM_ROWS, DIM, dtype=torch.float64)
        dense[row_ids] = grad_rows
        param.grad = dense
        reference.step()

        _rel_close(embeddings, param.detach())
        _rel_close(state, reference.state[param]["sum"])

    # rows 8 and 9 were never touched: bit-for-bit unchanged, zero state
    assert torch.equal(embeddings[8:], initial[8:])
    assert torch.equal(state[8:], torch.zeros(2, DIM, dtype=torch.float64))
    # and the touched rows did move
    assert not torch.equal(embeddings[:8], initial[:8])


def test_full_variant_written_out_step():
    """One step by hand: state 3, g = 2 -> delta = -lr * 2 / sqrt(3 + 4) = -0.2 / sqrt(7)."""
    optimizer = SparseAdagrad(0.1)
    delta, squared = optimizer.compute(torch.tensor([[2.0, -1.0]], dtype=torch.float64),
                                       torch.tensor([[3.0, 0.0]], dtype=torch.float64))
    assert squared.tolist() == [[4.0, 1.0]]
    assert delta[0, 0].item() == pytest.approx(-0.2 / (math.sqrt(7) + 1e-10), rel=1e-12)
    assert delta[0, 1].item() == pytest.approx(0.1 / (1.0 + 1e-10), rel=1e-12)


def test_rowwise_variant_against_hand_formula():
    lr, eps = 0.3, 1e-10
    g = torch.Generator().manual_seed(1)
    initial = torch.randn(NUM_ROWS, DIM, generator=g, dtype=torch.float64)
    optimizer = SparseAdagrad(lr, rowwise=True)
    assert optimizer.state_dim(DIM) == 1
    embeddings = initial.clone()
    state = torch.zeros(NUM_ROWS, 1, dtype=torch.float64)

    # plain-Python reference
    ref_emb = initial.tolist()
    ref_state = [0.0] * NUM_ROWS
    for rows in STEP_ROWS:
        grad_rows = torch.randn(len(rows), DIM, generator=g, dtype=torch.float64)
        row_ids = torch.tensor(rows)
        delta, squared = optimizer.compute(grad_rows, state[row_ids])
        assert delta.shape == (len(rows), DIM) and squared.shape == (len(rows), 1)
        SparseAdagrad.apply(embeddings, state, row_ids, delta, squared)
        for row, grad in zip(rows, grad_rows.tolist()):
            ref_state[row] += sum(x * x for x in grad) / DIM
            for k in range(DIM):
                ref_emb[row][k] += -lr * grad[k] / (math.sqrt(ref_state[row]) + eps)
        _rel_close(embeddings, torch.tensor(ref_emb, dtype=torch.float64), rel=1e-9)
        _rel_close(state[:, 0], torch.tensor(ref_state, dtype=torch.float64), rel=1e-9)
    assert torch.equal(embeddings[8:], initial[8:])


def test_rowwise_written_out_step():
    """g = (3, 4), state 0: mean g^2 = 12.5; delta = -lr * g / sqrt(12.5)."""
    delta, squared = SparseAdagrad(1.0, rowwise=True).compute(
        torch.tensor([[3.0, 4.0]], dtype=torch.float64), torch.zeros(1, 1, dtype=torch.float64))
    assert squared.tolist() == [[12.5]]
    assert delta.tolist()[0] == pytest.approx([-3 / math.sqrt(12.5), -4 / math.sqrt(12.5)], rel=1e-9)


def test_apply_is_additive_for_repeated_rows():
    """index_add semantics: two updates for the same row both land (no lost update)."""
    embeddings = torch.zeros(3, 2, dtype=torch.float64)
    state = torch.zeros(3, 2, dtype=torch.float64)
    rows = torch.tensor([1, 1, 2])
    delta = torch.tensor([[1.0, 2.0], [10.0, 20.0], [5.0, 5.0]], dtype=torch.float64)
    squared = torch.tensor([[1.0, 1.0], [2.0, 2.0], [3.0, 3.0]], dtype=torch.float64)
    SparseAdagrad.apply(embeddings, state, rows, delta, squared)
    assert embeddings.tolist() == [[0, 0], [11, 22], [5, 5]]
    assert state.tolist() == [[0, 0], [3, 3], [3, 3]]


def test_build_relation_optimizer():
    param = torch.nn.Parameter(torch.zeros(3))
    adagrad = build_relation_optimizer("adagrad", [param], 0.25)
    assert isinstance(adagrad, RelationAdagrad) and adagrad.param_groups[0]["lr"] == 0.25
    adam = build_relation_optimizer("adam", [param], 0.01)
    assert isinstance(adam, RelationAdam) and adam.param_groups[0]["lr"] == 0.01
    with pytest.raises(ValueError, match="unknown relation optimizer"):
        build_relation_optimizer("sgd", [param], 0.1)


@pytest.mark.parametrize("kind, reference", [("adagrad", torch.optim.Adagrad), ("adam", torch.optim.Adam)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_relation_optimizers_step_as_torch_optim_does_and_share_its_checkpoints(kind, reference, dtype):
    """Bit for bit torch.optim's single-tensor steps (what it runs on a CPU) over several steps and two
    parameters, and each one's state dict loads in the other and continues alike."""
    generator = torch.Generator().manual_seed(0)
    start = [torch.randn(5, 4, generator=generator, dtype=dtype), torch.randn(3, dtype=dtype, generator=generator)]
    grads = [[torch.randn(p.shape, generator=generator, dtype=dtype) for p in start] for _ in range(6)]

    def trained(make, steps, loaded=None):
        params = [torch.nn.Parameter(p.clone()) for p in start]
        optimizer = make(params)
        if loaded is not None:
            for param, value in zip(params, loaded[0]):
                param.data.copy_(value)
            optimizer.load_state_dict(loaded[1])
        for step_grads in steps:
            for param, grad in zip(params, step_grads):
                param.grad = grad.clone()
            optimizer.step()
        return [p.detach().clone() for p in params], optimizer.state_dict()

    ours = lambda params: build_relation_optimizer(kind, params, 0.05)  # noqa: E731
    theirs = lambda params: reference(params, lr=0.05, foreach=False)  # noqa: E731
    for got, expected in zip(trained(ours, grads)[0], trained(theirs, grads)[0]):
        assert torch.equal(got, expected)
    # A checkpoint of either, resumed by the other, continues as the uninterrupted reference.
    expected = trained(theirs, grads)[0]
    for first, second in ((ours, theirs), (theirs, ours)):
        halfway = trained(first, grads[:3])
        for got, want in zip(trained(second, grads[3:], loaded=halfway)[0], expected):
            assert torch.equal(got, want)


def test_building_a_model_imports_no_torch_dynamo():
    """torch.optim's optimizers import torch._dynamo when built (seconds of start-up); the relation
    optimizers do not."""
    code = ("import sys, torch; from marius_py.step.model import StepModel; "
            "from marius_py.config_loading import load_config; "
            "StepModel(load_config(None, ['model.dim=8']), 10, 3, torch.device('cpu')); "
            "StepModel(load_config(None, ['model.dim=8', 'training.relation_optimizer=adam']), 10, 3, "
            "torch.device('cpu')); "
            "print('torch._dynamo' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"
