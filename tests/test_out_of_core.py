"""Out-of-core training on UMLS: partitioned stores, the buffer, orderings, streamed eval/export."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch

import marius_py as mp
import marius_py.layout
from marius_py import resources
from marius_py.api import TrainedModel, load_checkpoint
from marius_py.checkpoint import LIVE_STORE, NODES, RunDirectory, load_version
from marius_py.cli import main
from marius_py.api import load_run_config
from marius_py.config_loading import load_config
from marius_py.layout import storage_layout
from marius_py.dataset import Dataset
from marius_py.errors import MariusInputError
from marius_py.evaluation import InMemoryNodes, StoredNodes, build_known_answers, filtered_ranks
from marius_py.preprocess import PreprocessOptions, preprocess
from marius_py.orderings import (ORDERINGS, build_ordering, continued, default_group_size, default_split, simulate,
                                 walk_io)
from marius_py.storage.embedding_store import EmbeddingStore

UMLS_RAW = Path(__file__).parent / "data" / "umls"


@pytest.fixture(scope="module")
def datasets(tmp_path_factory):
    """UMLS preprocessed for 1, 4 and 8 partitions: {p: directory}."""
    root = tmp_path_factory.mktemp("ooc-datasets")
    out = {}
    for p in (1, 4, 8):
        out[p] = root / f"umls-p{p}"
        preprocess(out[p], UMLS_RAW / "train.txt", UMLS_RAW / "valid.txt", UMLS_RAW / "test.txt",
                   PreprocessOptions(num_partitions=p), progress=False)
    return out


def config_for(dataset: Path, *overrides: str):
    return load_config(None, [f"dataset.path={dataset}", "training.device=cpu", "model.dim=16",
                              "training.batch_size=512", "training.num_negatives=64", "training.num_chunks=2",
                              "training.epochs=2", "training.seed=3", "evaluation.every=0", *overrides])


def latest(run_dir):
    """(embeddings, optimizer state, model state) of the latest checkpoint."""
    nodes, state, model_state, _ = load_version(RunDirectory(run_dir).latest_version())
    return nodes, state, model_state


def epoch_records(run_dir) -> list[dict]:
    return [r for r in RunDirectory(run_dir).read_metrics() if r["event"] == "epoch"]


@pytest.fixture(scope="module")
def full_buffer_runs(datasets, tmp_path_factory):
    """The same p=4 dataset trained in memory (p=1 config) and through a buffer holding all 4 partitions."""
    root = tmp_path_factory.mktemp("ooc-full-buffer")
    in_memory = mp.train(config_for(datasets[4], "storage.num_partitions=1"), root / "p1", progress=False)
    buffered = mp.train(config_for(datasets[4], "storage.num_partitions=4", "storage.buffer_capacity=4",
                                   "storage.ordering=beta", "storage.dtype=float32"), root / "p4", progress=False)
    return in_memory, buffered


@pytest.fixture(scope="module")
def beta_p8_run(datasets, tmp_path_factory):
    run = tmp_path_factory.mktemp("ooc-beta8") / "run"
    config = config_for(datasets[8], "storage.num_partitions=8", "storage.buffer_capacity=3",
                        "storage.ordering=beta", "training.epochs=3",
                        "training.commits_behind=false")  # (every epoch commits: none is folded into the next)
    model = mp.train(config, run, progress=False)
    return config, run, model


# --------------------------------------------------------------------------- equivalence and IO


def test_full_buffer_equals_in_memory(full_buffer_runs):
    in_memory, buffered = full_buffer_runs
    nodes_a, state_a, model_a = latest(in_memory.run_dir)
    nodes_b, state_b, model_b = latest(buffered.run_dir)
    assert nodes_a.shape == nodes_b.shape == (135, 16)
    np.testing.assert_allclose(nodes_b, nodes_a, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(state_b, state_a, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(model_b["decoder"]["relations"], model_a["decoder"]["relations"])
    assert buffered.test_metrics["mrr"] == pytest.approx(in_memory.test_metrics["mrr"], abs=1e-9)
    assert buffered.test_metrics["num_queries"] == in_memory.test_metrics["num_queries"]
    # the p=4 run really went through the buffer: one state, read once (the buffer stays filled between
    # epochs), the 4 partitions written by every epoch's commit and none evicted
    records = epoch_records(buffered.run_dir)
    assert [r["io"]["partitions_read"] for r in records] == [4, 0]
    assert [r["io"]["partitions_written"] for r in records] == [0, 0]
    store = EmbeddingStore(Path(buffered.run_dir) / LIVE_STORE, mode="r")
    assert [r["io"]["checkpoint_bytes_written"] for r in records] == \
        [sum(f.chunk_bytes for f in store.chunk_files()) * 4] * 2
    assert all("io" not in r for r in epoch_records(in_memory.run_dir))


def chained_ordering(name: str, p: int, c: int, seed: int, epoch: int):
    """The registry's ordering for ``epoch``, continued from the epochs before (storage.continue_epochs)."""
    ordering = build_ordering(name, p, c, seed=seed, epoch=1)
    for later in range(2, epoch + 1):
        ordering = continued(build_ordering(name, p, c, seed=seed, epoch=later),
                             ordering.resident(ordering.num_states - 1))
    return ordering


def test_io_counters_equal_simulator_every_epoch(beta_p8_run):
    config, run, _ = beta_p8_run
    store = EmbeddingStore(Path(run) / LIVE_STORE, mode="r")
    assert store.num_partitions == 8
    partition_bytes = sum(f.chunk_bytes for f in store.chunk_files())
    records = epoch_records(run)
    assert [r["epoch"] for r in records] == [1, 2, 3]
    orderings, carried = [], ()
    for record in records:
        ordering = build_ordering("beta", 8, 3, seed=config.training.seed, epoch=record["epoch"])
        orderings.append(ordering)
        # the buffer starts each epoch holding the last one's last state, clean (every epoch commits)
        predicted = walk_io(ordering, partition_bytes, carried, carried_dirty=False)
        last = ordering.resident(ordering.num_states - 1)
        assert record["io"] == {**predicted, "checkpoint_bytes_written": 3 * partition_bytes,  # (the commit)
                                "partitions_received": 0, "bytes_received": 0}, f"epoch {record['epoch']}"
        if not carried:  # (the first epoch reads as the simulator's buffer, which starts empty)
            assert predicted["bytes_read"] == simulate(ordering, partition_bytes).bytes_read
        assert predicted["partitions_read"] == 3 - len(set(carried) & set(ordering.resident(0))) + ordering.num_swaps
        carried = last
    # the epochs walk different buffer states (as sets), so each epoch is a separate check
    assert len({tuple(frozenset(s) for s in o.states) for o in orderings}) == len(orderings)


def test_continued_epochs_read_only_their_swaps(datasets, tmp_path):
    """storage.continue_epochs: each epoch after the first walks the registry's ordering renamed to start with
    the partitions the last one ended with, so it reads only its swaps, as the simulator predicts."""
    config = config_for(datasets[8], "storage.num_partitions=8", "storage.buffer_capacity=3",
                        "storage.ordering=beta", "training.epochs=3", "training.commits_behind=false",
                        "storage.continue_epochs=true")
    mp.train(config, tmp_path / "run", progress=False)
    store = EmbeddingStore(Path(tmp_path / "run") / LIVE_STORE, mode="r")
    partition_bytes = sum(f.chunk_bytes for f in store.chunk_files())
    carried = ()
    for record in epoch_records(tmp_path / "run"):
        ordering = chained_ordering("beta", 8, 3, config.training.seed, record["epoch"])
        predicted = walk_io(ordering, partition_bytes, carried, carried_dirty=False)
        assert {key: record["io"][key] for key in predicted} == predicted, f"epoch {record['epoch']}"
        if carried:
            assert set(ordering.resident(0)) == set(carried) and predicted["partitions_read"] == ordering.num_swaps
        carried = ordering.resident(ordering.num_states - 1)


def test_trainer_ordering_is_the_seeded_registry_ordering(beta_p8_run, datasets):
    """Epoch e walks the registry's ordering for (seed, e); with storage.continue_epochs, that ordering renamed
    to start where the epoch before ended (the same chain whichever epoch a trainer asks for first)."""
    config, run, _ = beta_p8_run
    for continues in (False, True):
        chained = dataclasses.replace(config, storage=dataclasses.replace(config.storage, continue_epochs=continues))
        trainer = mp.trainer.Trainer.of(chained, mp.load_dataset(str(datasets[8])), run, progress=False)
        try:
            for epoch in (3, 1, 2, 4):
                expected = (chained_ordering("beta", 8, 3, config.training.seed, epoch) if continues
                            else build_ordering("beta", 8, 3, seed=config.training.seed, epoch=epoch))
                assert trainer.ordering(epoch) == expected
        finally:
            trainer.close()


@pytest.mark.parametrize("ordering, overrides", [
    ("beta", None),
    ("beta_random", ("storage.num_partitions=8", "storage.buffer_capacity=3")),
    # asynchronous: 8 batches in flight, drained before the buffer changes state
    ("beta", ("storage.num_partitions=8", "storage.buffer_capacity=3", "pipeline.staleness_bound=8",
              "training.batch_size=64")),
    ("comet", ("storage.num_partitions=8", "storage.buffer_capacity=4", "storage.group_size=2")),
    ("affine", ("storage.num_partitions=27", "storage.buffer_capacity=9")),  # 9 groups of 3, 3 in the buffer
])
def test_partitioned_training_learns(ordering, overrides, beta_p8_run, datasets, tmp_path):
    if overrides is None:
        _, run, model = beta_p8_run
    else:
        config = config_for(datasets[8], f"storage.ordering={ordering}", "training.epochs=3", *overrides)
        run = tmp_path / "run"
        model = mp.train(config, run, progress=False)
    # random embeddings rank the answer near the middle of 135 nodes (MRR ~0.04)
    assert model.test_metrics["mrr"] > 0.3, model.test_metrics
    records = epoch_records(run)
    assert all(r["io"]["partitions_read"] > 0 for r in records)
    if overrides and "pipeline.staleness_bound=8" in overrides:
        assert all(1 < r["pipeline"]["max_in_flight"] <= 8 for r in records)
        stats = simulate(build_ordering("beta", 8, 3, seed=3, epoch=1), 1)
        assert records[0]["io"]["partitions_read"] == stats.partitions_read
    if ordering == "comet":
        # 8 physical partitions, 4 resident: 4 logical BETA swaps per epoch of 2 physical partitions each
        stats = simulate(build_ordering("comet", 4, 2, seed=3, epoch=1, group_size=2), 1)
        assert records[0]["io"]["partitions_read"] == stats.physical_partitions_read
    if ordering == "affine":
        # the 12 lines of AG(2, 3): 3 groups read first, then 2 swaps per line, each of a group of 3 partitions
        stats = simulate(build_ordering("affine", 9, 3, seed=3, epoch=1, group_size=3), 1)
        assert records[0]["io"]["partitions_read"] == stats.physical_partitions_read == 3 * (3 + 11 * 2)


def test_resume_with_partitions_equals_uninterrupted(datasets, tmp_path):
    overrides = ("storage.num_partitions=8", "storage.buffer_capacity=3", "storage.ordering=beta_random",
                 "training.commits_behind=false")  # (every epoch commits, as the IO comparison below assumes)
    mp.train(config_for(datasets[8], "training.epochs=4", *overrides), tmp_path / "full", progress=False)
    mp.train(config_for(datasets[8], "training.epochs=2", *overrides), tmp_path / "split", progress=False)
    resumed = mp.api.load_run_config(tmp_path / "split", ["training.epochs=4"])
    mp.train(resumed, tmp_path / "split", progress=False, resume=True)
    full_nodes, full_state, full_model = latest(tmp_path / "full")
    split_nodes, split_state, split_model = latest(tmp_path / "split")
    np.testing.assert_allclose(split_nodes, full_nodes, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(split_state, full_state, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(split_model["decoder"]["relations"], full_model["decoder"]["relations"])
    assert [r["epoch"] for r in epoch_records(tmp_path / "split")] == [1, 2, 3, 4]
    split_io = [r["io"] for r in epoch_records(tmp_path / "split")]
    full_io = [r["io"] for r in epoch_records(tmp_path / "full")]
    assert split_io[:2] == full_io[:2] and split_io[3] == full_io[3]
    # epoch 3: the resumed process's buffer starts empty, the uninterrupted one's holds epoch 2's last state
    config = config_for(datasets[8], *overrides)
    ordering = {epoch: build_ordering("beta_random", 8, 3, seed=config.training.seed, epoch=epoch) for epoch in (2, 3)}
    partition_bytes = split_io[0]["bytes_read"] // split_io[0]["partitions_read"]
    carried = ordering[2].resident(ordering[2].num_states - 1)
    for io, held in ((split_io[2], ()), (full_io[2], carried)):
        assert {key: io[key] for key in ("partitions_read", "partitions_written", "bytes_read", "bytes_written")} \
            == walk_io(ordering[3], partition_bytes, held, carried_dirty=False)


class SimulatedCrash(Exception):
    pass


@pytest.mark.parametrize("assignment, crash_after, device", [
    ("bucket", 4, "cpu"), ("edge", 4, "cpu"), ("balanced", 4, "cpu"), ("bucket", 14, "cpu"),
    pytest.param("bucket", 4, "cuda", marks=pytest.mark.gpu)])
def test_resume_between_buffer_states_equals_uninterrupted(datasets, tmp_path, monkeypatch, assignment,
                                                           crash_after, device):
    """A run committing after every buffer state, crashed mid-epoch and resumed, ends with the uninterrupted
    run's model: the resumed epoch restarts at the next state with the same random draws (on the GPU the
    shuffles' generator is a CUDA one). GPU atomics sum in any order: two uninterrupted runs on an H100
    differ by up to 5e-5 (rows of norm ~1), hence a looser tolerance there, still far below what another
    shuffle or negative draw would change."""
    overrides = ("storage.num_partitions=8", "storage.buffer_capacity=3", "storage.ordering=beta_random",
                 f"storage.edge_assignment={assignment}", "training.epochs=3", "training.seed=5",
                 f"training.device={device}", "storage.dtype=float32")  # (bfloat16's own resume test: test_storage_dtype)
    rtol, atol = (1e-5, 1e-7) if device == "cpu" else (1e-4, 1e-3)
    mp.train(config_for(datasets[8], *overrides), tmp_path / "full", progress=False)

    from marius_py.trainer import Trainer
    original, commits = Trainer._commit_between_states, []

    def commit_then_crash(self, *args):
        original(self, *args)
        commits.append(self.state.states_done)
        if len(commits) == crash_after:  # epoch 1 has 15 states (beta_random 8:3): 14 commits, after all but the last
            raise SimulatedCrash
    monkeypatch.setattr(Trainer, "_commit_between_states", commit_then_crash)
    with pytest.raises(SimulatedCrash):
        mp.train(config_for(datasets[8], *overrides, "training.checkpoint_interval=1e-9"), tmp_path / "split",
                 progress=False)
    assert build_ordering("beta_random", 8, 3, seed=5, epoch=1).num_states == 15
    assert commits == list(range(1, crash_after + 1))
    run = RunDirectory(tmp_path / "split")
    assert run.latest_version().name == f"v000000.s{crash_after:06d}"
    monkeypatch.setattr(Trainer, "_commit_between_states", original)
    with pytest.raises(MariusInputError, match="other storage settings"):  # another walk: refused
        mp.train(mp.api.load_run_config(tmp_path / "split", ["storage.buffer_capacity=4"]), tmp_path / "split",
                 progress=False, resume=True)
    mp.train(mp.api.load_run_config(tmp_path / "split"), tmp_path / "split", progress=False, resume=True)
    full_nodes, full_state, full_model = latest(tmp_path / "full")
    split_nodes, split_state, split_model = latest(tmp_path / "split")
    np.testing.assert_allclose(split_nodes, full_nodes, rtol=rtol, atol=atol)
    np.testing.assert_allclose(split_state, full_state, rtol=rtol, atol=atol)
    torch.testing.assert_close(split_model["decoder"]["relations"], full_model["decoder"]["relations"],
                               rtol=rtol, atol=atol)
    assert run.latest_version().name == "v000003"
    split_records, full_records = epoch_records(tmp_path / "split"), epoch_records(tmp_path / "full")
    assert [r["loss"] for r in split_records] == pytest.approx([r["loss"] for r in full_records], rel=rtol)
    resumed = split_records[0]  # epoch 1 again, from state crash_after on: its record covers those states
    assert resumed["resumed_at_state"] == crash_after and len(resumed["states"]) == 15 - crash_after
    assert sum(row["edges"] for row in resumed["states"]) < sum(row["edges"] for row in full_records[0]["states"])
    assert all("resumed_at_state" not in r for r in split_records[1:])


# --------------------------------------------------------------------------- streamed evaluation and export


@pytest.mark.parametrize("partitions_per_block", [1, 3, 4])
def test_streamed_evaluation_equals_in_memory(full_buffer_runs, partitions_per_block, monkeypatch):
    _, buffered = full_buffer_runs
    streamed = load_checkpoint(buffered.run_dir)
    assert isinstance(streamed.table, StoredNodes)
    assert streamed.table.store.num_partitions == 4
    store = streamed.table.store
    partition_rows = store.bounds(0)[1] - store.bounds(0)[0]
    monkeypatch.setattr(StoredNodes, "BLOCK_BYTES", partitions_per_block * partition_rows * 4 * store.dim)
    block_rows = [len(block) for _, block in streamed.table.blocks()]
    assert sum(block_rows) == store.num_nodes and len(block_rows) == -(-4 // partitions_per_block)
    stored_rows = torch.from_numpy(store.read_all()[0])
    ids = torch.randint(store.num_nodes, (500,), generator=torch.Generator().manual_seed(1))
    for chosen in (ids, torch.unique(ids)):  # any order, and ascending (found by bisection)
        torch.testing.assert_close(streamed.table.gather(chosen), stored_rows[chosen], rtol=0, atol=0)
    in_memory = TrainedModel(streamed.config, streamed.dataset, streamed.model,
                             InMemoryNodes(torch.from_numpy(store.read_all()[0])))
    dataset = streamed.dataset
    known = build_known_answers(dataset.all_known_edges(), dataset.num_relations)
    for batch_size in (7, 1024):
        ranks_streamed = filtered_ranks(streamed.decoder, streamed.table, dataset.test, known, batch_size)
        ranks_memory = filtered_ranks(streamed.decoder, in_memory.table, dataset.test, known, batch_size)
        assert len(ranks_streamed) == 2 * len(dataset.test)
        torch.testing.assert_close(ranks_streamed, ranks_memory, rtol=0, atol=0)
    assert streamed.evaluate("test")["mrr"] == in_memory.evaluate("test")["mrr"]
    # the streamed test metrics of training are those of the same (best) checkpoint
    assert streamed.evaluate("test")["mrr"] == pytest.approx(buffered.test_metrics["mrr"], abs=1e-12)

    names = dataset.node_names
    relation = dataset.relation_names[0]
    for name in names[:3] + names[-3:]:
        for kwargs in ({"head": name}, {"tail": name}, {"head": name, "filter_known": True}):
            top_streamed = streamed.predict(relation=relation, k=7, **kwargs)
            top_memory = in_memory.predict(relation=relation, k=7, **kwargs)
            assert [n for n, _ in top_streamed] == [n for n, _ in top_memory], kwargs
            np.testing.assert_allclose([s for _, s in top_streamed], [s for _, s in top_memory], rtol=1e-6)
    np.testing.assert_array_equal(streamed.embeddings(), store.read_all()[0])


def test_export_from_partitioned_run_equals_checkpoint(full_buffer_runs, tmp_path, capsys):
    _, buffered = full_buffer_runs
    out = tmp_path / "export"
    assert main(["export", str(buffered.run_dir), "--format", "npy", "-o", str(out)]) == 0
    run = RunDirectory(buffered.run_dir)
    version = run.best_version() or run.latest_version()
    expected = EmbeddingStore(version / NODES, mode="r").read_all()[0]
    exported = np.load(out / "node_embeddings.npy")
    np.testing.assert_array_equal(exported, expected)
    names = (out / "node_names.txt").read_text(encoding="utf-8").splitlines()
    assert names == mp.load_dataset(str(buffered.config.dataset.path)).node_names


# --------------------------------------------------------------------------- config and start-up refusals


@pytest.mark.parametrize("capacity", [1, 5])
def test_bad_buffer_capacity_is_refused(datasets, capacity):
    with pytest.raises(MariusInputError, match="storage.buffer_capacity"):
        config_for(datasets[4], "storage.num_partitions=4", f"storage.buffer_capacity={capacity}")


def test_cli_train_bad_buffer_exits_2(datasets, tmp_path, capsys):
    code = main(["train", f"dataset.path={datasets[4]}", "training.device=cpu", "--partitions", "4",
                 "--buffer", "1", "--run-dir", str(tmp_path / "run"), "--quiet"])
    assert code == 2
    assert "storage.buffer_capacity" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_unknown_ordering_lists_the_known_ones(datasets):
    with pytest.raises(MariusInputError, match="storage.ordering") as error:
        config_for(datasets[4], "storage.num_partitions=4", "storage.buffer_capacity=2", "storage.ordering=nope")
    for name in ORDERINGS:
        assert name in str(error.value)


def test_dataset_bucketed_for_other_partitions_is_rebucketed_into_the_cache(datasets, tmp_path, monkeypatch):
    """A dataset preprocessed for one partition count trains at another: a re-bucketed copy is made once in
    the cache, the preprocessed directory is left as it was."""
    monkeypatch.setenv("MARIUS_PY_CACHE", str(tmp_path / "cache"))
    before = (datasets[1] / "edges.h5").read_bytes()
    config = config_for(datasets[1], "storage.num_partitions=4", "storage.buffer_capacity=2", "storage.ordering=beta")
    mp.train(config, tmp_path / "run", progress=False)
    copies = list((tmp_path / "cache" / "datasets").glob("umls-p1-*-p4"))
    assert len(copies) == 1 and Dataset(copies[0]).edges.num_partitions == 4
    assert (datasets[1] / "edges.h5").read_bytes() == before
    mp.train(config, tmp_path / "again", progress=False)  # the copy is reused
    assert list((tmp_path / "cache" / "datasets").glob("umls-p1-*-p4")) == copies


def test_partitions_left_empty_are_refused(datasets, tmp_path):
    """UMLS's 135 nodes in 16 partitions of 9 rows fill only 15: the store and buckets would disagree."""
    config = config_for(datasets[8], "storage.num_partitions=16", "storage.buffer_capacity=4")
    with pytest.raises(MariusInputError, match="fill only 15") as error:
        mp.train(config, tmp_path / "run", progress=False)
    assert "at most 15 partitions" in str(error.value)
    assert not RunDirectory(tmp_path / "run").has_checkpoint()


def test_buffer_larger_than_memory_is_refused(datasets, tmp_path, monkeypatch):
    """Refused before anything is written: the split store's re-bucketed dataset included. (Memory for a batch
    of 4 edges, which the plan checks first, and not for two partitions.)"""
    monkeypatch.setattr(resources, "available_memory", lambda: 8192)
    monkeypatch.setenv("MARIUS_PY_CACHE", str(tmp_path / "cache"))
    config = config_for(datasets[4], "storage.num_partitions=4", "storage.buffer_capacity=2",
                        "training.batch_size=4", "training.num_negatives=2")
    with pytest.raises(MariusInputError, match="storage.buffer_capacity"):
        mp.train(config, tmp_path / "run", progress=False)
    assert not (tmp_path / "cache").exists()


def test_refused_buffer_leaves_no_valid_looking_run(datasets, tmp_path, monkeypatch):
    monkeypatch.setattr(resources, "available_memory", lambda: 1024)
    config = config_for(datasets[4], "storage.num_partitions=4", "storage.buffer_capacity=2")
    with pytest.raises(MariusInputError):
        mp.train(config, tmp_path / "run", progress=False)
    assert not RunDirectory(tmp_path / "run").has_checkpoint()


# --------------------------------------------------------------------------- the ordering command


def test_cli_ordering_table(capsys):
    assert main(["ordering", "--partitions", "16", "--buffer", "4", "--nodes", "17050", "--dim", "256"]) == 0
    out = capsys.readouterr().out
    rows = {line.split()[0]: line.split() for line in out.splitlines() if line and line.split()[0] in ORDERINGS}
    assert set(rows) == set(ORDERINGS)
    beta = rows["beta"]
    assert beta[1] == "42" and beta[-1] == "1.105"
    assert "38 swaps" in out  # the lower bound ceil((120 - 6) / 3)


def test_cli_ordering_gives_affine_at_the_layout_training_uses(capsys):
    """affine's row is the store training would use (64:16 is 16 groups of 4, 4 in the buffer), and counts
    training refuses say so instead of a row."""
    assert main(["ordering", "-p", "64", "-c", "16", "--nodes", "17050", "--dim", "256"]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("affine ("))
    assert row.startswith("affine (16 groups, buffer 4)") and row.split()[5] == "57"  # 19 lines x 3 swaps
    assert "over 16 groups of 4: each trains in 5 states an epoch" in out
    assert main(["ordering", "-p", "16", "-c", "6", "--nodes", "17050"]) == 0
    out = capsys.readouterr().out
    assert "affine: not at 16:6" in out and not any(line.startswith("affine ") for line in out.splitlines())


@pytest.mark.parametrize("partitions, capacity, dataset_p", [(16, 4, None), (8, 2, None), (4, 2, 4)])
def test_cli_ordering_prints_the_split_and_group_training_uses(datasets, tmp_path, capsys, partitions, capacity,
                                                                dataset_p):
    """The split and k the command prints are the ones a run resolves (fitted to the dataset's nodes)."""
    source = ["--dataset", str(datasets[dataset_p])] if dataset_p else ["--nodes", "17050"]
    assert main(["ordering", "-p", str(partitions), "-c", str(capacity), *source]) == 0
    out = capsys.readouterr().out
    if dataset_p:
        config = config_for(datasets[dataset_p], f"storage.num_partitions={partitions}",
                            f"storage.buffer_capacity={capacity}")
        mp.train(config, tmp_path / "run", progress=False)
        s = load_run_config(tmp_path / "run").storage  # (as the run saved it: its split pinned)
        s = storage_layout(s, Dataset(datasets[dataset_p]).num_nodes)
    else:
        s = storage_layout(load_config(None, [f"storage.num_partitions={partitions}",
                                              f"storage.buffer_capacity={capacity}"]).storage)
    assert f"stored as {s.num_partitions} (storage.partition_split={s.partition_split})" in out
    assert f"(storage.group_size={s.group_size})" in out


def test_cli_ordering_buffer_one_exits_2(capsys):
    assert main(["ordering", "--partitions", "16", "--buffer", "1", "--nodes", "17050"]) == 2
    assert "--buffer" in capsys.readouterr().err


@pytest.mark.parametrize("assignment", ["bucket", "balanced", "edge"])
def test_every_edge_trained_once_per_epoch(datasets, tmp_path, monkeypatch, assignment):
    """Whatever the assignment, an epoch trains each train edge exactly once."""
    from marius_py.dataset import Dataset
    from marius_py.trainer import Trainer
    config = config_for(datasets[4], "storage.num_partitions=4", "storage.buffer_capacity=2",
                        f"storage.edge_assignment={assignment}")
    dataset = Dataset(config.dataset.path)
    trainer = Trainer.of(config, dataset, tmp_path / "run", progress=False)
    # Node ids are buffer-local inside a span; relation ids are not, so compare their multiset.
    relations = torch.cat([span.edges[:, 1] for span, _, _ in trainer.spans.spans(1, ordering=trainer.ordering(1))])
    assert len(relations) == dataset.metadata.num_train
    assert torch.equal(torch.bincount(relations, minlength=dataset.num_relations),
                       torch.bincount(torch.from_numpy(dataset.train[:, 1]), minlength=dataset.num_relations))
    trainer.close()


@pytest.mark.gpu
def test_gpu_buffer_spans_map_ids_as_on_the_host(datasets, tmp_path):
    """With the buffer on the GPU, a state's edges are mapped to buffer rows there: the same rows as the
    host mapping of a CPU run, state by state."""
    from marius_py.dataset import Dataset
    from marius_py.trainer import Trainer
    spans = {}
    for device in ("cpu", "cuda"):
        config = config_for(datasets[8], "storage.num_partitions=8", "storage.buffer_capacity=3",
                            "storage.ordering=beta", f"training.device={device}")
        trainer = Trainer.of(config, Dataset(config.dataset.path), tmp_path / device, progress=False)
        assert trainer.table_device.type == device
        spans[device] = [(span.edges, span.candidates.total) for span, _, _ in trainer.spans.spans(1, ordering=trainer.ordering(1))]
        trainer.close()
    assert len(spans["cpu"]) == len(spans["cuda"]) > 1
    for (host, host_total), (gpu, gpu_total) in zip(spans["cpu"], spans["cuda"]):
        assert gpu.is_cuda and torch.equal(gpu.cpu(), host) and gpu_total == host_total


def test_default_ordering_is_comet_and_accepts_every_partitions_buffer_pair(datasets):
    """The default is the two-level ordering over a store split finer (default_split) so that groups of 8 are
    regrouped; its group size follows, so no pair 2 <= C <= P is refused, and the epoch ordering covers
    every physical partition with the buffer's slots."""
    from marius_py.layout import epoch_ordering
    assert config_for(datasets[8]).storage.ordering == "comet"
    for partitions in range(2, 17):
        for capacity in range(2, partitions + 1):
            config = config_for(datasets[8], f"storage.num_partitions={partitions}",
                                f"storage.buffer_capacity={capacity}")
            assert (config.storage.num_partitions, config.storage.buffer_capacity) == (partitions, capacity)
            s = storage_layout(config.storage)
            split = default_split(partitions, capacity)
            assert (s.num_partitions, s.buffer_capacity, s.partition_split) == (partitions * split, capacity * split,
                                                                           split)
            assert s.group_size == default_group_size(s.num_partitions, s.buffer_capacity)
            assert s.group_size == (8 if capacity < partitions else default_group_size(partitions, capacity))
            ordering = epoch_ordering(s, config.training.seed, epoch=1)
            assert ordering.num_physical_partitions == s.num_partitions
            assert max(len(ordering.resident(t)) for t in range(ordering.num_states)) == s.buffer_capacity
            again = config_for(datasets[8], *(f"storage.{key}={value}" for key, value in
                                              config.to_dict()["storage"].items()))
            assert again.storage == config.storage  # a saved config validates to itself


def test_affine_picks_its_layout_or_names_the_one_it_needs(datasets):
    """affine splits a P = C^2 store into groups of 4 (16:4 trains as 64:16), takes k = C^2 / P from a store that
    already has it, and refuses other pairs naming the layout; a saved config validates to itself."""
    def storage(partitions, capacity, *overrides):
        s = storage_layout(config_for(datasets[8], "storage.ordering=affine", f"storage.num_partitions={partitions}",
                                      f"storage.buffer_capacity={capacity}", *overrides).storage)
        return s.num_partitions, s.buffer_capacity, s.group_size, s.partition_split
    assert storage(16, 4) == (64, 16, 4, 4)
    assert storage(64, 8) == (256, 32, 4, 4)
    assert storage(64, 16) == (64, 16, 4, 1)  # 16 groups of 4, 4 in the buffer
    assert storage(16, 8) == (16, 8, 4, 1)  # half resident: the 4 groups' 6 pairs, as comet's default
    assert storage(16, 4, "storage.partition_split=1") == (16, 4, 1, 1)
    for partitions, capacity in [(16, 6), (36, 6)]:  # not C^2 / k; a buffer of 6 groups (no GF(6))
        with pytest.raises(MariusInputError, match="storage.ordering") as error:
            storage(partitions, capacity)
        assert "P = C^2 / k" in str(error.value) and f"has {partitions}:{capacity} with" in str(error.value)
    with pytest.raises(MariusInputError, match="storage.edge_assignment"):  # it would train between lines
        storage(16, 4, "storage.edge_assignment=edge")
    assert storage(16, 16)[:2] == (16, 16) and storage(16, 0)[:2] == (16, 16)  # all resident: one state
    config = config_for(datasets[8], "storage.ordering=affine", "storage.num_partitions=16",
                        "storage.buffer_capacity=4")
    again = config_for(datasets[8], *(f"storage.{key}={value}" for key, value in config.to_dict()["storage"].items()))
    assert again.storage == config.storage


def test_validation_changes_no_value_and_the_layout_is_resolved_apart(datasets):
    """validate() only checks: a config keeps the values it was given, validating it again changes nothing,
    and the physical store (split, buffer, group size) comes from storage_layout."""
    import copy
    from marius_py.config_validation import validate
    config = config_for(datasets[8], "storage.num_partitions=16", "storage.buffer_capacity=0")
    given = copy.deepcopy(config)
    assert validate(validate(config)) == given and config == given
    assert (config.storage.num_partitions, config.storage.buffer_capacity, config.storage.group_size,
            config.storage.partition_split) == (16, 0, 0, 0)
    layout = storage_layout(config.storage)
    assert (layout.num_partitions, layout.buffer_capacity, layout.group_size, layout.partition_split) == \
        (16 * default_split(16, 16), 16 * default_split(16, 16), default_group_size(16 * default_split(16, 16),
                                                                                  16 * default_split(16, 16)),
         default_split(16, 16))


def test_the_comet_names_of_the_group_keys_still_read_with_a_warning(datasets, tmp_path):
    """storage.comet_group_size and storage.comet_split (an earlier run's config.yaml, or the command line)
    set storage.group_size and storage.partition_split, warning that the names go; the config saved from them
    uses the new names."""
    old_file = tmp_path / "old.yaml"
    old_file.write_text(f"dataset:\n  path: {datasets[8]}\nstorage:\n  num_partitions: 16\n  buffer_capacity: 4\n"
                        "  comet_split: 2\n  comet_group_size: 0\n")
    with pytest.warns(FutureWarning) as warned:
        from_file = load_config(old_file)
    assert sorted(str(w.message).split(": ", 1)[1].split(";")[0] for w in warned) == [
        "storage.comet_group_size is now storage.group_size", "storage.comet_split is now storage.partition_split"]
    with pytest.warns(FutureWarning, match="storage.comet_group_size is now storage.group_size"):
        from_overrides = load_config(None, [f"dataset.path={datasets[8]}", "storage.num_partitions=16",
                                            "storage.buffer_capacity=4", "storage.comet_group_size=2"])
    assert (from_file.storage.num_partitions, from_file.storage.partition_split) == (16, 2)
    assert storage_layout(from_file.storage).num_partitions == 32
    assert (from_overrides.storage.group_size, from_overrides.storage.partition_split) == (2, 0)
    saved = from_file.to_dict()["storage"]
    assert "comet_split" not in saved and saved["partition_split"] == 2
    with pytest.raises(MariusInputError, match="storage.group_size") as error, \
            pytest.warns(FutureWarning):  # errors name the new key
        load_config(None, [f"dataset.path={datasets[8]}", "storage.num_partitions=16",
                           "storage.buffer_capacity=4", "storage.comet_group_size=3"])
    assert error.value.path == "overrides"


def test_partition_split_given_or_off(datasets):
    """An explicit split is applied as given; 1, beta or an explicit group size keep the store as given;
    torchrun trainers (whose scheduler follows no ordering) are not split."""
    def storage(*overrides, torchrun=False):
        s = storage_layout(config_for(datasets[8], "storage.num_partitions=16", "storage.buffer_capacity=4",
                                      *overrides).storage, torchrun=torchrun)
        return s.num_partitions, s.buffer_capacity, s.group_size, s.partition_split
    assert storage() == (64, 16, 8, 4)
    assert storage("storage.partition_split=2") == (32, 8, 4, 2)
    assert storage("storage.partition_split=1") == (16, 4, 2, 1)
    assert storage("storage.ordering=beta") == (16, 4, default_group_size(16, 4), 1)
    assert storage("storage.group_size=2") == (16, 4, 2, 1)
    with pytest.raises(MariusInputError, match="storage.partition_split"):
        storage("storage.group_size=2", "storage.partition_split=2")
    assert storage(torchrun=True) == (16, 4, 2, 1)


def test_partition_split_is_lowered_until_the_nodes_fill_every_partition(datasets, tmp_path):
    """UMLS's 135 nodes cannot fill 4 x 8 partitions: the split drops to 5 (20 partitions of 7 rows, the
    largest that fill), the run's saved config says so, and a resume keeps it."""
    config = config_for(datasets[4], "storage.num_partitions=4", "storage.buffer_capacity=2")
    assert (config.storage.num_partitions, config.storage.partition_split) == (4, 0)  # as given
    assert storage_layout(config.storage).num_partitions == 32  # before the graph is known
    mp.train(config, tmp_path / "run", progress=False)
    assert (config.storage.num_partitions, config.storage.partition_split) == (4, 0)  # training changed nothing
    saved = mp.api.load_run_config(tmp_path / "run")
    assert (saved.storage.num_partitions, saved.storage.partition_split) == (4, 5)
    s = storage_layout(saved.storage, Dataset(datasets[4]).num_nodes)
    assert (s.num_partitions, s.buffer_capacity, s.partition_split, s.group_size) == (20, 10, 5, 5)
    assert EmbeddingStore(tmp_path / "run" / LIVE_STORE, mode="r").num_partitions == 20
    text = (tmp_path / "run" / "config.yaml").read_text()  # the counts as the user gave them, and the split
    assert "num_partitions: 4\n" in text and "partition_split: 5\n" in text
    assert main(["train", "--resume", str(tmp_path / "run"), "training.epochs=3", "--partitions", "4",
                 "--buffer", "2", "--quiet"]) == 0  # the user's own flags again
    assert len(epoch_records(tmp_path / "run")) == 3
    assert EmbeddingStore(tmp_path / "run" / LIVE_STORE, mode="r").num_partitions == 20


def test_explicit_group_size_that_leaves_one_group_is_refused(datasets):
    with pytest.raises(MariusInputError, match="group_size"):
        config_for(datasets[8], "storage.num_partitions=16", "storage.buffer_capacity=4",
                   "storage.group_size=4")


def test_a_resume_continues_the_chain_from_the_version_without_rebuilding_earlier_epochs(datasets, tmp_path,
                                                                                        monkeypatch):
    """A version records the partitions its last epoch ended with; a new process resuming at epoch 3 builds
    epoch 3's ordering, not epoch 2's again (a build takes seconds at a thousand partitions)."""
    overrides = ("storage.num_partitions=8", "storage.buffer_capacity=3", "storage.ordering=beta_random",
                 "storage.continue_epochs=true")
    mp.train(config_for(datasets[8], *overrides), tmp_path / "run", progress=False)
    _, _, _, training = load_version(RunDirectory(tmp_path / "run").latest_version())
    expected = chained_ordering("beta_random", 8, 3, 3, 2)
    assert training.epoch == 2 and tuple(training.ended_with) == expected.resident(expected.num_states - 1)
    built = []
    original = marius_py.layout.built_ordering
    monkeypatch.setattr(marius_py.layout, "built_ordering",
                        lambda layout, seed, epoch: built.append(epoch) or original(layout, seed, epoch))
    marius_py.layout._chains.clear()
    mp.train(mp.api.load_run_config(tmp_path / "run", ["training.epochs=3"]), tmp_path / "run", progress=False,
             resume=True)
    assert 3 in built and 2 not in built  # (epoch 1's: the plan's, which sizes the run on the first epoch)
    assert epoch_records(tmp_path / "run")[-1]["epoch"] == 3
