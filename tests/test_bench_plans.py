"""bench/plans.py: the plan's run and manual settings, each trained in its own process, stopped before
validating, with the child's own peak RSS; a manual setting that fails is recorded, not fatal."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
from plans import measure  # noqa: E402


def test_the_plan_and_manual_settings_train_an_epoch_each_and_a_bad_setting_is_recorded(umls_dataset, tmp_path):
    args = argparse.Namespace(datasets_root=str(umls_dataset.parent), workdir=str(tmp_path), epochs=1, set=[],
                              skip_plan=False, manual=["storage.num_partitions=4 storage.buffer_capacity=2",
                                                       "storage.num_partitions=4 storage.buffer_capacity=9"])
    row = measure(umls_dataset.name, args)
    plan = row["plan"]
    assert plan["plan"]["tier"] == "host" and plan["epoch"]["epoch"] == 1 and plan["epoch"]["edges_per_s"] > 0
    assert 0 < plan["peak_rss_bytes"] and row["rss_within_bound"] == (plan["peak_rss_bytes"]
                                                                      <= plan["plan"]["host_bytes"])
    partitioned, refused = row["manual"]
    assert partitioned["plan"]["tier"] == "disk" and partitioned["plan"]["num_partitions"] == 4
    assert partitioned["epoch"]["epoch"] == 1
    assert "buffer_capacity" in refused["error"] and "epoch" not in refused
    assert row["plan_over_best_manual"] == plan["epoch"]["edges_per_s"] / partitioned["epoch"]["edges_per_s"]
    assert not (tmp_path / "run").exists()  # (each run's directory removed after it)
