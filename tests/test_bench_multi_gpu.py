"""bench/multi_gpu.py and bench/scaling.py on simulated devices: bytes routed per variant, and where an epoch's
time and bytes go as scaling.py reads them from the metrics log."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import marius_py as mp
from marius_py.dataset import Dataset

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
from e2e import epoch_window, watch_lines  # noqa: E402
from multi_gpu import link_totals, transfer_bytes  # noqa: E402
from scaling import where_time_goes  # noqa: E402

SMALL_STEP = ["training.batch_size=512", "training.num_negatives=64", "training.num_chunks=2"]


def test_bytes_part_routes_each_variant_on_three_simulated_devices(umls_dataset):
    dataset = Dataset(umls_dataset)
    edges = torch.from_numpy(dataset.train)
    args = argparse.Namespace(simulate=True, cache_fraction=0.05, overrides=SMALL_STEP)
    rows = {row["variant"]: row for row in transfer_bytes("umls", edges, dataset.num_nodes, dataset.num_relations,
                                                         3, args)}
    baseline, sharing = rows["baseline (no dedup)"], rows["dedup: sharing"]
    assert baseline["h2d_saving"] == 0 and baseline["rho"] == 1
    assert sharing["rho"] > 1 and sharing["h2d_saving"] == pytest.approx(1 - 1 / sharing["rho"])
    split = rows["dedup: split across devices"]
    assert split["cache_hits"] == split["union_rows"] > 0  # every row read from the devices' shares
    for row in rows.values():
        assert len(row["links"]["host_to_device"]) == 3 and row["devices"] == ["cpu"] * 3
        assert link_totals(row["links"])["host_to_device"] == row["host_to_device"]["bytes"]
        per_edge = sum(row["links_per_edge"]["host_to_device"])
        assert per_edge == pytest.approx(row["host_to_device"]["bytes"] / len(edges))


def _epochs(small_config, run_dir: Path, *overrides: str) -> list[dict]:
    mp.train(small_config("training.devices=cpu,cpu,cpu", "training.epochs=2", "evaluation.every=0", *overrides),
             run_dir, progress=False)
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in records if r["event"] == "epoch"]


def test_where_time_goes_reads_phases_and_bytes_per_trained_edge(small_config, umls_dataset, tmp_path):
    """Per trained edge of the epochs after the first, host bytes with dedup are fewer than without."""
    found = {}
    for dedup in ("true", "false"):
        epochs = _epochs(small_config, tmp_path / dedup, f"pipeline.dedup={dedup}")
        found[dedup] = where_time_goes(epochs)
        second = epochs[1]
        trained = Dataset(umls_dataset).metadata.num_train
        assert found[dedup]["host_bytes_per_edge"] == pytest.approx(
            sum(second["devices"]["links"]["host_to_device"]) / trained)
        assert found[dedup]["epoch_phase_seconds"]["train"] == second["time"]["train"]
        assert found[dedup]["dedup_run"] is (dedup == "true")
    assert found["true"]["host_bytes_per_edge"] < found["false"]["host_bytes_per_edge"]
    assert found["true"]["rho"] > 1 == found["false"]["rho"]


def test_where_time_goes_with_replicated_tables_counts_only_copies_between_devices(small_config, tmp_path):
    found = where_time_goes(_epochs(small_config, tmp_path / "run", "pipeline.placement=replicated"))
    assert found["host_bytes_per_edge"] == 0 and found["device_bytes_per_edge"] > 0
    assert found["host_enqueue_seconds"] > 0 and "rho" not in found


def test_watched_lines_are_timed_as_they_appear_and_a_failure_raises(tmp_path):
    path = tmp_path / "log"
    writer = ("import sys, time\nf = open(sys.argv[1], 'a')\nf.write('a\\n'); f.flush(); time.sleep(0.4)\n"
              "f.write('b\\n'); f.flush()\nsys.exit(int(sys.argv[2]))")
    arrivals = watch_lines(subprocess.Popen([sys.executable, "-c", writer, str(path), "0"]), path, interval=0.02)
    assert len(arrivals) == 2 and arrivals[1] - arrivals[0] > 0.3
    with pytest.raises(subprocess.CalledProcessError):
        watch_lines(subprocess.Popen([sys.executable, "-c", writer, str(tmp_path / "other"), "3"]),
                    tmp_path / "other")
    # An epoch logged at 10 s after 1 s of validation and 2 s of commit trained from 4 s to 7 s.
    assert epoch_window(10.0, {"seconds": 3.0, "time": {"validate": 1.0, "commit": 2.0}}) == (4.0, 7.0)
