"""bfloat16 tables in the row kernels: stochastic rounding, the Adagrad update, add_rows_ and gathers."""

from __future__ import annotations

import pytest
import torch

from marius_py.pipeline.row_kernels import _adagrad_rows_torch, gather_rows, sparse_adagrad_
from marius_py.storage import rounding
from marius_py.storage.rounding import round_stochastic_bfloat16
from marius_py.pipeline.step import add_rows_


def neighbours(reference: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The two bfloat16 values around each float32 value (as float32): toward zero, away from it (the same
    for values bfloat16 represents)."""
    bits = reference.float().contiguous().view(torch.int32)
    low = bits & -(1 << 16)
    high = torch.where((bits & 0xFFFF) == 0, low, low + (1 << 16))
    return low.view(torch.float32), high.view(torch.float32)


def assert_neighbours(result: torch.Tensor, reference: torch.Tensor) -> None:
    """Each bfloat16 result is one of its float32 reference's two neighbours, and not always the same one."""
    assert result.dtype == torch.bfloat16
    low, high = neighbours(reference)
    got = result.float()
    assert ((got == low) | (got == high)).all(), "a value left its two bfloat16 neighbours"
    between = low != high
    assert (got == low)[between].any() and (got == high)[between].any(), "rounded one way only"


def assert_unbiased(result: torch.Tensor, reference: torch.Tensor, bound: float = 5.0) -> None:
    """The mean rounding error is within ``bound`` standard errors of zero (each rounding a Bernoulli draw)."""
    low, high = (t.double() for t in neighbours(reference))
    reference = reference.double()
    gap = high - low
    up = torch.where(gap != 0, (reference - low) / gap.where(gap != 0, 1), 0)  # the chance to round away from 0
    standard_error = (gap * gap * up * (1 - up)).sum().sqrt() / reference.numel()
    error = (result.double() - reference).mean()
    assert standard_error > 0 and abs(error) < bound * standard_error, (error, standard_error)


def bfloat16_values(shape, generator, scale=1.0, positive=False) -> torch.Tensor:
    values = torch.rand(shape, generator=generator) if positive else torch.randn(shape, generator=generator)
    return (values * scale).bfloat16()


# round_stochastic_bfloat16

def test_stochastic_rounding_picks_a_neighbour():
    generator = torch.Generator().manual_seed(0)
    values = torch.randn(20_000, generator=generator) * torch.logspace(-30, 30, 20_000)
    assert_neighbours(round_stochastic_bfloat16(values, seed=3), values)


@pytest.mark.parametrize("value", [1.0001, -3.14159, 2.5e-7, -1234.567, 3e-39])
def test_stochastic_rounding_is_unbiased(value):
    values = torch.full((400_000,), value, dtype=torch.float32)
    low, high = neighbours(values[:1])
    assert low != high, "the value must fall between two bfloat16 values"
    assert_unbiased(round_stochastic_bfloat16(values, seed=11), values)


def test_stochastic_rounding_keeps_bfloat16_values():
    generator = torch.Generator().manual_seed(1)
    special = torch.tensor([0.0, -0.0, 1.0, -2.0, float("inf"), float("-inf"), 1e-40, 3e38])
    values = torch.cat([bfloat16_values(5000, generator, 100.0), special.bfloat16()])
    rounded = round_stochastic_bfloat16(values.float(), seed=4, salt=9)
    assert torch.equal(rounded.view(torch.int16), values.view(torch.int16))  # bitwise: -0.0 stays -0.0


def test_stochastic_rounding_is_a_function_of_seed_and_salt():
    values = torch.randn(5000, generator=torch.Generator().manual_seed(2))
    first = round_stochastic_bfloat16(values, seed=5, salt=1)
    assert torch.equal(first, round_stochastic_bfloat16(values.clone(), seed=5, salt=1))
    assert torch.equal(first, round_stochastic_bfloat16(values, seed=torch.tensor([5]), salt=1))
    assert not torch.equal(first, round_stochastic_bfloat16(values, seed=6, salt=1))
    assert not torch.equal(first, round_stochastic_bfloat16(values, seed=5, salt=0))


def python_rounding(value_bits: int, column: int, seed: int, salt: int) -> int:
    """The rounding's documented hash and rounding in Python integers (exact): the bits of the bfloat16 result,
    widened to float32."""
    def mix32(x):
        for _ in range(2):
            x ^= x >> 16
            x = (x * 0x45D9F3B) & 0xFFFFFFFF
        return x ^ (x >> 16)
    key = mix32((column * 0x45D9F3B + ((seed ^ (seed >> 32)) & 0xFFFFFFFF) + salt * 0x2545F49) & 0xFFFFFFFF)
    noise = mix32(value_bits ^ key) & 0xFFFF
    return ((value_bits + noise) & 0xFFFFFFFF) & ~0xFFFF


@pytest.mark.parametrize("block_values", [7, 15, 1 << 18], ids=["blocks-of-one-row", "a-partial-last-block",
                                                                 "one-block"])
def test_stochastic_rounding_computes_the_documented_hash(monkeypatch, block_values):
    """The int32 hash, in blocks of rows, gives the bits of the hash on unbounded integers."""
    monkeypatch.setattr(rounding, "CPU_BLOCK_VALUES", block_values)
    generator = torch.Generator().manual_seed(7)
    values = torch.randn(40, 5, generator=generator) * torch.logspace(-20, 20, 5)
    values[0] = torch.tensor([-0.0, 3e38, -3e38, 1e-40, -1.5])
    seed, salt = (1 << 62) - 12345, 1
    rounded = round_stochastic_bfloat16(values, seed, salt).float().view(torch.int32).tolist()
    words = values.view(torch.int32).tolist()
    expected = [[python_rounding(word & 0xFFFFFFFF, column, seed, salt) for column, word in enumerate(row)]
                for row in words]
    assert [[bits & 0xFFFFFFFF for bits in row] for row in rounded] == expected
    flat = round_stochastic_bfloat16(values[3], seed, salt)  # 1-D: each value its own column, as in a row
    assert [bits & 0xFFFFFFFF for bits in flat.float().view(torch.int32).tolist()] == expected[3]


def test_stochastic_rounding_takes_float32_only():
    with pytest.raises(ValueError, match="float32"):
        round_stochastic_bfloat16(torch.ones(3, dtype=torch.float64), seed=0)


# sparse_adagrad_ on bfloat16 tables

def adagrad_case(state_width: int, num_grads: int, device: str, num_nodes=50, dim=6, num_rows=12, seed=0):
    """bfloat16 tables, their float32 copies, unique rows and float32 gradients [G, rows, d]."""
    generator = torch.Generator().manual_seed(seed)
    nodes = bfloat16_values((num_nodes, dim), generator)
    state = bfloat16_values((num_nodes, state_width), generator, positive=True)
    rows = torch.randperm(num_nodes, generator=generator)[:num_rows]
    grads = torch.randn(num_grads, num_rows, dim, generator=generator)
    return [t.to(device) for t in (nodes, state, rows, grads)]


def reference_adagrad(nodes, state, rows, grads, count, lr, eps):
    """The float32 update from the same (bfloat16-valued) tables, by the float32 torch version."""
    expected = nodes.float(), state.float()
    _adagrad_rows_torch(*expected, rows[:count], grads[:, :count], lr, eps)
    return expected


@pytest.mark.parametrize("state_width", [6, 1], ids=["full", "rowwise"])
@pytest.mark.parametrize("num_grads", [1, 3])
@pytest.mark.parametrize("count_on_device", [False, True])
def test_adagrad_on_bfloat16_tables_rounds_the_float32_update(state_width, num_grads, count_on_device):
    nodes, state, rows, grads = adagrad_case(state_width, num_grads, "cpu")
    start = nodes.clone(), state.clone()
    expected = reference_adagrad(nodes, state, rows, grads, 9, lr=0.1, eps=1e-10)
    count = torch.tensor([9]) if count_on_device else 9
    sparse_adagrad_(nodes, state, rows, grads if num_grads > 1 else grads[0], count, 0.1, 1e-10, seed=123)
    assert_neighbours(nodes, expected[0])  # the rows past count, bfloat16 values, must stay as they were
    low, high = neighbours(expected[1])
    assert ((state.float() == low) | (state.float() == high)).all()
    untouched = torch.ones(len(nodes), dtype=torch.bool)
    untouched[rows[:9]] = False
    assert torch.equal(nodes[untouched], start[0][untouched]) and torch.equal(state[untouched], start[1][untouched])
    assert not torch.equal(nodes[rows[:9]], start[0][rows[:9]]) and (state[rows[:9]] > start[1][rows[:9]]).any()


def test_adagrad_on_bfloat16_tables_is_unbiased():
    nodes, state, rows, grads = adagrad_case(16, 1, "cpu", num_nodes=3000, dim=16, num_rows=3000)
    expected = reference_adagrad(nodes, state, rows, grads, 3000, lr=0.01, eps=1e-10)
    sparse_adagrad_(nodes, state, rows, grads[0], None, 0.01, 1e-10, seed=8)
    assert_unbiased(nodes, expected[0])
    assert_unbiased(state, expected[1])


def test_adagrad_on_bfloat16_tables_depends_on_the_seed_alone():
    case = adagrad_case(6, 2, "cpu")
    results = []
    for seed in (5, torch.tensor([5]), 6):
        nodes, state, rows, grads = (t.clone() for t in case)
        sparse_adagrad_(nodes, state, rows, grads, 12, 0.1, 1e-10, seed=seed)
        results.append((nodes, state))
    for table in range(2):  # each table's noise comes from the seed
        assert torch.equal(results[0][table], results[1][table])
        assert not torch.equal(results[0][table], results[2][table])


def test_adagrad_on_bfloat16_tables_refuses_what_it_cannot_do():
    nodes, state, rows, grads = adagrad_case(6, 1, "cpu")
    with pytest.raises(ValueError, match="seed"):
        sparse_adagrad_(nodes, state, rows, grads[0], None, 0.1, 1e-10)
    with pytest.raises(ValueError, match="share a dtype"):
        sparse_adagrad_(nodes, state.float(), rows, grads[0], None, 0.1, 1e-10, seed=1)
    with pytest.raises(ValueError, match="share a dtype"):
        sparse_adagrad_(nodes.float(), state, rows, grads[0], None, 0.1, 1e-10, seed=1)
    with pytest.raises(ValueError, match="RowCache"):
        sparse_adagrad_(nodes, state, rows, grads[0], None, 0.1, 1e-10, cache=object(), seed=1)


# add_rows_

@pytest.mark.parametrize("state_width", [4, 1])
def test_add_rows_to_bfloat16_tables_rounds_the_float32_sum(state_width):
    generator = torch.Generator().manual_seed(3)
    embeddings = bfloat16_values((30, 4), generator)
    state = bfloat16_values((30, state_width), generator, positive=True)
    rows = torch.randperm(30, generator=generator)[:20]
    delta, squared = torch.randn(20, 4, generator=generator) * 0.05, torch.rand(20, state_width, generator=generator)
    expected = [table.float().index_add_(0, rows, update) for table, update in ((embeddings, delta), (state, squared))]
    add_rows_(embeddings, state, rows, delta, squared, seed=torch.tensor([17]))
    assert_neighbours(embeddings, expected[0])
    low, high = neighbours(expected[1])
    assert ((state.float() == low) | (state.float() == high)).all()
    with pytest.raises(ValueError, match="seed"):
        add_rows_(embeddings, state, rows, delta, squared)


def test_add_rows_keeps_updates_that_round_to_nearest_drops():
    delta = torch.full((1, 8), 1e-4)
    assert torch.equal((torch.ones(1, 8) + delta).bfloat16().float(), torch.ones(1, 8))  # nearest: lost for good
    sums = torch.zeros(1, 8, dtype=torch.float64)
    for seed in range(2000):
        embeddings, state = torch.ones(1, 8, dtype=torch.bfloat16), torch.ones(1, 1, dtype=torch.bfloat16)
        add_rows_(embeddings, state, torch.tensor([0]), delta, torch.zeros(1, 1), seed=seed)
        sums += embeddings.double()
        assert torch.equal(state, torch.ones(1, 1, dtype=torch.bfloat16))
    expected = 1.0 + float(delta[0, 0])
    # 16,000 draws of 1 + 2^-7 with chance 0.0128: a standard error of 6.9e-6
    assert abs(sums.mean().item() / 2000 - expected) < 3.5e-5


def test_add_rows_to_float32_tables_adds_exactly():
    embeddings, state = torch.zeros(5, 3), torch.zeros(5, 1)
    rows = torch.tensor([4, 1, 4])  # float32 tables: repeated rows add up
    add_rows_(embeddings, state, rows, torch.full((3, 3), 1e-4), torch.ones(3, 1))
    assert torch.equal(embeddings[4], torch.full((3,), 1e-4) + 1e-4) and state[:, 0].tolist() == [0, 1, 0, 0, 2]


# gather_rows

def test_gather_from_a_bfloat16_table_widens_the_rows():
    generator = torch.Generator().manual_seed(4)
    table = bfloat16_values((40, 5), generator)
    rows = torch.randint(40, (17,), generator=generator)
    out = gather_rows(table, rows, torch.full((17, 8), float("nan")), 11)
    assert torch.equal(out[:11, :5], table[rows[:11]].float()) and torch.equal(out[:11, 5:], torch.zeros(11, 3))
    assert out[11:].isnan().all()
    with pytest.raises(ValueError, match="RowCache"):
        gather_rows(table, rows, torch.empty(17, 5), None, cache=object())


# GPU: the Triton kernels

def cuda_adagrad(case, seed, lr=0.1, count=900):
    nodes, state, rows, grads = (t.clone().pin_memory() if t.is_pinned() else t.clone() for t in case)
    sparse_adagrad_(nodes, state, rows, grads if len(grads) > 1 else grads[0],
                    torch.tensor([count], device="cuda"), lr, 1e-10, seed=seed)
    torch.cuda.synchronize()  # pinned tables: the kernel writes them in place, asynchronously
    return nodes, state


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("state_width", [37, 1], ids=["full", "rowwise"])
@pytest.mark.parametrize("num_grads", [1, 2])
@pytest.mark.parametrize("pinned", [False, True])
def test_triton_adagrad_on_bfloat16_tables(state_width, num_grads, pinned):
    case = adagrad_case(state_width, num_grads, "cuda", num_nodes=3000, dim=37, num_rows=1000)
    if pinned:  # zero copy: the kernel updates pinned host rows in place
        case[:2] = [t.cpu().pin_memory() for t in case[:2]]
    seed = torch.tensor([2**40 + 7], dtype=torch.int64, device="cuda")
    nodes, state = cuda_adagrad(case, seed)
    expected_nodes, expected_state = (t.float().pin_memory() if pinned else t.float() for t in case[:2])
    # the float32 Triton kernel's update from the same values
    sparse_adagrad_(expected_nodes, expected_state, case[2], case[3] if num_grads > 1 else case[3][0],
                    torch.tensor([900], device="cuda"), 0.1, 1e-10)
    torch.cuda.synchronize()
    assert_neighbours(nodes, expected_nodes)
    assert_neighbours(state, expected_state)
    assert_unbiased(nodes, expected_nodes)
    assert_unbiased(state, expected_state)
    untouched = torch.ones(3000, dtype=torch.bool, device=case[2].device)
    untouched[case[2][:900]] = False
    untouched = untouched.to(nodes.device)
    assert torch.equal(nodes[untouched], case[0][untouched]) and torch.equal(state[untouched], case[1][untouched])
    again, other = cuda_adagrad(case, seed.clone()), cuda_adagrad(case, seed + 1)
    assert torch.equal(again[0], nodes) and torch.equal(again[1], state)
    assert not torch.equal(other[0], nodes) and not torch.equal(other[1], state)
    from_int = cuda_adagrad(case, 2**40 + 7)  # an int seed: the same stream as its tensor
    assert torch.equal(from_int[0], nodes) and torch.equal(from_int[1], state)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("state_width", [1024, 1], ids=["full", "rowwise"])
def test_triton_adagrad_rounds_the_state_independently_of_the_embeddings(state_width):
    """Embeddings and state sit halfway between bfloat16 neighbours after the step. The noise is a hash of the
    seed, the table's salt, the column and the value: the embeddings (distinct values) round up about half the
    time, and the state's noise is not the embeddings' (they agree about half the time). Equal values in one
    column of one update round alike: the row-wise state, one value of 1 in every row, goes one way."""
    rows = torch.arange(500, device="cuda")[:, None]
    steps = ((rows * 7 + torch.arange(1024, device="cuda")) % 100).float()
    nodes = (1 + steps * 2 ** -7).to(torch.bfloat16)  # distinct values, each exact in bfloat16
    state = torch.ones(500, state_width, dtype=torch.bfloat16, device="cuda")
    grad = torch.full((500, 1024), 2 ** -4, device="cuda")  # the state gains 2^-8: half its gap above 1 (2^-7)
    lr = -(2 ** -4) * (1 + 2 ** -8) ** 0.5  # a step of +2^-8 too
    before = nodes.float()
    sparse_adagrad_(nodes, state, torch.arange(500, device="cuda"), grad, None, lr, 0.0, seed=3)
    up_nodes = nodes.float() > before
    assert 0.45 < up_nodes.float().mean() < 0.55
    if state_width == 1:
        assert state.eq(state[0, 0]).all()
        return
    up_state = state.float() > 1
    assert 0.45 < up_state.float().mean() < 0.55
    assert 0.45 < (up_nodes == up_state).float().mean() < 0.55


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("pinned", [False, True])
def test_triton_gather_from_a_bfloat16_table(out_dtype, pinned):
    generator = torch.Generator().manual_seed(6)
    table = bfloat16_values((5000, 37), generator)
    table = table.pin_memory() if pinned else table.cuda()
    rows = torch.randint(5000, (3000,), generator=generator)
    out = gather_rows(table, rows.cuda(), torch.full((3000, 40), float("nan"), dtype=out_dtype, device="cuda"),
                      torch.tensor([2500], device="cuda"))
    expected = gather_rows(table.cpu(), rows, torch.full((3000, 40), float("nan"), dtype=out_dtype), 2500)
    assert torch.equal(out[:2500].cpu(), expected[:2500]) and out[2500:].isnan().all()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_torch_rounding_on_a_triton_machine_matches_the_cpu():
    """Where Triton is installed, the torch rounding (CPU pipeline, torch fallbacks) still runs the torch hash:
    on CUDA and on the CPU it gives the same bits (the Triton helpers once shadowed the torch ones)."""
    values = torch.randn(300, 37, generator=torch.Generator().manual_seed(4))
    on_cpu = round_stochastic_bfloat16(values, 11, 1)
    on_gpu = round_stochastic_bfloat16(values.cuda(), 11, 1)
    assert torch.equal(on_gpu.cpu(), on_cpu)
