"""bench/freebase_shape.py: a Freebase86m-shaped graph written straight into the preprocessed layout."""

from __future__ import annotations

import sys
from pathlib import Path

import h5py
import numpy as np

import marius_py as mp
from marius_py.config_loading import load_config
from marius_py.dataset import Dataset

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
from freebase_shape import generate, parse_args  # noqa: E402

SMALL = ["--nodes", "3000", "--relations", "40", "--train", "30000", "--valid", "500", "--test", "400",
         "--partitions", "4", "--chunk", "7000", "--workers", "2"]


def test_generated_dataset_is_bucketed_heavy_tailed_and_seeded(tmp_path):
    first = generate(parse_args(["--out", str(tmp_path / "a"), *SMALL]), log=lambda _: None)
    generate(parse_args(["--out", str(tmp_path / "b"), *SMALL]), log=lambda _: None)
    assert first["train"] == 30000 and first["largest_bucket"] < 1.3 * first["smallest_bucket"]
    dataset = Dataset.load(tmp_path / "a")
    m = dataset.metadata
    assert (m.num_nodes, m.num_relations, m.num_train, m.num_valid, m.num_test, m.num_partitions) == \
        (3000, 40, 30000, 500, 400, 4)
    train = dataset.train
    assert train.min() >= 0 and train[:, [0, 2]].max() < 3000 and train[:, 1].max() < 40
    offsets, rows = dataset.edges.bucket_offsets(), 750
    for bucket in range(16):  # every edge sits in its (head partition, tail partition) bucket
        edges = train[offsets[bucket]:offsets[bucket + 1]]
        assert (edges[:, 0] // rows == bucket // 4).all() and (edges[:, 2] // rows == bucket % 4).all()
    degrees = dataset.degrees()
    assert degrees.max() > 20 * degrees.mean()  # heavy-tailed
    assert np.bincount(train[:, 1]).max() > 10 * np.median(np.bincount(train[:, 1], minlength=40))
    assert len(dataset.node_names) == 3000 and dataset.relation_names[:2] == ["r0", "r1"]
    with h5py.File(tmp_path / "a" / "edges.h5") as a, h5py.File(tmp_path / "b" / "edges.h5") as b:
        for split in ("train", "valid", "test"):  # the same seed, the same graph
            assert np.array_equal(a[split][:], b[split][:])
    assert not list(tmp_path.glob(".*tmp-*"))  # no staging directory left


def test_generated_dataset_trains_out_of_core(tmp_path):
    generate(parse_args(["--out", str(tmp_path / "g"), *SMALL]), log=lambda _: None)
    config = load_config(None, [f"dataset.path={tmp_path / 'g'}", "training.device=cpu", "model.dim=8",
                                "training.epochs=1", "storage.num_partitions=4", "storage.buffer_capacity=2",
                                "training.num_negatives=50", "evaluation.protocol=sampled",
                                "evaluation.num_negatives=100"])
    model = mp.train(config, tmp_path / "run", progress=False)
    assert 0 < model.test_metrics["mrr"] <= 1
