"""bench/partition_accuracy.py's ``order:P:C`` runs: in-memory epochs in a partitioned ordering's state order."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import marius_py as mp
from marius_py.checkpoint import RunDirectory, load_version
from marius_py.dataset import Dataset
from marius_py.evaluation import KnownAnswers
import marius_py.trainer as trainer_module
from marius_py.trainer import Trainer
from marius_py.storage.partitioning import partition_of

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
from partition_accuracy import (order_config, ordered_in_memory, predicted_io, run_overrides,  # noqa: E402
                                state_ordered_spans, variant_overrides)
from quality import run_one  # noqa: E402
from rank_split import group_of_nodes, rank_split  # noqa: E402


def test_order_runs_follow_the_ordering_a_partitioned_trainer_trains(umls_dataset, tmp_path):
    """The config an order run follows is the partitioned trainer's (its store split fitted to UMLS's
    135 nodes), so both build the same buffer states and bucket assignment."""
    followed = order_config("order:4:2", umls_dataset, None, [], 8)
    partitioned = mp.make_config(None, [f"dataset.path={umls_dataset}", *variant_overrides("default:4:2", 8)])
    trainer = Trainer.of(partitioned, Dataset(str(umls_dataset)), tmp_path / "run", progress=False)
    assert followed.layout == trainer.layout and followed.config.storage == trainer.config.storage
    assert followed.ordering(3) == trainer.ordering(3)


def test_state_ordered_spans_train_every_edge_once_in_its_states_order(umls_dataset):
    partitioned = order_config("order:4:2", umls_dataset, None, [], 8)
    dataset = Dataset(str(umls_dataset))
    inputs = SimpleNamespace(dataset=dataset, tables=SimpleNamespace(nodes="nodes", node_state="state"))
    ordering = partitioned.ordering(3)
    spans = list(state_ordered_spans(partitioned)(inputs).spans(3))
    assert len(spans) == ordering.num_states > 1
    trained = []
    for k, (span, nodes, state) in enumerate(spans):
        assert span.candidates is None and (nodes, state) == ("nodes", "state")  # in memory: every node
        edges = span.edges.numpy()
        ends = partition_of(edges[:, [0, 2]], dataset.num_nodes, ordering.num_physical_partitions)
        assert set(map(tuple, ends.tolist())) <= set(ordering.buckets[k]), f"state {k} trains other buckets"
        trained.append(edges)
    trained = np.concatenate(trained)
    assert sorted(map(tuple, trained.tolist())) == sorted(map(tuple, dataset.train.tolist()))


def test_resident_and_shuffled_spans_share_the_states_candidates_and_sizes(umls_dataset):
    """``resident:`` states offer their resident partitions' nodes as candidates; ``shuffled:`` ones the same
    nodes and as many edges, drawn from the whole epoch (each edge still once)."""
    partitioned = order_config("resident:4:2", umls_dataset, None, [], 8)
    dataset = Dataset(str(umls_dataset))
    inputs = SimpleNamespace(dataset=dataset, tables=SimpleNamespace(nodes="nodes", node_state="state"),
                             table_device="cpu")
    ordering = partitioned.ordering(3)
    p = ordering.num_physical_partitions
    resident = list(state_ordered_spans(partitioned, resident_candidates=True)(inputs).spans(3))
    shuffled = list(state_ordered_spans(partitioned, resident_candidates=True, shuffled_edges=True)(inputs).spans(3))
    outside_buckets = 0
    for k, ((kept, _, _), (drawn, _, _)) in enumerate(zip(resident, shuffled)):
        rows = kept.candidates.all(torch.device("cpu")).numpy()
        assert set(partition_of(rows, dataset.num_nodes, p).tolist()) == set(ordering.resident(k))
        assert len(rows) == len(set(rows.tolist()))
        assert torch.equal(drawn.candidates.all(torch.device("cpu")), kept.candidates.all(torch.device("cpu")))
        assert len(drawn.edges) == len(kept.edges)
        ends = partition_of(drawn.edges.numpy()[:, [0, 2]], dataset.num_nodes, p)
        outside_buckets += sum(pair not in set(ordering.buckets[k]) for pair in map(tuple, ends.tolist()))
    assert outside_buckets > len(dataset.train) // 2
    drawn = np.concatenate([span.edges.numpy() for span, _, _ in shuffled])
    assert sorted(map(tuple, drawn.tolist())) == sorted(map(tuple, dataset.train.tolist()))


def test_order_runs_patch_the_trainer_only_while_they_run(umls_dataset):
    original = trainer_module.WholeTables
    with ordered_in_memory("order:4:2", umls_dataset, None, [], 8):
        assert trainer_module.WholeTables is not original
    assert trainer_module.WholeTables is original
    with pytest.raises(RuntimeError), ordered_in_memory("order:4:2", umls_dataset, None, [], 8):
        raise RuntimeError("a failed run")
    assert trainer_module.WholeTables is original
    with ordered_in_memory("default:4:2", umls_dataset, None, [], 8):
        assert trainer_module.WholeTables is original
    assert run_overrides("order:4:2+training.lr=0.2", 8) == ["training.lr=0.2"]
    with pytest.raises(ValueError, match="in-memory"):
        run_overrides("order:4:2+storage.num_partitions=8", 8)
    with pytest.raises(ValueError, match="edge_assignment"):
        order_config("order:4:2+storage.edge_assignment=edge", umls_dataset, None, [], 8)


def latest_nodes(run_dir: Path):
    nodes, state, _, _ = load_version(RunDirectory(run_dir).latest_version())
    return torch.as_tensor(nodes), torch.as_tensor(state)


@pytest.mark.parametrize("negatives", ["training.num_negatives=32", "training.num_negatives=-1"],
                         ids=["sampled", "one-vs-all"])
def test_resident_runs_train_as_the_buffer(umls_dataset, tmp_path, negatives):
    """A ``resident:`` run trains the buffer's states, edges and candidates in memory: after two epochs its
    embeddings and Adagrad state equal a partitioned run's (to float rounding: rows are gathered in another
    order). An ``order:`` run, whose candidates are every node, does not."""
    overrides = ["training.device=cpu", "model.dim=8", "training.batch_size=256", "training.num_chunks=2",
                 "training.epochs=2", "training.seed=5", "evaluation.every=0", "storage.dtype=float32", negatives]
    base = [f"dataset.path={umls_dataset}", *overrides]
    mp.train(mp.make_config(None, base + variant_overrides("default:4:2", 8)), tmp_path / "buffer", progress=False)
    for spec in ("resident:4:2", "order:4:2"):
        with ordered_in_memory(spec, umls_dataset, None, overrides, 8):
            mp.train(mp.make_config(None, base + run_overrides(spec, 8)), tmp_path / spec, progress=False)
    buffer_nodes, buffer_state = latest_nodes(tmp_path / "buffer")
    resident_nodes, resident_state = latest_nodes(tmp_path / "resident:4:2")
    order_nodes, _ = latest_nodes(tmp_path / "order:4:2")
    torch.testing.assert_close(resident_nodes, buffer_nodes, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(resident_state, buffer_state, rtol=1e-4, atol=1e-5)
    assert (order_nodes - buffer_nodes).abs().max() > 1e-2


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_resident_runs_train_as_the_buffer_on_the_gpu(umls_dataset, tmp_path):
    """The same on the GPU, with the `fb15k-237` config's training (ComplEx-N3, 1-vs-all, relation prediction,
    bfloat16 scores): the GPU buffer's tables, swaps and write-backs against an in-memory table. GPU training
    is not bitwise repeatable (atomic row sums), so a second buffer run measures how far two runs of the same
    training drift apart; the resident run must stay within a few times that, the order run far outside."""
    overrides = ["training.device=cuda", "model.dim=32", "training.batch_size=256", "training.epochs=2", "storage.dtype=float32",
                 "training.seed=5", "evaluation.every=0"]
    base = [f"dataset.path={umls_dataset}", *overrides]
    for name in ("buffer", "buffer-again"):
        mp.train(mp.make_config("fb15k-237", base + variant_overrides("default:4:2", 8)), tmp_path / name,
                 progress=False)
    for spec in ("resident:4:2", "order:4:2"):
        with ordered_in_memory(spec, umls_dataset, "fb15k-237", overrides, 8):
            mp.train(mp.make_config("fb15k-237", base + run_overrides(spec, 8)), tmp_path / spec, progress=False)
    buffer_nodes, buffer_state = latest_nodes(tmp_path / "buffer")
    gaps = {}
    for name in ("buffer-again", "resident:4:2", "order:4:2"):
        nodes, state = latest_nodes(tmp_path / name)
        gaps[name] = ((nodes - buffer_nodes).abs().mean().item(), (state - buffer_state).abs().mean().item())
    print("mean |run - buffer| (embeddings, Adagrad state):", gaps)
    for part, floor in ((0, 1e-4), (1, 1e-5)):  # floors: should two buffer runs ever come out equal
        assert gaps["resident:4:2"][part] <= 4 * gaps["buffer-again"][part] + floor
    assert gaps["order:4:2"][0] > 10 * gaps["resident:4:2"][0]


def test_group_of_nodes_follows_the_orderings_groups(umls_dataset):
    partitioned = order_config("default:4:2", umls_dataset, None, [], 8)
    num_nodes = Dataset(str(umls_dataset)).num_nodes
    groups = group_of_nodes(partitioned, 2, num_nodes)
    ordering = partitioned.ordering(2)
    physical = partition_of(np.arange(num_nodes), num_nodes, ordering.num_physical_partitions)
    assert all(physical[node] in ordering.partitions_of(groups[node]) for node in range(num_nodes))
    assert set(groups.tolist()) == set(range(ordering.num_partitions))


class DotDecoder:
    """Scores <anchor, candidate>, whatever the relation: a model whose score levels a test can set."""

    def query(self, anchors, relations, inverse):
        return anchors

    def compare_all(self, queries, candidates):
        return queries @ candidates.transpose(-1, -2)


def test_rank_split_finds_a_group_scored_above_the_rest():
    """Rows of group 1 lifted by a shared coordinate outrank every target of group 0: its ranking errors then
    lie outside the target's group. Without the lift they lie in and out of it alike."""
    generator = torch.Generator().manual_seed(0)
    num_nodes, dim = 60, 8
    nodes = torch.randn(num_nodes, dim, generator=generator)
    nodes[:, -1] = 1.0
    groups = np.arange(num_nodes) % 3
    test = np.stack([np.arange(0, 30), np.zeros(30, dtype=np.int64), np.arange(30, 60)], axis=1)
    test = test[(groups[test[:, 0]] == 0) & (groups[test[:, 2]] == 0)]  # tail and head targets in group 0
    nodes[test[:, 2], :-1] = nodes[test[:, 0], :-1] + 0.3 * torch.randn(len(test), dim - 1, generator=generator)
    dataset = SimpleNamespace(test=test, num_relations=1)
    known = {inverse: KnownAnswers(test, 1, inverse) for inverse in (False, True)}

    def model(table):
        return SimpleNamespace(device=torch.device("cpu"), dataset=dataset, decoder=DotDecoder(),
                               embeddings=lambda: table.numpy(), known_answers=lambda inverse: known[inverse])

    plain = rank_split(model(nodes), groups)
    assert plain["mrr"] > 0.3 and 0.5 < plain["other_over_same"] < 2
    lifted = nodes.clone()
    lifted[groups == 1, -1] = 100.0
    split = rank_split(model(lifted), groups)
    assert split["above_rate_in_group"] == pytest.approx(plain["above_rate_in_group"])
    assert split["above_rate_other_groups"] >= 0.5  # group 1, half of the other rows, is above every target
    assert split["other_over_same"] > 5 * plain["other_over_same"]
    assert split["mrr_in_group"] == pytest.approx(plain["mrr_in_group"]) and split["mrr"] <= 1 / 21


def test_rank_split_mrr_is_the_trainers_filtered_test_mrr(umls_dataset, tmp_path):
    """The split counts as evaluation does (known answers filtered, ties half), so its MRR is the test MRR."""
    config = mp.make_config(None, [f"dataset.path={umls_dataset}", "training.device=cpu", "model.dim=16",
                                   "training.epochs=2", "evaluation.every=0"])
    model = mp.train(config, tmp_path / "run", progress=False)
    groups = np.arange(model.dataset.num_nodes) % 4
    split = rank_split(model, groups)
    assert split["mrr"] == pytest.approx(model.test_metrics["mrr"], abs=1e-9)
    assert split["queries"] == 2 * len(model.dataset.test)
    assert split["mrr"] < min(split["mrr_in_group"], split["mrr_other_groups"])
    with pytest.raises(ValueError, match="2 groups of at least 2 nodes"):
        rank_split(model, np.zeros(model.dataset.num_nodes, dtype=np.int64))


@pytest.mark.parametrize("commits", ["training.checkpoint_interval=0", "training.checkpoint_interval=100000"],
                         ids=["commit-every-epoch", "commit-at-validations"])
def test_predicted_io_is_the_runs_io_with_the_buffer_kept_between_epochs(umls_dataset, tmp_path, commits):
    """An out-of-core run's partition IO, summed from its epoch records, equals the prediction: each epoch
    starts from the last one's last state, dirty unless a commit or validation wrote it back (a commit point
    folded while the commit before was written behind training wrote nothing back)."""
    overrides = ["model.dim=8", "training.epochs=5", "evaluation.every=2", "storage.num_partitions=4",
                 "storage.buffer_capacity=2", commits]
    result = run_one(umls_dataset, None, overrides, tmp_path)
    io = {key: result["io"][key] for key in ("partitions_read", "partitions_written", "bytes_read", "bytes_written")}
    predicted = predicted_io(result["resolved_config"], result["num_nodes"], folded=result["folded_commits"])
    assert io == predicted
    assert predicted["bytes_written"] > 0
