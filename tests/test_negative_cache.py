"""The negative cache (storage.negative_cache): blocks of non-resident partitions as negatives.

Stores here encode each row's global id (``test_buffer``), so a cached row
holding the wrong node, or a stale copy, is caught exactly.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from test_buffer import DIM, HAND_STATES, STATE_DIM, expected_tables, id_rows, make_store

import marius_py as mp
from marius_py.config import load_config
from marius_py.errors import MariusInputError
from marius_py.negatives import CandidateRows
from marius_py.preprocess import PreprocessOptions, preprocess
from marius_py.orderings import build_ordering, simulate
from marius_py.storage.buffer import PartitionBuffer
from marius_py.storage.embedding_store import EmbeddingStore
from marius_py.storage.negative_cache import NegativeCache, cache_bytes_per_epoch, cached_rows, merged

NUM_NODES, NUM_PARTITIONS = 19, 5  # 4 rows per partition, the last has 3
UMLS_RAW = Path(__file__).parent / "data" / "umls"


def make_buffer(tmp_path, refresh="evict", gradients="drop", fraction=0.5, dtype=torch.float32):
    """A buffer of capacity 2 with a cache over a store of ``starting_tables(dtype)``."""
    store = make_store(tmp_path / "s", NUM_NODES, NUM_PARTITIONS)
    if dtype != torch.float32:
        store = EmbeddingStore.create(tmp_path / "b", NUM_NODES, DIM, STATE_DIM, NUM_PARTITIONS, dtype=dtype)
        store.write_all(*starting_tables(dtype))
    cache = NegativeCache(NUM_NODES, NUM_PARTITIONS, store.rows_per_partition, fraction, refresh, gradients, seed=1)
    return store, PartitionBuffer(store, capacity=2, cache=cache)


def starting_tables(dtype: torch.dtype) -> tuple[np.ndarray, np.ndarray]:
    """The stores' rows: ids with quarters (``test_buffer``) in float32; in bfloat16 whole numbers, which it
    holds exactly up to 256, so that the walks below stay exact."""
    if dtype == torch.float32:
        return expected_tables(NUM_NODES)
    return id_rows(NUM_NODES, DIM, step=1.0), id_rows(NUM_NODES, STATE_DIM, sign=-1.0, step=-1.0)


def block_ids(buffer: PartitionBuffer, partition: int) -> np.ndarray:
    """Global node ids of the rows ``partition``'s block holds."""
    return buffer.store.bounds(partition)[0] + buffer.cache.rows_in_partition(partition)


def cached(buffer: PartitionBuffer, partition: int) -> tuple[np.ndarray, np.ndarray]:
    region = buffer.cache.region(partition)
    return buffer.embeddings[region].float().numpy(), buffer.state[region].float().numpy()


def test_cached_rows_rounds_a_fraction_of_a_partition():
    assert cached_rows(1000, 0.0) == 0
    assert cached_rows(1000, 0.05) == 50
    assert cached_rows(3, 0.01) == 1  # at least one row
    # the last partition may be short: the block is cut to its rows
    assert cache_bytes_per_epoch(NUM_NODES, NUM_PARTITIONS, 1.0, 20) == NUM_NODES * 20


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_candidates_are_resident_rows_and_blocks_of_the_others(tmp_path, dtype):
    store, buffer = make_buffer(tmp_path, dtype=dtype)
    emb, state = starting_tables(dtype)
    try:
        for view in buffer.walk(HAND_STATES, epoch=3):
            outside = [p for p in range(NUM_PARTITIONS) if p not in view.partitions]
            assert view.candidate_ranges == view.resident_ranges + [
                (buffer.cache.region(p).start, buffer.cache.counts[p], buffer.cache.counts[p]) for p in outside]
            for p in outside:  # no updates in this walk: every block equals the store's rows
                np.testing.assert_array_equal(cached(buffer, p)[0], emb[block_ids(buffer, p)])
                assert np.isposinf(cached(buffer, p)[1]).all()  # drop: read-only by an infinite accumulator
        buffer.flush()
        # drop reads the embeddings only, in the store's dtype (bfloat16: half the bytes)
        assert buffer.counters.cache_bytes_read == cache_bytes_per_epoch(NUM_NODES, NUM_PARTITIONS, 0.5,
                                                                         DIM * dtype.itemsize)
        assert buffer.cache.counts == [2, 2, 2, 2, 2]
        offsets = list(buffer.cache.offsets)
        list(buffer.walk(HAND_STATES, epoch=3))
        assert buffer.cache.offsets == offsets  # the blocks are seeded by the epoch
        list(buffer.walk(HAND_STATES, epoch=4))
        assert buffer.cache.offsets != offsets
    finally:
        buffer.close()


def walk_updating_cache(buffer, refresh, gradients, resident_delta, cache_delta, dtype=torch.float32):
    """Walk HAND_STATES adding ``resident_delta`` to resident rows and ``cache_delta`` to every cached block at
    each state; return the tables the store must hold, tracking what each policy does."""
    emb, state = starting_tables(dtype)
    pending = {p: 0.0 for p in range(NUM_PARTITIONS)}  # cache change since the block's refresh or admission
    previous = set()
    for k, view in enumerate(buffer.walk(HAND_STATES, epoch=1)):
        current = set(view.partitions)
        for p in sorted(current - previous):  # admitted
            if gradients == "defer" and previous:
                ids = block_ids(buffer, p)
                emb[ids] += pending[p]
                state[ids] += pending[p]
            pending[p] = 0.0
        for p in sorted(previous - current):  # evicted: its block now holds the slot's rows
            if refresh == "evict":
                np.testing.assert_array_equal(cached(buffer, p)[0], emb[block_ids(buffer, p)],
                                              err_msg=f"state {k}: block of evicted partition {p}")
        for p in current:
            start, end = buffer.store.bounds(p)
            local = view.local_ids(torch.arange(start, end))
            buffer.embeddings[local] += resident_delta
            buffer.state[local] += resident_delta
            emb[start:end] += resident_delta
            state[start:end] += resident_delta
        for p in range(NUM_PARTITIONS):
            if p not in current:
                region = buffer.cache.region(p)
                buffer.embeddings[region] += cache_delta
                buffer.state[region] += cache_delta
                pending[p] += cache_delta
        previous = current
    buffer.flush()  # changes pending at the epoch's end are dropped
    return emb, state


@pytest.mark.parametrize("refresh", ["evict", "epoch"])
@pytest.mark.parametrize("gradients", ["drop", "defer"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_refresh_and_gradient_policies(tmp_path, refresh, gradients, dtype):
    store, buffer = make_buffer(tmp_path, refresh, gradients, dtype=dtype)
    cache_delta = 1000.0 if dtype == torch.float32 else 16.0  # bfloat16: sums stay whole numbers under 256
    try:
        emb, state = walk_updating_cache(buffer, refresh, gradients, 1.0, cache_delta, dtype)
    finally:
        buffer.close()
    stored_emb, stored_state = store.read_all()
    np.testing.assert_array_equal(stored_emb, emb)
    np.testing.assert_array_equal(stored_state, state)
    changed = (stored_emb[:, 0] - starting_tables(dtype)[0][:, 0]) >= cache_delta
    assert changed.any() == (gradients == "defer")  # deferred updates reached the store, dropped ones did not


def test_partition_draws_span_each_block_over_its_partition(tmp_path):
    store = make_store(tmp_path / "s", NUM_NODES, NUM_PARTITIONS)
    cache = NegativeCache(NUM_NODES, NUM_PARTITIONS, store.rows_per_partition, 0.5, draws="partitions")
    buffer = PartitionBuffer(store, capacity=2, cache=cache)
    try:
        view = next(buffer.walk([(0, 1)]))
        assert view.candidate_ranges[2:] == [(cache.region(p).start, 2, 3 if p == 4 else 4) for p in (2, 3, 4)]
        candidates = CandidateRows(view.candidate_ranges)
        assert candidates.total == NUM_NODES  # drawn as often as in memory
        buffer.flush()
    finally:
        buffer.close()


def test_a_deferred_change_under_half_a_bfloat16_step_survives_on_average():
    """bfloat16 merges round stochastically: 300 + 0.9 (bfloat16 steps of 2 there) is 302 with probability 0.45,
    so the mean over seeds is 300.9, where rounding to nearest would keep 300 every time."""
    rows = torch.full((1, 256), 300.0, dtype=torch.bfloat16)
    change = torch.full((1, 256), 0.9)
    means = [merged(rows, change, seed).float().mean().item() for seed in range(40)]
    assert {merged(rows, change, seed).dtype for seed in range(2)} == {torch.bfloat16}
    assert np.mean(means) == pytest.approx(300.9, abs=0.05)
    assert torch.equal(merged(rows, change, 3), merged(rows, change, 3))  # seeded: a run repeats
    assert torch.equal(merged(rows.float(), change, 0), rows.float() + change)  # float32: exact


@pytest.mark.parametrize("state_dim", [3, 1])  # full and row-wise Adagrad
def test_rows_with_an_infinite_accumulator_do_not_move(state_dim):
    from marius_py.optim import SparseAdagrad
    from marius_py.pipeline.row_kernels import sparse_adagrad_
    nodes, state = torch.ones(4, 3), torch.zeros(4, state_dim)
    state[2:] = float("inf")
    sparse_adagrad_(nodes, state, torch.arange(4), torch.full((4, 3), 0.5), None, lr=0.1, eps=1e-10)
    assert (nodes[:2] < 1).all() and torch.equal(nodes[2:], torch.ones(2, 3))
    assert torch.isposinf(state[2:]).all()
    delta, _ = SparseAdagrad(0.1, rowwise=state_dim == 1).compute(torch.full((2, 3), 0.5), state[2:])
    assert torch.equal(delta.abs(), torch.zeros(2, 3))  # the pipeline's split form: no update either


def test_policies_are_validated():
    with pytest.raises(MariusInputError, match="storage.negative_cache_gradients"):
        load_config(None, ["storage.negative_cache_gradients=later"])
    with pytest.raises(MariusInputError, match="storage.negative_cache"):
        load_config(None, ["storage.negative_cache=1.5"])


# --------------------------------------------------------------------------- training with the cache

@pytest.fixture(scope="module")
def umls_p8(tmp_path_factory):
    out = tmp_path_factory.mktemp("cache-umls") / "umls-p8"
    preprocess(out, UMLS_RAW / "train.txt", UMLS_RAW / "valid.txt", UMLS_RAW / "test.txt",
               PreprocessOptions(num_partitions=8), progress=False)
    return out


def cache_config(dataset, *overrides):
    return load_config(None, [f"dataset.path={dataset}", "training.device=cpu", "model.dim=16",
                              "training.batch_size=512", "training.num_negatives=64", "training.num_chunks=2",
                              "training.seed=3", "evaluation.every=0", "storage.num_partitions=8",
                              "storage.buffer_capacity=2", "storage.ordering=beta", "storage.negative_cache=0.25",
                              *overrides])


@pytest.mark.parametrize("draws, dtype", [("rows", "float32"), ("partitions", "float32"), ("rows", "bfloat16")])
def test_training_with_the_cache_learns_and_reads_what_the_simulator_says(umls_p8, tmp_path, draws, dtype):
    check_cache_training(umls_p8, tmp_path / "run", dtype, f"storage.negative_cache_draws={draws}")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_training_with_the_cache_on_the_gpu(umls_p8, tmp_path, dtype):
    check_cache_training(umls_p8, tmp_path / "run", dtype, "training.device=cuda")


def check_cache_training(dataset, run, dtype, *overrides):
    """Three epochs with a deferring cache learn, and every epoch reads what the simulator says."""
    model = mp.train(cache_config(dataset, "training.epochs=3", "storage.negative_cache_gradients=defer",
                                  f"storage.dtype={dtype}", *overrides), run, progress=False)
    assert model.test_metrics["mrr"] > 0.3, model.test_metrics
    records = [r for r in mp.checkpoint.RunDirectory(run).read_metrics() if r["event"] == "epoch"]
    store = EmbeddingStore(mp.checkpoint.RunDirectory(run).path / mp.checkpoint.LIVE_STORE, mode="r")
    row_bytes = (16 + 16) * getattr(torch, dtype).itemsize  # defer reads embeddings and accumulators
    block = round(0.25 * store.rows_per_partition)
    cache_bytes = sum(min(block, store.bounds(p)[1] - store.bounds(p)[0]) for p in range(8)) * row_bytes
    assert cache_bytes == cache_bytes_per_epoch(store.num_nodes, 8, 0.25, row_bytes) > 0
    for record in records:
        stats = simulate(build_ordering("beta", 8, 2, seed=3, epoch=record["epoch"]),
                         store.rows_per_partition * row_bytes, cache_bytes)
        assert record["io"]["bytes_read"] == stats.bytes_read
        assert record["io"]["cache_bytes_read"] == cache_bytes


@pytest.mark.parametrize("gradients, dtype", [("drop", "float32"), ("defer", "float32"), ("defer", "bfloat16")])
def test_resume_with_the_cache_equals_uninterrupted(umls_p8, tmp_path, gradients, dtype):
    policy = [f"storage.negative_cache_gradients={gradients}", f"storage.dtype={dtype}"]
    mp.train(cache_config(umls_p8, "training.epochs=3", *policy), tmp_path / "full", progress=False)
    mp.train(cache_config(umls_p8, "training.epochs=1", *policy), tmp_path / "split", progress=False)
    resumed = mp.api.load_run_config(tmp_path / "split", ["training.epochs=3"])
    mp.train(resumed, tmp_path / "split", progress=False, resume=True)
    full, split = (mp.checkpoint.load_version(mp.checkpoint.RunDirectory(tmp_path / name).latest_version())
                   for name in ("full", "split"))
    np.testing.assert_allclose(split[0], full[0], rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(split[1], full[1], rtol=1e-5, atol=1e-7)


def test_cli_ordering_reports_the_cache_io(capsys):
    from marius_py.cli import main
    assert main(["ordering", "-p", "16", "-c", "4", "--nodes", "1000000", "--dim", "100",
                 "--negative-cache", "0.05"]) == 0
    line = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("negative cache"))
    # 16 partitions x 3,125 rows x 100 x 4 B (embeddings: drop) = 20,000,000 B; beta reads 2.1 GiB an epoch
    assert "3,125 rows" in line and "+19.1 MiB per epoch" in line and "(0.9% of beta's reads)" in line
    assert "38.1 MiB more memory" in line  # embeddings and accumulators
    assert main(["ordering", "-p", "16", "-c", "4", "--nodes", "1000000", "--dim", "100",
                 "--negative-cache", "0.05", "--dtype", "bfloat16"]) == 0
    line = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("negative cache"))
    # bfloat16: half the bytes of the cache and of beta's reads alike
    assert "+9.5 MiB per epoch" in line and "(0.9% of beta's reads)" in line and "19.1 MiB more memory" in line
