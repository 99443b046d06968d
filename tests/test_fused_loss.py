"""The fused shared-negative softmax cross-entropy against plain autograd."""

from __future__ import annotations

import pytest
import torch

from marius_py.step.fused_loss import shared_negative_softmax_ce


def reference_loss(queries, candidates, positive, target_ids, candidate_ids, weight):
    scores = torch.bmm(queries, candidates.transpose(1, 2))
    scores = scores.masked_fill(target_ids[:, :, None] == candidate_ids[:, None, :], float("-inf"))
    logits = torch.cat([positive[..., None], scores], dim=-1)
    return ((torch.logsumexp(logits, -1) - positive) * weight).sum()


def make_case(groups=4, rows=6, candidates=9, dim=5, nodes=12, device="cpu", dtype=torch.float64, seed=0):
    generator = torch.Generator().manual_seed(seed)
    q = torch.randn(groups, rows, dim, generator=generator, dtype=dtype)
    c = torch.randn(groups, candidates, dim, generator=generator, dtype=dtype)
    pos = torch.randn(groups, rows, generator=generator, dtype=dtype)
    target_ids = torch.randint(nodes, (groups, rows), generator=generator)
    candidate_ids = torch.randint(nodes, (groups, candidates), generator=generator)
    weight = torch.ones(groups, rows, dtype=dtype) / rows
    weight[-1, -2:] = 0  # chunk padding rows
    return [t.to(device).requires_grad_(t.is_floating_point()) for t in (q, c, pos)] + \
        [t.to(device) for t in (target_ids, candidate_ids, weight)]


def grads(loss_fn, case):
    q, c, pos, *rest = case
    loss = loss_fn(q, c, pos, *rest)
    dq, dc, dpos = torch.autograd.grad(loss * 1.7, (q, c, pos))  # a non-unit upstream gradient
    return loss.detach(), dq, dc, dpos


def test_matches_autograd_with_masked_candidates_and_padding():
    case = make_case()
    assert (case[3][:, :, None] == case[4][:, None, :]).any(), "the case must contain accidental positives"
    for got, expected in zip(grads(shared_negative_softmax_ce, case), grads(reference_loss, case)):
        torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-12)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize(("candidates", "rows"), [(7, 50), (1000, 64), (1000, 50), (2500, 48), (1001, 64),
                                                 (2501, 48), (14541, 16)])
def test_triton_kernel_matches_autograd(candidates, rows):
    case = make_case(groups=3, rows=rows, candidates=candidates, dim=16, nodes=400, device="cuda",
                     dtype=torch.float32)
    expected = grads(reference_loss, case)
    for got, want in zip(grads(shared_negative_softmax_ce, case), expected):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    bf16 = grads(lambda *a: shared_negative_softmax_ce(*a, score_dtype=torch.bfloat16), case)
    for got, want in zip(bf16, expected):
        torch.testing.assert_close(got, want, rtol=5e-2, atol=5e-3)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=[
    pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")])])
@pytest.mark.parametrize("form", ["dot", "l2"])
@pytest.mark.parametrize("tiled", [False, True])
def test_candidates_with_id_minus_one_are_padding(monkeypatch, device, form, tiled):
    """Padding candidates (id -1, as cuBLAS's aligned kernels get them) change neither the loss nor a gradient,
    and their own gradient is zero: whole blocks and candidate tiles, dot products and squared L2."""
    from marius_py.step import fused_loss
    dtype = torch.float64 if device == "cpu" else torch.float32
    q, c, pos, target_ids, candidate_ids, weight = (t.detach() for t in make_case(
        groups=2, rows=6, candidates=9, dim=5, device=device, dtype=dtype))
    padded_c = torch.cat([c, torch.randn(2, 3, 5, dtype=dtype, device=device)], 1)  # any values
    padded_ids = torch.cat([candidate_ids, torch.full((2, 3), -1, device=device)], 1)
    score_form = fused_loss.score_form(form, 5)
    whole = fused_loss.softmax_ce_gradients(q, c, pos, target_ids, candidate_ids, weight, dtype, score_form)
    tiles = []
    if tiled:  # on the CPU, tiles of 3 candidates: the last holds padding only
        monkeypatch.setattr(fused_loss, "SCORE_BLOCK_BYTES", 2 * 6 * (q.element_size() + 2 * 8) * 3)
        tiled_gradients = fused_loss._tiled_softmax_ce_gradients
        monkeypatch.setattr(fused_loss, "_tiled_softmax_ce_gradients",
                            lambda *args: tiles.append(args[6]) or tiled_gradients(*args))
    padded = fused_loss.softmax_ce_gradients(q, padded_c, pos, target_ids, padded_ids, weight, dtype, score_form)
    if device == "cpu":  # (on CUDA the block fits this budget: tiles are at least 16 candidates there)
        assert tiles == ([3] if tiled else [])
    tolerance = {"rtol": 1e-10, "atol": 1e-12} if dtype == torch.float64 else {"rtol": 1e-4, "atol": 1e-5}
    for got, expected in zip([padded[0], padded[1], padded[2][:, :9], padded[3]], whole):
        torch.testing.assert_close(got, expected, **tolerance)
    assert (padded[2][:, 9:] == 0).all()


def test_candidates_are_padded_to_16_bytes_on_cuda_for_matmuls():
    """cuBLAS runs its tensor-core kernels only on score rows of whole 16 bytes: 14,546 candidates get 2 more
    (float32) or 6 (bfloat16) on CUDA; none on the CPU, and none for the pairwise (L1, RotatE) kernels."""
    from marius_py.step.fused_loss import candidate_padding, pad_candidate_ids, score_form
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert candidate_padding(14546, torch.float32, cuda, score_form("dot", 8)) == 2
    assert candidate_padding(14546, torch.bfloat16, cuda, score_form("dot", 8)) == 6
    assert candidate_padding(14546, torch.float32, cuda, score_form("l2", 8)) == 2
    assert candidate_padding(14544, torch.float32, cuda, score_form("dot", 8)) == 0
    assert candidate_padding(14546, torch.float32, cpu, score_form("dot", 8)) == 0
    assert candidate_padding(14546, torch.float32, cuda, score_form("l1", 8)) == 0
    padded = pad_candidate_ids(torch.arange(6).view(2, 3), 2)
    assert padded.tolist() == [[0, 1, 2, -1, -1], [3, 4, 5, -1, -1]]


@pytest.mark.parametrize("tile_columns", [1, 3, 7, 50])
def test_tiled_score_block_equals_the_whole_block(monkeypatch, tile_columns):
    """Over the byte budget, the block is computed in candidate tiles: same loss and gradients (float64)."""
    from marius_py.step import fused_loss
    generator = torch.Generator().manual_seed(tile_columns)
    groups, rows, num_candidates, dim = 2, 5, 11, 4
    queries = torch.randn(groups, rows, dim, generator=generator, dtype=torch.float64)
    candidates = torch.randn(groups, num_candidates, dim, generator=generator, dtype=torch.float64)
    positive = torch.randn(groups, rows, generator=generator, dtype=torch.float64)
    candidate_ids = torch.randint(20, (groups, num_candidates), generator=generator)
    target_ids = candidate_ids[:, :rows].clone()  # every row has its target among the candidates: masked
    weight = torch.rand(groups, rows, generator=generator, dtype=torch.float64)
    args = (queries, candidates, positive, target_ids, candidate_ids, weight, torch.float64)
    whole = fused_loss.softmax_ce_gradients(*args)
    monkeypatch.setattr(fused_loss, "SCORE_BLOCK_BYTES", groups * rows * 8 * tile_columns)
    tiled = fused_loss.softmax_ce_gradients(*args)
    for got, expected in zip(tiled, whole):
        torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-14)
