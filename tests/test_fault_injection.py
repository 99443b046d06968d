"""SIGKILL at random instants (bench/fault_injection.py) on UMLS, out of core and in memory: every run
resumes and ends with the uninterrupted run's test MRR. Slow: a process per attempt."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

from fault_injection import run_with_kills  # noqa: E402

UMLS_RAW = Path(__file__).parent / "data" / "umls"


@pytest.mark.slow
@pytest.mark.parametrize("storage", [["storage.num_partitions=4", "storage.buffer_capacity=2"],
                                     ["storage.num_partitions=1"]])
def test_random_kills_resume_to_the_uninterrupted_model(tmp_path, storage):
    settings = [f"dataset.path={UMLS_RAW}", "training.device=cpu", "model.dim=16", "training.epochs=4",
                "training.num_negatives=64", "evaluation.every=2", "training.checkpoint_interval=0", *storage]
    result = run_with_kills(settings, kills=4, workdir=tmp_path, seed=1, log=lambda line: None, commit_kills=0.5)
    assert result["kills"] == 4 and result["refused"] == 0 and result["aimed_at_commits"] >= 1
    assert all(mrr is not None and abs(mrr - result["reference_mrr"]) <= 0.005 for mrr in result["final_mrrs"])
