"""bench/larger_than_memory.py: the train pass times the epoch as `marius-py train` runs it (its own process,
stopped after the timed epoch), beside the step alone, with IO against the simulator's prediction."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import torch

BENCH = Path(__file__).resolve().parent.parent / "bench" / "larger_than_memory.py"


def test_the_train_pass_times_the_epoch_end_to_end_with_the_simulators_io(tmp_path):
    out = tmp_path / "out.json"
    subprocess.run([sys.executable, str(BENCH), "--workdir", str(tmp_path / "work"), "--graph", "freebase",
                    "--scale", "0.002", "--partitions", "4", "--buffer", "0", "--ordering", "comet", "--dim", "16",
                    "--decoder", "complex", "--adagrad", "rowwise", "--batch-size", "5000", "--negatives", "100",
                    "--passes", "compute,train", "--set", "storage.memory_limit_gib=0.008", "--out", str(out)],
                   check=True, capture_output=True)
    report = json.loads(out.read_text())
    train, compute = report["passes"]["train"], report["passes"]["compute"]
    assert train["timed_epoch"] == compute["timed_epoch"] == 2
    assert train["plan"]["tier"] == "disk" and train["plan"]["buffer_capacity"] < 4  # (partitions swap)
    assert train["counters"]["bytes_read"] > 0 and report["summary"]["counters_match_simulator"]
    assert train["num_edges"] == compute["num_edges"] and train["seconds"] > 0
    assert 0 < train["peak_rss_bytes"] <= train["plan"]["host_bytes"]
    assert report["summary"]["pass"] == "train" and train["counters"]["checkpoint_bytes_written"] == 0  # (no commit)
    assert not (tmp_path / "work" / "train-run").exists()  # (the train pass's run and store removed)


def test_the_compute_pass_fills_the_host_slots_too_where_they_are_not_the_tables():
    sys.path.insert(0, str(BENCH.parent))
    from larger_than_memory import fill_as_new_store
    torch.manual_seed(0)
    separate = SimpleNamespace(tables=[torch.zeros(64, 8), torch.ones(64, 1)],
                               host_slots=[torch.zeros(64, 8), torch.ones(64, 1)])  # (a GPU's: copied at reads)
    same = [torch.zeros(64, 8), torch.ones(64, 1)]
    for buffer in (separate, SimpleNamespace(tables=same, host_slots=same)):  # (a CPU's: the tables)
        fill_as_new_store(buffer, 0.1)
        for embeddings, state in (buffer.tables, buffer.host_slots):
            assert 0.05 < embeddings.std() < 0.2 and not state.any()
