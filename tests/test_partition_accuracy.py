"""bench/partition_accuracy.py's ``order:P:C`` runs: in-memory epochs in a partitioned ordering's state order."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

import marius_py as mp
from marius_py.dataset import Dataset
from marius_py.trainer import Trainer, epoch_ordering
from storage.partitioning import partition_of

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
from partition_accuracy import (order_config, ordered_in_memory, run_overrides, state_ordered_spans,  # noqa: E402
                                variant_overrides)


def test_order_runs_follow_the_ordering_a_partitioned_trainer_trains(umls_dataset, tmp_path):
    """The config an order run follows is the partitioned trainer's (its store split fitted to UMLS's
    135 nodes), so both build the same buffer states and bucket assignment."""
    followed = order_config("order:4:2", umls_dataset, None, [], 8)
    partitioned = mp.make_config(None, [f"dataset.path={umls_dataset}", *variant_overrides("default:4:2", 8)])
    trainer = Trainer(partitioned, Dataset(str(umls_dataset)), tmp_path / "run", progress=False)
    assert followed.storage == trainer.config.storage
    assert epoch_ordering(followed, 3) == trainer.ordering(3)


def test_state_ordered_spans_train_every_edge_once_in_its_states_order(umls_dataset):
    partitioned = order_config("order:4:2", umls_dataset, None, [], 8)
    dataset = Dataset(str(umls_dataset))
    trainer = SimpleNamespace(dataset=dataset, nodes="nodes", node_state="state")
    ordering = epoch_ordering(partitioned, 3)
    spans = list(state_ordered_spans(partitioned)(trainer, 3))
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


def test_order_runs_patch_the_trainer_only_while_they_run(umls_dataset):
    original = Trainer._spans
    with ordered_in_memory("order:4:2", umls_dataset, None, [], 8):
        assert Trainer._spans is not original
    assert Trainer._spans is original
    with pytest.raises(RuntimeError), ordered_in_memory("order:4:2", umls_dataset, None, [], 8):
        raise RuntimeError("a failed run")
    assert Trainer._spans is original
    with ordered_in_memory("default:4:2", umls_dataset, None, [], 8):
        assert Trainer._spans is original
    assert run_overrides("order:4:2+training.lr=0.2", 8) == ["training.lr=0.2"]
    with pytest.raises(ValueError, match="in memory"):
        run_overrides("order:4:2+storage.num_partitions=8", 8)
    with pytest.raises(ValueError, match="edge_assignment"):
        order_config("order:4:2+storage.edge_assignment=edge", umls_dataset, None, [], 8)
