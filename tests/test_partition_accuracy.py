"""bench/partition_accuracy.py's ``order:P:C`` runs: in-memory epochs in a partitioned ordering's state order."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np

import marius_py as mp
from marius_py.dataset import Dataset
from marius_py.trainer import epoch_ordering
from storage.partitioning import partition_of

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
from partition_accuracy import state_ordered_spans, variant_overrides  # noqa: E402


def test_state_ordered_spans_train_every_edge_once_in_its_states_order(umls_dataset):
    partitioned = mp.make_config(None, [f"dataset.path={umls_dataset}", *variant_overrides("default:4:2", 8)])
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
