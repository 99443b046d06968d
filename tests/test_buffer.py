"""Storage unit tests: chunk files and the partition buffer (no training).

Stores used here have rows that encode their global node id (embedding row i
is ``i + 0.25 * column``, state row i is ``-i - column``), so a buffer slot
holding the wrong partition, or a stale copy of one, is caught exactly.
"""

from __future__ import annotations

import os
import threading
import time

import numpy as np
import pytest
import torch

from marius_py.orderings import ORDERINGS, build_ordering, simulate, walk_io
from marius_py.storage.buffer import PartitionBuffer
from marius_py.storage.chunk_files import ChunkFiles, page_aligned_empty, slot_rows
from marius_py.storage.embedding_store import EmbeddingStore

DIM, STATE_DIM = 3, 2


def id_rows(num_nodes: int, cols: int, sign: float = 1.0, step: float = 0.25) -> np.ndarray:
    ids = np.arange(num_nodes, dtype=np.float32)[:, None]
    return (sign * ids + step * np.arange(cols, dtype=np.float32)[None, :]).astype(np.float32)


def expected_tables(num_nodes: int) -> tuple[np.ndarray, np.ndarray]:
    return id_rows(num_nodes, DIM), id_rows(num_nodes, STATE_DIM, sign=-1.0, step=-1.0)


def make_store(path, num_nodes: int, num_partitions: int) -> EmbeddingStore:
    """A v3 store whose rows encode their global ids (embeddings and state)."""
    store = EmbeddingStore.create(path, num_nodes, DIM, STATE_DIM, num_partitions)
    store.write_all(*expected_tables(num_nodes))
    return store


def partition_bytes(store: EmbeddingStore) -> int:
    return sum(f.chunk_bytes for f in store.chunk_files())


def run_bounded(fn, seconds: float = 20.0):
    """Run ``fn`` in a thread; fail if it does not finish (a hang), return what it raised."""
    outcome: dict = {}

    def target():
        try:
            outcome["value"] = fn()
        except BaseException as error:  # noqa: BLE001 - handed back to the test
            outcome["error"] = error

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"{fn} did not finish in {seconds} s (hang)"
    return outcome.get("error")


# --------------------------------------------------------------------------- ChunkFiles


def test_store_is_v3_with_one_file_per_partition(tmp_path):
    store = make_store(tmp_path / "s", 19, 5)
    assert (store.path / "embeddings" / "zarr.json").exists()
    emb, state = store.chunk_files()
    assert (emb.num_chunks, emb.rows_per_chunk, emb.cols) == (5, 4, DIM)
    assert (state.num_chunks, state.cols) == (5, STATE_DIM)
    assert emb.chunk_bytes == 4 * DIM * 4
    for files in (emb, state):
        for k in range(5):
            assert files.chunk_path(k).stat().st_size == files.chunk_bytes


def test_chunk_files_round_trip(tmp_path):
    store = make_store(tmp_path / "s", 19, 5)
    emb_expected, state_expected = expected_tables(19)
    for files, expected in zip(store.chunk_files(), (emb_expected, state_expected)):
        for k in range(files.num_chunks):
            out = np.full((files.rows_per_chunk, files.cols), np.nan, dtype=np.float32)
            assert files.read_into(k, out) == files.chunk_bytes
            start = k * files.rows_per_chunk
            end = min(start + files.rows_per_chunk, 19)
            np.testing.assert_array_equal(out[:end - start], expected[start:end])
        # write a new chunk and read it back, directly and through zarr
        new = np.arange(files.rows_per_chunk * files.cols, dtype=np.float32).reshape(files.rows_per_chunk, -1)
        assert files.write(2, new) == files.chunk_bytes
        back = np.empty_like(new)
        files.read_into(2, back)
        np.testing.assert_array_equal(back, new)
    reopened = EmbeddingStore(store.path, mode="r")
    np.testing.assert_array_equal(reopened.embeddings[8:12], np.arange(4 * DIM, dtype=np.float32).reshape(4, DIM))
    np.testing.assert_array_equal(reopened.embeddings[:8], emb_expected[:8])
    np.testing.assert_array_equal(reopened.state[12:], state_expected[12:])


@pytest.mark.parametrize("piece_rows, largest_call", [(1, 1024), (2500, 2048), (10 ** 6, 2502)])
def test_store_created_in_pieces_holds_init_rows(tmp_path, monkeypatch, piece_rows, largest_call):
    """Pieces (rounded down to whole pages, at least one: 1,024 rows of 3 floats) smaller than a partition,
    not dividing it, or larger than it write exactly the rows init gives, each row drawn once."""
    import marius_py.storage.embedding_store as embedding_store
    monkeypatch.setattr(embedding_store, "INIT_PIECE_ROWS", piece_rows)
    calls = []

    def init(start, end):
        calls.append((start, end))
        return id_rows(end, DIM)[start:end]

    nodes = 5003  # two partitions of 2,502 rows, the second one short
    store = EmbeddingStore.create(tmp_path / "s", nodes, DIM, STATE_DIM, 2, init=init, threads=2)
    np.testing.assert_array_equal(store.embeddings[:], id_rows(nodes, DIM))
    np.testing.assert_array_equal(store.state[:], 0.0)
    emb = store.chunk_files()[0]
    assert all(emb.chunk_path(k).stat().st_size == emb.chunk_bytes for k in range(2))
    assert max(end - start for start, end in calls) == largest_call
    assert sorted(calls)[0][0] == 0 and sum(end - start for start, end in calls) == nodes


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_tables_initialised_in_memory_equal_a_created_store_read_back(tmp_path, monkeypatch, dtype, device):
    """A run holding its tables in memory builds them without the store; a resume before its first commit
    builds them again: both must be the rows a created store holds, rounded alike."""
    import marius_py.storage.embedding_store as embedding_store
    from marius_py.storage.embedding_store import initial_tables
    from marius_py.trainer import init_rows
    monkeypatch.setattr(embedding_store, "INIT_PIECE_ROWS", 700)  # pieces not dividing the rows
    nodes, init = 5003, init_rows(seed=3, init_scale=0.5, dim=DIM)
    stored = EmbeddingStore.create(tmp_path / "s", nodes, DIM, STATE_DIM, 1, init=init, threads=2,
                                   dtype=dtype).read_tables()
    built = initial_tables(nodes, DIM, STATE_DIM, init, threads=3, dtype=dtype, device=device)
    for table, expected in zip(built, stored):
        assert table.dtype == dtype and table.shape == expected.shape and table.device.type == device
        torch.testing.assert_close(table.cpu(), expected, rtol=0, atol=0)
    assert built[0].abs().sum() > 0 and not built[1].any()


def test_missing_chunk_reads_as_zeros(tmp_path):
    store = make_store(tmp_path / "s", 19, 5)
    emb, _ = store.chunk_files()
    os.remove(emb.chunk_path(3))
    out = np.full((emb.rows_per_chunk, emb.cols), np.nan, dtype=np.float32)
    assert emb.read_into(3, out) == emb.chunk_bytes
    np.testing.assert_array_equal(out, 0.0)
    # zarr agrees: a missing chunk is the fill value
    np.testing.assert_array_equal(EmbeddingStore(store.path, mode="r").embeddings[12:16], 0.0)


def test_truncated_chunk_is_an_error(tmp_path):
    store = make_store(tmp_path / "s", 19, 5)
    emb, _ = store.chunk_files()
    with open(emb.chunk_path(1), "r+b") as handle:
        handle.truncate(emb.chunk_bytes - 4)
    with pytest.raises(OSError, match="truncated"):
        emb.read_into(1, np.empty((emb.rows_per_chunk, emb.cols), dtype=np.float32))


def test_write_is_atomic_by_rename(tmp_path):
    store = make_store(tmp_path / "s", 19, 5)
    emb, _ = store.chunk_files()
    target = emb.chunk_path(1)
    old_bytes = target.read_bytes()
    snapshot = tmp_path / "snapshot"
    os.link(target, snapshot)
    old_inode = target.stat().st_ino
    emb.write(1, np.full((emb.rows_per_chunk, emb.cols), 7.0, dtype=np.float32))
    assert snapshot.read_bytes() == old_bytes  # the linked snapshot keeps the old bytes
    assert target.stat().st_ino != old_inode   # the chunk was replaced, not rewritten in place
    assert np.frombuffer(target.read_bytes(), dtype="<f4").tolist() == [7.0] * (emb.rows_per_chunk * emb.cols)
    leftovers = [p for p in target.parent.iterdir() if p.name.endswith(".tmp")]
    assert leftovers == []


@pytest.mark.parametrize("direct", [True, False])
def test_write_of_an_unlinked_chunk_overwrites_its_file(tmp_path, direct):
    """No version links the chunk: its bytes are overwritten in the same file (no new pages to fill), to
    exactly the chunk's size; once a version links it, the next write replaces it again."""
    store = make_store(tmp_path / "s", 19, 5)
    emb = ChunkFiles(store.path / "embeddings", direct=direct)
    target = emb.chunk_path(1)
    emb.write(1, np.full((emb.rows_per_chunk, emb.cols), 5.0, dtype=np.float32))  # (made by the store: linked?)
    inode = target.stat().st_ino
    slot = page_aligned_empty(slot_rows(emb.rows_per_chunk, emb.cols), emb.cols).numpy()
    slot[:] = 6.0
    emb.write(1, slot)
    assert target.stat().st_ino == inode and target.stat().st_size == emb.chunk_bytes
    assert np.frombuffer(target.read_bytes(), dtype="<f4").tolist() == [6.0] * (emb.rows_per_chunk * emb.cols)
    os.link(target, tmp_path / "version")
    emb.write(1, slot)
    assert target.stat().st_ino != inode and (tmp_path / "version").stat().st_ino == inode


@pytest.mark.parametrize("bad", ["float64", "short", "fortran", "strided"])
def test_bad_buffer_raises_value_error(tmp_path, bad):
    store = make_store(tmp_path / "s", 19, 5)
    emb, _ = store.chunk_files()
    shape = (emb.rows_per_chunk, emb.cols)
    array = {
        "float64": lambda: np.zeros(shape, dtype=np.float64),
        "short": lambda: np.zeros((shape[0] - 1, shape[1]), dtype=np.float32),
        "fortran": lambda: np.asfortranarray(np.zeros(shape, dtype=np.float32)),
        "strided": lambda: np.zeros((shape[0] * 2, shape[1]), dtype=np.float32)[::2],
    }[bad]()
    before = emb.chunk_path(0).read_bytes()
    with pytest.raises(ValueError):
        emb.read_into(0, array)
    with pytest.raises(ValueError):
        emb.write(0, array)
    assert emb.chunk_path(0).read_bytes() == before


@pytest.mark.parametrize("page_aligned", [True, False])
def test_padded_buffer_round_trip(tmp_path, page_aligned):
    """A padded slot (longer than a chunk) holds the chunk at its start, with or without O_DIRECT."""
    store = make_store(tmp_path / "s", 19, 5)
    emb, _ = store.chunk_files()
    rows = slot_rows(emb.rows_per_chunk, emb.cols)
    slot = page_aligned_empty(rows, emb.cols).numpy() if page_aligned else \
        np.zeros((rows + 1, emb.cols), dtype=np.float32)[1:]
    assert emb.read_into(1, slot) == emb.chunk_bytes
    expected = np.frombuffer(emb.chunk_path(1).read_bytes(), dtype=np.float32).reshape(-1, emb.cols)
    np.testing.assert_array_equal(slot[:emb.rows_per_chunk], expected)
    slot[:emb.rows_per_chunk] += 1
    slot[emb.rows_per_chunk:] = np.nan  # padding must never reach the file
    emb.write(1, slot)
    assert emb.chunk_path(1).stat().st_size == emb.chunk_bytes
    np.testing.assert_array_equal(
        np.frombuffer(emb.chunk_path(1).read_bytes(), dtype=np.float32).reshape(-1, emb.cols), expected + 1)


def test_refused_write_leaves_no_temporary_file(tmp_path):
    """A write refused for a bad buffer (or failing midway) must not leave its temp file behind.

    Bug: ChunkFiles.write opens the ``.tmp`` file (chunk_files.py:59) before
    checking the buffer (line 60) and never removes it on error.
    """
    store = make_store(tmp_path / "s", 19, 5)
    emb, _ = store.chunk_files()
    with pytest.raises(ValueError):
        emb.write(0, np.zeros((emb.rows_per_chunk, emb.cols), dtype=np.float64))
    assert [p.name for p in emb.chunk_path(0).parent.iterdir() if p.name.endswith(".tmp")] == []


# --------------------------------------------------------------------------- PartitionBuffer


def check_view(buffer: PartitionBuffer, view, resident, expected_emb, expected_state) -> None:
    """Every row of every resident partition sits where ``view`` says, with the expected values."""
    store = buffer.store
    assert sorted(view.partitions) == sorted(resident)
    slot_of = view.slot_of_partition.tolist()
    assert [q for q in range(store.num_partitions) if slot_of[q] >= 0] == sorted(resident)
    slots = [slot_of[q] for q in resident]
    assert len(set(slots)) == len(slots) and all(0 <= s < buffer.num_slots for s in slots)
    ranges = []
    for q in sorted(resident):
        start, end = store.bounds(q)
        ids = torch.arange(start, end)
        local = view.local_ids(ids)
        np.testing.assert_array_equal(buffer.embeddings[local].numpy(), expected_emb[start:end],
                                      err_msg=f"state {view.index}: partition {q} embeddings")
        np.testing.assert_array_equal(buffer.state[local].numpy(), expected_state[start:end],
                                      err_msg=f"state {view.index}: partition {q} state")
        ranges.append((slot_of[q] * view.rows_per_slot, end - start))
    assert view.resident_ranges == ranges


def walk_and_update(buffer: PartitionBuffer, states, expected_emb, expected_state, delta_of=None) -> None:
    """Walk ``states``, checking contents, adding ``delta_of(k)`` to every resident row at state k."""
    store = buffer.store
    for k, view in enumerate(buffer.walk(states)):
        assert view.index == k
        check_view(buffer, view, states[k], expected_emb, expected_state)
        if delta_of is None:
            continue
        delta = delta_of(k)
        for q in states[k]:
            start, end = store.bounds(q)
            local = view.local_ids(torch.arange(start, end))
            buffer.embeddings[local] += delta
            buffer.state[local] += 2 * delta
            expected_emb[start:end] += delta
            expected_state[start:end] += 2 * delta
    buffer.flush()


def assert_store_equals(store: EmbeddingStore, expected_emb, expected_state) -> None:
    emb, state = EmbeddingStore(store.path, mode="r").read_all()
    np.testing.assert_array_equal(emb, expected_emb)
    np.testing.assert_array_equal(state, expected_state)


# p = 5, c = 2, one swap per state (slot order irrelevant: the buffer takes sets)
HAND_STATES = [(0, 1), (0, 2), (3, 2), (3, 4), (1, 4), (1, 0), (2, 0)]


def test_walk_hand_written_states(tmp_path):
    store = make_store(tmp_path / "s", 19, 5)  # 4 rows per partition, the last has 3
    expected_emb, expected_state = expected_tables(19)
    buffer = PartitionBuffer(store, capacity=2)
    try:
        walk_and_update(buffer, HAND_STATES, expected_emb, expected_state,
                        delta_of=lambda k: float(100 * (k + 1)))
        swaps = len(HAND_STATES) - 1
        nbytes = partition_bytes(store)
        assert buffer.counters.snapshot() == {
            "partitions_read": 2 + swaps, "partitions_written": swaps + 2,
            "bytes_read": (2 + swaps) * nbytes, "bytes_written": (swaps + 2) * nbytes,
            "checkpoint_bytes_written": 0, "partitions_received": 0, "bytes_received": 0}
        assert_store_equals(store, expected_emb, expected_state)
        # a second epoch over the same buffer sees the first epoch's updates
        walk_and_update(buffer, HAND_STATES, expected_emb, expected_state, delta_of=lambda k: -1.0)
        assert_store_equals(store, expected_emb, expected_state)
        assert buffer.counters.partitions_read == 2 * (2 + swaps)
    finally:
        buffer.close()


def test_walk_without_updates_writes_back_unchanged_rows(tmp_path):
    store = make_store(tmp_path / "s", 19, 5)
    expected_emb, expected_state = expected_tables(19)
    buffer = PartitionBuffer(store, capacity=2)
    try:
        walk_and_update(buffer, HAND_STATES, expected_emb, expected_state)
    finally:
        buffer.close()
    assert_store_equals(store, *expected_tables(19))


def test_walk_refuses_a_state_swapping_more_than_swap_size(tmp_path):
    store = make_store(tmp_path / "s", 19, 5)
    buffer = PartitionBuffer(store, capacity=2)
    try:
        with pytest.raises(ValueError, match="swaps"):
            for _ in buffer.walk([(0, 1), (2, 3)]):
                pass
    finally:
        buffer.close()


def test_walk_swapping_two_partitions_at_once(tmp_path):
    # comet with 4 logical partitions of 2 physical ones: 8 storage partitions, 4 resident, 2 swapped at once
    ordering = build_ordering("comet", 4, 2, seed=3, epoch=1, group_size=2)
    states = [ordering.resident(k) for k in range(ordering.num_states)]
    assert all(len(set(a) - set(b)) == 2 for a, b in zip(states, states[1:]))
    store = make_store(tmp_path / "s", 37, 8)  # 5 rows per partition, the last has 2
    expected_emb, expected_state = expected_tables(37)
    buffer = PartitionBuffer(store, capacity=4, swap_size=2)
    try:
        walk_and_update(buffer, states, expected_emb, expected_state, delta_of=lambda k: 0.5 * (k + 1))
    finally:
        buffer.close()
    assert_store_equals(store, expected_emb, expected_state)
    swaps = ordering.num_swaps
    nbytes = partition_bytes(store)
    assert buffer.counters.snapshot() == {
        "partitions_read": 4 + 2 * swaps, "partitions_written": 2 * swaps + 4,
        "bytes_read": (4 + 2 * swaps) * nbytes, "bytes_written": (2 * swaps + 4) * nbytes,
            "checkpoint_bytes_written": 0, "partitions_received": 0, "bytes_received": 0}


def registered_cases():
    for name in ORDERINGS:
        if name in ("comet", "affine"):  # two-level: 4 groups of 2, 2 in the buffer (affine: the plane of order 2)
            yield pytest.param(name, lambda name=name: build_ordering(name, 4, 2, seed=0, epoch=2, group_size=2), 4,
                               2, id=name)
        else:
            yield pytest.param(name, lambda name=name: build_ordering(name, 8, 3, seed=0, epoch=2), 3, 1, id=name)


@pytest.mark.parametrize("name, make_ordering, capacity, swap_size", list(registered_cases()))
def test_walk_every_registered_ordering_matches_simulator(tmp_path, name, make_ordering, capacity, swap_size):
    ordering = make_ordering()
    assert ordering.num_physical_partitions == 8
    states = [ordering.resident(k) for k in range(ordering.num_states)]
    num_nodes = 8 * 5 - 3
    store = make_store(tmp_path / "s", num_nodes, 8)
    expected_emb, expected_state = expected_tables(num_nodes)
    buffer = PartitionBuffer(store, capacity=capacity, swap_size=swap_size)
    try:
        walk_and_update(buffer, states, expected_emb, expected_state, delta_of=lambda k: float(k + 1))
    finally:
        buffer.close()
    assert_store_equals(store, expected_emb, expected_state)
    stats = simulate(ordering, partition_bytes(store))
    counters = buffer.counters.snapshot()
    assert counters["partitions_read"] == stats.physical_partitions_read
    assert counters["partitions_written"] == stats.physical_partitions_written
    if ordering.groups is None:
        assert (counters["partitions_read"], counters["partitions_written"]) == \
            (stats.partitions_read, stats.partitions_written)
    assert counters["bytes_read"] == stats.bytes_read
    assert counters["bytes_written"] == stats.bytes_written


# --------------------------------------------------------------------------- failures and lost updates


def test_write_back_error_surfaces_from_walk(tmp_path, monkeypatch):
    store = make_store(tmp_path / "s", 19, 5)
    buffer = PartitionBuffer(store, capacity=2)

    def failing_write(self, chunk, data, for_commit=True):
        raise OSError(f"disk full writing chunk {chunk}")

    monkeypatch.setattr(ChunkFiles, "write", failing_write)

    reached = []

    def consume():
        for view in buffer.walk(HAND_STATES):
            reached.append(view.index)
        reached.append("flush")
        buffer.flush()

    error = run_bounded(consume)
    assert isinstance(error, OSError) and "disk full" in str(error)
    # the first eviction's write fails; the read into its slot (two states later) reports it
    assert "flush" not in reached and reached[-1] < len(HAND_STATES) - 1
    assert run_bounded(buffer.close) is None


def test_write_back_error_surfaces_from_flush(tmp_path, monkeypatch):
    store = make_store(tmp_path / "s", 19, 5)
    buffer = PartitionBuffer(store, capacity=2)
    try:
        views = list(buffer.walk([(0, 1)]))  # one state: nothing evicted, the flush writes
        assert len(views) == 1
        monkeypatch.setattr(ChunkFiles, "write",
                            lambda self, chunk, data, for_commit=True: (_ for _ in ()).throw(OSError("flush failed")))
        error = run_bounded(buffer.flush)
        assert isinstance(error, OSError) and "flush failed" in str(error)
    finally:
        assert run_bounded(buffer.close) is None


def test_read_error_surfaces_from_walk(tmp_path, monkeypatch):
    store = make_store(tmp_path / "s", 19, 5)
    buffer = PartitionBuffer(store, capacity=2)
    original = ChunkFiles.read_into

    def failing_read(self, chunk, out):
        if chunk == 3:
            raise OSError("bad sector")
        return original(self, chunk, out)

    monkeypatch.setattr(ChunkFiles, "read_into", failing_read)

    def consume():
        for _ in buffer.walk(HAND_STATES):
            pass
        buffer.flush()

    error = run_bounded(consume)
    assert isinstance(error, OSError) and "bad sector" in str(error)
    assert run_bounded(buffer.close) is None


def random_walk_states(num_partitions: int, capacity: int, num_states: int, seed: int):
    """States that each swap one random resident partition for a random absent one."""
    rng = np.random.default_rng(seed)
    state = list(range(capacity))
    states = [tuple(state)]
    for _ in range(num_states - 1):
        absent = [q for q in range(num_partitions) if q not in state]
        state[int(rng.integers(capacity))] = int(rng.choice(absent))
        states.append(tuple(state))
    return states


@pytest.mark.parametrize("io_threads", [1, 2])
@pytest.mark.parametrize("slow", ["none", "write", "read"])
def test_no_update_is_lost(tmp_path, monkeypatch, slow, io_threads):
    """Deltas added at every state all reach the store, whichever IO thread lags, with one reader and one
    writer or two of each."""
    if slow != "none":
        name = "write" if slow == "write" else "read_into"
        original = getattr(ChunkFiles, name)

        def slowed(self, *args, **kwargs):
            time.sleep(0.003)
            return original(self, *args, **kwargs)

        monkeypatch.setattr(ChunkFiles, name, slowed)
    states = random_walk_states(num_partitions=6, capacity=3, num_states=30, seed=5)
    num_nodes = 6 * 7 - 4
    store = make_store(tmp_path / "s", num_nodes, 6)
    emb0, state0 = EmbeddingStore(store.path, mode="r").read_all()
    initial = float(emb0.astype(np.float64).sum()), float(state0.astype(np.float64).sum())
    expected_emb, expected_state = expected_tables(num_nodes)
    buffer = PartitionBuffer(store, capacity=3, io_threads=io_threads)
    applied = 0.0
    try:
        for k, view in enumerate(buffer.walk(states)):
            delta = float(k + 1)
            for q in states[k]:
                start, end = store.bounds(q)
                local = view.local_ids(torch.arange(start, end))
                buffer.embeddings.index_add_(0, local, torch.full((end - start, DIM), delta))
                buffer.state.index_add_(0, local, torch.full((end - start, STATE_DIM), delta))
                expected_emb[start:end] += delta
                expected_state[start:end] += delta
                applied += delta * (end - start)
        buffer.flush()
    finally:
        buffer.close()
    emb, state = EmbeddingStore(store.path, mode="r").read_all()
    assert float(emb.astype(np.float64).sum()) == pytest.approx(initial[0] + DIM * applied, abs=1e-3)
    assert float(state.astype(np.float64).sum()) == pytest.approx(initial[1] + STATE_DIM * applied, abs=1e-3)
    np.testing.assert_array_equal(emb, expected_emb)
    np.testing.assert_array_equal(state, expected_state)


def test_the_buffer_stays_filled_between_walks_and_loses_no_update(tmp_path):
    """Two epochs' walks: the second keeps what its first state holds of the first's last state (dirty, so
    trained rows are neither lost nor read back stale) and reads only the rest; after write_resident the
    store is current and the partitions clean, so evicting them writes nothing. IO equals walk_io's."""
    orderings = [build_ordering("beta", 6, 3, seed=0, epoch=epoch) for epoch in (1, 2, 3)]
    states = [[o.resident(k) for k in range(o.num_states)] for o in orderings]
    num_nodes = 6 * 7 - 4
    store = make_store(tmp_path / "s", num_nodes, 6)
    expected_emb, expected_state = expected_tables(num_nodes)
    buffer = PartitionBuffer(store, capacity=3)
    size, carried, io = partition_bytes(store), (), []
    try:
        for epoch, walk in enumerate(states):
            before = buffer.counters.snapshot()
            for k, view in enumerate(buffer.walk(walk)):
                check_view(buffer, view, walk[k], expected_emb, expected_state)
                for q in walk[k]:
                    start, end = store.bounds(q)
                    local = view.local_ids(torch.arange(start, end))
                    buffer.embeddings[local] += 1.0
                    buffer.state[local] += 1.0
                    expected_emb[start:end] += 1.0
                    expected_state[start:end] += 1.0
            after = buffer.counters.snapshot()
            io.append({key: after[key] - before[key] for key in ("partitions_read", "partitions_written",
                                                                 "bytes_read", "bytes_written")})
            assert buffer.resident == sorted(walk[-1])
            clean = epoch == 1  # (the store made current after the second epoch, as a commit does)
            assert io[-1] == walk_io(orderings[epoch], size, carried, carried_dirty=epoch != 2)
            if clean:
                buffer.write_resident()
                assert_store_equals(store, expected_emb, expected_state)
            carried = walk[-1]
        assert io[1]["partitions_read"] < 3 + orderings[1].num_swaps  # (it kept some of the first's)
        buffer.flush()
    finally:
        buffer.close()
    assert_store_equals(store, expected_emb, expected_state)


@pytest.mark.parametrize("direct_io", [True, False])
def test_direct_io_setting_decides_o_direct(tmp_path, monkeypatch, direct_io):
    """storage.direct_io: partition IO bypasses the page cache, or (false) never does; rows round-trip."""
    import marius_py.storage.chunk_files as chunk_files
    opened = []
    original = chunk_files._open
    monkeypatch.setattr(chunk_files, "_open",
                        lambda path, flags, direct: opened.append(direct) or original(path, flags, direct))
    store = make_store(tmp_path / "s", 40, 4)
    opened.clear()
    buffer = PartitionBuffer(store, capacity=2, direct_io=direct_io)
    try:
        for _ in buffer.walk([(0, 1), (1, 2), (2, 3)]):
            pass
        buffer.flush()
    finally:
        buffer.close()
    assert len(opened) == 16 and all(opened) == any(opened) == direct_io  # 4 reads, 4 writes, 2 arrays
    np.testing.assert_array_equal(EmbeddingStore(store.path, mode="r").read_all()[0], expected_tables(40)[0])


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("prefetch", [False, True])
def test_hold_release_writes_behind_and_loses_no_update(tmp_path, monkeypatch, device, prefetch):
    """A trainer's grants (hold, update, release): release returns before the (slowed) writes end; its
    futures finish with the rows in the store; a partition held again right after its release, and a slot
    reused, read the updated rows, never the stale ones. ``prefetch``: each next grant's new partitions
    are read while the current one trains, as a distributed trainer does, and each is still read once.
    On the GPU the updates are queued behind a long kernel: the write-back's copy must wait for them."""
    original = ChunkFiles.write

    def slow_write(self, *args, **kwargs):
        time.sleep(0.2)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(ChunkFiles, "write", slow_write)
    num_nodes = 5 * 6
    store = make_store(tmp_path / "s", num_nodes, 5)
    expected_emb, expected_state = expected_tables(num_nodes)
    buffer = PartitionBuffer(store, capacity=2, swap_size=2, lookahead=1, device=device)  # two spare slots
    grants = [(0, 1), (1, 2), (0, 2), (2, 1), (3, 4), (0, 3), (3, 0)]  # 0 held again right after its release
    held: set[int] = set()
    try:
        for k, grant in enumerate(grants):
            released = sorted(held - set(grant))
            started = time.perf_counter()
            writes = buffer.release(released)
            assert time.perf_counter() - started < 0.15 and len(writes) == len(released)  # (a write: 0.2 s)
            view = buffer.hold(grant)
            held = set(grant)
            if prefetch and k + 1 < len(grants):
                buffer.prefetch(sorted(set(grants[k + 1]) - held))
            for q in grant:
                start, end = store.bounds(q)
                local = view.local_ids(torch.arange(start, end)).to(device)
                assert torch.equal(buffer.embeddings[local].cpu(), torch.from_numpy(expected_emb[start:end]))
                if device == "cuda":
                    torch.cuda._sleep(100_000_000)  # (tens of milliseconds of GPU time before the updates)
                buffer.embeddings.index_add_(0, local, torch.full((end - start, DIM), float(k + 1), device=device))
                buffer.state.index_add_(0, local, torch.full((end - start, STATE_DIM), float(k + 1),
                                                             device=device))
                expected_emb[start:end] += k + 1
                expected_state[start:end] += k + 1
        for write in buffer.release(sorted(held)):
            write.result()
        admissions = sum(len(set(grant) - set(before)) for before, grant in zip([()] + grants, grants))
        assert buffer.counters.snapshot()["partitions_read"] == admissions
    finally:
        buffer.close()
    emb, state = EmbeddingStore(store.path, mode="r").read_all()
    np.testing.assert_array_equal(emb, expected_emb)
    np.testing.assert_array_equal(state, expected_state)


def test_walk_abandoned_midway_then_walked_again(tmp_path, monkeypatch):
    """A walk left mid-epoch (an exception in training) must not corrupt the next walk.

    The abandoned walk leaves a prefetch read in flight on the reader thread; a
    new walk's initial fill must not race with it for the same slot.
    """
    original = ChunkFiles.read_into

    def slow_prefetch(self, chunk, out):
        if threading.current_thread().name.startswith("buffer-prefetch"):
            time.sleep(0.2)
        return original(self, chunk, out)

    monkeypatch.setattr(ChunkFiles, "read_into", slow_prefetch)
    store = make_store(tmp_path / "s", 19, 5)
    expected_emb, expected_state = expected_tables(19)
    buffer = PartitionBuffer(store, capacity=2)
    try:
        walk = buffer.walk(HAND_STATES)
        for view in walk:
            if view.index == 2:  # partition 0's slot is free now and the read of 4 is in flight
                break
        walk.close()
        second = [(1, 0), (1, 3)]
        for k, view in enumerate(buffer.walk(second)):
            check_view(buffer, view, second[k], expected_emb, expected_state)
        buffer.flush()
    finally:
        buffer.close()
    assert_store_equals(store, expected_emb, expected_state)


@pytest.mark.gpu
def test_large_locked_buffers_are_registered_exactly():
    """Large pinned tables are page-locked in place (torch's pinned allocator would round 100 MB up to
    128 MB), usable for asynchronous copies both ways."""
    from marius_py.storage.chunk_files import page_aligned_empty
    from marius_py.storage.pinned import REGISTER_MIN_BYTES, _register
    assert _register(torch.empty(REGISTER_MIN_BYTES, dtype=torch.uint8))  # cudaHostRegister accepts it
    table = page_aligned_empty(25_000, 1_000, pin_memory=True)  # 100 MB
    assert table.is_pinned()
    table.copy_(torch.arange(25_000 * 1_000, dtype=torch.float32).view(25_000, 1_000))
    on_gpu = table.to("cuda", non_blocking=True)
    back = page_aligned_empty(25_000, 1_000, pin_memory=True)
    back.copy_(on_gpu, non_blocking=True)
    torch.cuda.synchronize()
    assert torch.equal(back, table)


def test_fetched_partitions_fill_their_slots_in_the_order_asked_and_count_as_received(tmp_path):
    """A partition handed over (``fetches``) is filled by its fetch, not read from the store, on one thread in
    the order the fetches were asked (a sender's sequence must match), and counted as received; released,
    it is written to the store like any other."""
    store = make_store(tmp_path / "s", 16, 4)
    buffer = PartitionBuffer(store, capacity=2, lookahead=1)
    order, threads = [], set()

    def fetch_filling(value: float):
        def fetch(tables):
            order.append(value)
            threads.add(threading.current_thread().name)
            for table in tables:
                table.fill_(value)
            return sum(t.numel() * t.element_size() for t in tables)
        return fetch

    try:
        buffer.prefetch([2, 3], {3: fetch_filling(3.0), 2: fetch_filling(2.0)})
        view = buffer.hold([2, 3])
        assert order == [2.0, 3.0]  # (sorted, as asked)
        for partition in (2, 3):
            rows = view.local_ids(torch.arange(4 * partition, 4 * partition + 4))
            assert torch.all(buffer.embeddings[rows] == float(partition))
            assert torch.all(buffer.state[rows] == float(partition))
        assert len(threads) == 1 and next(iter(threads)).startswith("buffer-fetch")
        counters = buffer.counters.snapshot()
        assert counters["partitions_received"] == 2 and counters["partitions_read"] == 0
        assert counters["bytes_received"] == 2 * partition_bytes(store)
        for write in buffer.release([2, 3]):
            write.result()
        view = buffer.hold([0, 2], {0: fetch_filling(7.0)})  # a fetch asked by hold itself; 2 from the store
        assert order == [2.0, 3.0, 7.0]
        assert torch.all(buffer.embeddings[view.local_ids(torch.arange(8, 12))] == 2.0)
    finally:
        buffer.close()
    assert np.all(store.embeddings[12:16] == 3.0)


def test_the_next_walks_first_state_is_read_ahead_while_the_last_states_train(tmp_path, monkeypatch):
    """``walk(states, following=...)``: the next walk's first partitions are read into the spare slots on the
    reading thread while this walk's last states train; the next walk admits them without reading on the
    training thread, counts them in its own IO, and sees the rows as the store holds them (updates included)."""
    import threading
    store = make_store(tmp_path / "s", 24, 6)
    expected_emb, expected_state = expected_tables(24)
    buffer = PartitionBuffer(store, capacity=2, lookahead=2)
    reads = []
    original = PartitionBuffer._read

    def recorded(self, partition, slot, fetch=None):
        reads.append((partition, threading.current_thread() is threading.main_thread()))
        return original(self, partition, slot, fetch)
    monkeypatch.setattr(PartitionBuffer, "_read", recorded)
    first, second = [(0, 1), (0, 2), (0, 3)], [(4, 5), (4, 1), (4, 0)]
    try:
        asked = []
        for k, view in enumerate(buffer.walk(first, following=lambda: asked.append(True) or second[0])):
            check_view(buffer, view, first[k], expected_emb, expected_state)
            for partition in first[k]:
                start, end = store.bounds(partition)
                buffer.embeddings[view.local_ids(torch.arange(start, end))] += 1.0
                expected_emb[start:end] += 1.0
        assert asked == [True] and set(buffer._scheduled) == {4, 5}
        assert buffer.counters.partitions_read == 2 + 2  # (the reads ahead count in the walk that admits them)
        reads.clear()
        walk_and_update(buffer, second, expected_emb, expected_state)
        assert (4, True) not in reads and (5, True) not in reads  # (never read again, on the training thread)
        assert buffer.counters.partitions_read == 4 + 2 + 2
        assert_store_equals(store, expected_emb, expected_state)
    finally:
        buffer.close()
