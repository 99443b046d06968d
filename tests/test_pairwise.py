"""Distance score blocks (marius_py/step/pairwise.py) against autograd of the naive broadcast formula."""

from __future__ import annotations

import pytest
import torch

from marius_py.step import pairwise, pairwise_cuda
from marius_py.step.pairwise import pairwise_backward, pairwise_scores

# G, M, N, row width w, dim: padding (w > dim), sizes that fill no tile evenly, one pair, G = 1.
SHAPES = [(2, 7, 5, 10, 8), (3, 11, 13, 6, 6), (1, 1, 1, 4, 2), (2, 9, 1, 12, 10)]


def naive_scores(queries: torch.Tensor, candidates: torch.Tensor, dim: int, kind: str) -> torch.Tensor:
    diff = queries[:, :, None, :dim] - candidates[:, None, :, :dim]
    if kind == "l1":
        return -diff.abs().sum(-1)
    half = dim // 2
    re, im = diff[..., :half], diff[..., half:]
    return -torch.sqrt(re * re + im * im + 1e-12).sum(-1)


def naive_gradients(weights, queries, candidates, dim, kind):
    q, c = queries.clone().requires_grad_(), candidates.clone().requires_grad_()
    (weights * naive_scores(q, c, dim, kind)).sum().backward()
    return q.grad, c.grad


def random_inputs(shape, integers=False, dtype=torch.float64, device="cpu"):
    """queries, candidates, weights; ``integers``: small integers, with many exact ties q_k == c_k."""
    groups, num_queries, num_candidates, width, _ = shape
    generator = torch.Generator().manual_seed(sum(shape))

    def make(*size):
        if integers:
            return torch.randint(-2, 3, size, generator=generator).to(dtype)
        return torch.randn(*size, generator=generator, dtype=dtype)

    tensors = make(groups, num_queries, width), make(groups, num_candidates, width), \
        torch.randn(groups, num_queries, num_candidates, generator=generator, dtype=dtype)
    return tuple(t.to(device) for t in tensors)


@pytest.mark.parametrize("kind", ["l1", "modulus"])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("integers", [False, True])
def test_torch_version_matches_autograd(monkeypatch, kind, shape, integers):
    monkeypatch.setattr(pairwise, "BROADCAST_ELEMENTS", 64)  # many tiles, ragged at the edges
    queries, candidates, weights = random_inputs(shape, integers)
    dim = shape[4]
    scores = pairwise_scores(queries, candidates, dim, kind)
    grad_queries, grad_candidates = pairwise_backward(weights, queries, candidates, dim, kind)
    expected_queries, expected_candidates = naive_gradients(weights, queries, candidates, dim, kind)
    assert scores.dtype == grad_queries.dtype == grad_candidates.dtype == torch.float64
    torch.testing.assert_close(scores, naive_scores(queries, candidates, dim, kind), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(grad_queries, expected_queries, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(grad_candidates, expected_candidates, rtol=1e-12, atol=1e-12)
    assert not grad_queries[..., dim:].any() and not grad_candidates[..., dim:].any()


def test_float32_inputs_give_float32_and_empty_blocks_work():
    queries, candidates, weights = (t.float() for t in random_inputs((2, 3, 4, 6, 4)))
    assert pairwise_scores(queries, candidates, 4, "l1").dtype == torch.float32
    assert all(g.dtype == torch.float32 for g in pairwise_backward(weights, queries, candidates, 4, "modulus"))
    assert pairwise_scores(queries, candidates[:, :0], 4, "l1").shape == (2, 3, 0)
    grad_queries, grad_candidates = pairwise_backward(weights[:, :, :0], queries, candidates[:, :0], 4, "modulus")
    assert not grad_queries.any() and grad_candidates.shape == (2, 0, 6)


def test_rejects_bad_arguments():
    queries, candidates, _ = random_inputs((1, 2, 3, 6, 6))
    with pytest.raises(ValueError, match="unknown"):
        pairwise_scores(queries, candidates, 6, "l2")
    with pytest.raises(ValueError, match="even"):
        pairwise_scores(queries, candidates, 5, "modulus")
    with pytest.raises(ValueError, match="exceeds"):
        pairwise_scores(queries, candidates, 7, "l1")


def use_gpu_kernels(monkeypatch, implementation: str, kind: str) -> None:
    """Route the block to ``implementation``: "nvrtc" (pairwise_cuda) or "triton"; skip where the machine
    has neither, so that no test silently checks the same kernels twice."""
    if not pairwise.use_triton(torch.empty(1, device="cuda")):
        pytest.skip("needs Triton")
    if implementation == "triton":
        monkeypatch.setenv(pairwise_cuda.OPT_OUT, "0")
        return
    if not hasattr(torch.cuda, "_compile_kernel"):
        pytest.skip(f"torch {torch.__version__} cannot compile CUDA kernels at run time")
    monkeypatch.delenv(pairwise_cuda.OPT_OUT, raising=False)
    assert pairwise_cuda.serves(kind, torch.ones(1, 1, 1, device="cuda"))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("implementation", ["nvrtc", "triton"])
@pytest.mark.parametrize("kind", ["l1", "modulus"])
# Ragged tiles; few queries to many candidates (on most GPUs the queries' reduction is sliced); one row each.
@pytest.mark.parametrize("shape", [(3, 517, 301, 136, 130), (1, 70, 1500, 100, 100), (2, 33, 31, 8, 6),
                                   (2, 5, 3000, 40, 38), (1, 1, 1, 4, 4)])
def test_gpu_kernels_match_torch_version(monkeypatch, implementation, kind, shape):
    use_gpu_kernels(monkeypatch, implementation, kind)
    queries, candidates, weights = random_inputs(shape, dtype=torch.float32, device="cuda")
    queries = torch.nn.functional.pad(queries, (0, 5))[..., :shape[3]]  # rows strided wider than w
    dim = shape[4]
    results = pairwise_scores(queries, candidates, dim, kind), *pairwise_backward(weights, queries, candidates,
                                                                                   dim, kind)
    expected = pairwise._scores_torch(queries, candidates, dim, kind), \
        *pairwise._backward_torch(weights, queries, candidates, dim, kind)
    if kind == "l1":
        expected = expected[0], *with_ties_positive(expected[1:], weights, queries, candidates, dim)
    for result, reference in zip(results, expected):
        assert result.dtype == torch.float32 and result.shape == reference.shape
        scale = reference.abs().max().item()
        torch.testing.assert_close(result, reference, rtol=1e-4, atol=1e-4 * max(1.0, scale))
    assert not results[1][..., dim:].any() and not results[2][..., dim:].any()


def with_ties_positive(gradients, weights, queries, candidates, dim):
    """The torch version's L1 gradients with the Triton kernels' convention at exact ties (q_k == c_k):
    the sign bit of q_k - c_k = +0, so +1, where torch takes 0 (the test inputs hold no -0.0). Random
    float32 inputs of these sizes hold a pair or two."""
    ties = (queries[:, :, None, :dim] - candidates[:, None, :, :dim] == 0).to(weights.dtype)
    grad_queries, grad_candidates = (g.clone() for g in gradients)
    grad_queries[..., :dim] -= torch.einsum("gmn,gmnk->gmk", weights, ties)
    grad_candidates[..., :dim] += torch.einsum("gmn,gmnk->gnk", weights, ties)
    return grad_queries, grad_candidates


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("implementation", ["nvrtc", "triton"])
def test_gpu_l1_gradient_takes_plus_one_at_exact_ties(monkeypatch, implementation):
    use_gpu_kernels(monkeypatch, implementation, "l1")
    queries, candidates, weights = random_inputs((2, 40, 50, 12, 12), integers=True, dtype=torch.float32,
                                                 device="cuda")
    reference = pairwise._backward_torch(weights, queries, candidates, 12, "l1")
    ties_positive = with_ties_positive(reference, weights, queries, candidates, 12)
    assert not torch.allclose(ties_positive[0], reference[0])  # the inputs hold ties: the conventions differ
    for result, expected in zip(pairwise_backward(weights, queries, candidates, 12, "l1"), ties_positive):
        torch.testing.assert_close(result, expected, rtol=1e-5, atol=1e-4)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_triton_kernels_serve_where_nvrtc_fails(monkeypatch):
    if not pairwise.use_triton(torch.empty(1, device="cuda")):
        pytest.skip("needs Triton")

    def refuse(source, name):
        raise RuntimeError("no NVRTC here")
    monkeypatch.setattr(pairwise_cuda, "compile_kernel", refuse)
    monkeypatch.setattr(pairwise_cuda, "_kernels", {})  # compiled kernels of earlier tests are forgotten
    monkeypatch.delenv(pairwise_cuda.OPT_OUT, raising=False)
    queries, candidates, weights = random_inputs((2, 30, 20, 12, 10), dtype=torch.float32, device="cuda")
    with pytest.warns(RuntimeWarning, match="Triton kernels serve instead"):
        scores = pairwise_scores(queries, candidates, 10, "l1")
    torch.testing.assert_close(scores, pairwise._scores_torch(queries, candidates, 10, "l1"))
    assert not pairwise_cuda.serves("l1", queries, candidates)  # refused once, not compiled again


def test_nvrtc_kernels_take_only_float32_cuda_blocks_within_their_limits(monkeypatch):
    cpu = torch.ones(1, 2, 4)
    assert not pairwise_cuda.serves("l1", cpu)
    assert pairwise._compiled_inputs("modulus", cpu, cpu) is None
    if torch.cuda.is_available():
        monkeypatch.delenv(pairwise_cuda.OPT_OUT, raising=False)
        gpu = cpu.cuda()
        assert pairwise_cuda.serves("l1", gpu) == hasattr(torch.cuda, "_compile_kernel")
        assert not pairwise_cuda.serves("l1", gpu.double(), gpu)
        assert not pairwise_cuda.serves("l1", gpu[..., :0])
        huge_strides = gpu.as_strided((1, 1, 4), (2**31, 2**31, 1))  # integers past the kernels' 32 bits
        assert not pairwise_cuda.serves("l1", huge_strides)
        assert not pairwise_cuda.serves("l1", torch.ones(70_000, 1, 4, device="cuda"))  # G past the grid's z
        for value in ("0", "off", "False"):
            monkeypatch.setenv(pairwise_cuda.OPT_OUT, value)
            assert not pairwise_cuda.serves("l1", gpu)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("implementation", ["nvrtc", "triton"])
@pytest.mark.parametrize("kind", ["l1", "modulus"])
def test_gpu_kernels_give_float32_whatever_the_default_dtype(monkeypatch, implementation, kind):
    use_gpu_kernels(monkeypatch, implementation, kind)
    queries, candidates, weights = random_inputs((2, 30, 20, 12, 10), dtype=torch.float32, device="cuda")
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        results = pairwise_scores(queries, candidates, 10, kind), *pairwise_backward(weights, queries, candidates,
                                                                                      10, kind)
    finally:
        torch.set_default_dtype(default)
    expected = pairwise._scores_torch(queries, candidates, 10, kind), \
        *pairwise._backward_torch(weights, queries, candidates, 10, kind)
    if kind == "l1":
        expected = expected[0], *with_ties_positive(expected[1:], weights, queries, candidates, 10)
    for result, reference in zip(results, expected):
        assert result.dtype == torch.float32
        torch.testing.assert_close(result, reference, rtol=1e-4, atol=1e-4 * max(1.0, reference.abs().max().item()))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("implementation", ["nvrtc", "triton"])
def test_modulus_padding_adds_nothing(monkeypatch, implementation):
    """Identical rows: each of the 3 complex coordinates adds sqrt(1e-12) = 1e-6 and nothing else, however many
    padded coordinates the kernel's last tile holds."""
    use_gpu_kernels(monkeypatch, implementation, "modulus")
    rows = torch.zeros(1, 3, 6, device="cuda")
    scores = pairwise_scores(rows, rows[:, :2], 6, "modulus")
    torch.testing.assert_close(scores, torch.full((1, 3, 2), -3e-6, device="cuda"), rtol=0, atol=1e-9)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_blocks_past_the_nvrtc_grid_go_to_triton(monkeypatch):
    use_gpu_kernels(monkeypatch, "nvrtc", "l1")
    queries, candidates, weights = random_inputs((70_000, 2, 3, 4, 4), dtype=torch.float32, device="cuda")
    assert not pairwise_cuda.serves("l1", weights, queries, candidates)
    torch.testing.assert_close(pairwise_scores(queries, candidates, 4, "l1"),
                               pairwise._scores_torch(queries, candidates, 4, "l1"))


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
@pytest.mark.parametrize("kind", ["l1", "modulus"])
def test_nvrtc_kernels_run_on_a_second_gpu_while_another_is_current(monkeypatch, kind):
    use_gpu_kernels(monkeypatch, "nvrtc", kind)
    queries, candidates, weights = random_inputs((2, 300, 200, 40, 40), dtype=torch.float32, device="cuda:1")
    assert pairwise_cuda.serves(kind, queries, candidates)
    with torch.cuda.device(0):  # each device has its own compiled kernels and stream
        results = pairwise_scores(queries, candidates, 40, kind), *pairwise_backward(weights, queries, candidates,
                                                                                      40, kind)
    expected = pairwise._scores_torch(queries, candidates, 40, kind), \
        *pairwise._backward_torch(weights, queries, candidates, 40, kind)
    if kind == "l1":
        expected = expected[0], *with_ties_positive(expected[1:], weights, queries, candidates, 40)
    for result, reference in zip(results, expected):
        assert result.device == torch.device("cuda:1")
        torch.testing.assert_close(result, reference, rtol=1e-4, atol=1e-4 * max(1.0, reference.abs().max().item()))
