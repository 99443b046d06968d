"""Commits written behind training (issue 53): the same versions and results as synchronous commits, commit
points folded while one is written, the last commit waited for, and a failure of the writer thread raised on
the training thread with the last committed version intact."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

import marius_py as mp
from marius_py.checkpoint import RunDirectory, load_version
from marius_py.checkpointer import Checkpointer
from marius_py.errors import DiskFullError

OUT_OF_CORE = ("storage.num_partitions=4", "storage.buffer_capacity=2", "storage.dtype=float32")


def final_state(run_dir):
    nodes, state, model_state, training = load_version(RunDirectory(run_dir).latest_version())
    return nodes, state, model_state["decoder"]["relations"].numpy(), training.epoch


def records(run_dir, event):
    return [r for r in RunDirectory(run_dir).read_metrics() if r["event"] == event]


@pytest.mark.parametrize("storage", [(), OUT_OF_CORE], ids=["in_memory", "out_of_core"])
def test_commits_behind_training_end_as_synchronous_ones(small_config, tmp_path, storage):
    """Every epoch's version is committed, in order, with the same tables as synchronous commits write; the
    plan says which, and each commit written behind has its record."""
    for behind in ("true", "false"):
        mp.train(small_config("training.epochs=4", "evaluation.every=0", f"training.commits_behind={behind}",
                              *storage), tmp_path / behind, progress=False)
    for got, expected in zip(final_state(tmp_path / "true"), final_state(tmp_path / "false")):
        np.testing.assert_array_equal(got, expected)
    assert [r["commits_behind"] for r in records(tmp_path / "true", "plan")] == [True]
    assert [r["commits_behind"] for r in records(tmp_path / "false", "plan")] == [False]
    # Epochs 1-3 commit behind training or fold (a UMLS epoch can end before the last commit is written);
    # the last one is waited for.
    behind = records(tmp_path / "true", "commit")
    folded = [r["epoch"] for r in records(tmp_path / "true", "epoch") if r.get("commit_folded")]
    assert sorted([r["epoch"] for r in behind] + folded) == [1, 2, 3] and 1 not in folded
    assert [r["version"] for r in behind] == [f"v{r['epoch']:06d}" for r in behind]
    assert all(r["seconds"] > 0 for r in behind) and sum((r["folded"] for r in behind), []) == \
        [epoch for epoch in folded if epoch < behind[-1]["epoch"]]
    assert records(tmp_path / "false", "commit") == []
    assert RunDirectory(tmp_path / "true").latest_version().name == "v000004"


def slow_writer(monkeypatch, release: threading.Event):
    """The writer thread waits for ``release`` before writing each version."""
    original = Checkpointer._write_behind

    def waiting(self, *args):
        assert release.wait(60), "the test never released the writer"
        return original(self, *args)
    monkeypatch.setattr(Checkpointer, "_write_behind", waiting)


def test_commit_points_fold_while_one_is_written_and_the_last_is_waited_for(small_config, tmp_path, monkeypatch):
    """Epoch 1's commit is held on its thread: epochs 2 and 3 fold (their records say so) and train on
    without waiting; the last epoch waits for it and commits itself."""
    release = threading.Event()
    slow_writer(monkeypatch, release)
    original_epoch = mp.trainer.Trainer.train_epoch

    def epoch_then_release(self, epoch):
        record = original_epoch(self, epoch)
        if epoch == 4:
            release.set()  # (epochs 2 and 3 ended with epoch 1's commit still in flight)
        return record
    monkeypatch.setattr(mp.trainer.Trainer, "train_epoch", epoch_then_release)
    mp.train(small_config("training.epochs=4", "evaluation.every=0", "training.commits_behind=true"),
             tmp_path / "run", progress=False)
    epochs = records(tmp_path / "run", "epoch")
    assert [r.get("commit_folded", False) for r in epochs] == [False, True, True, False]
    assert "commit" not in epochs[1]["time"] and "commit" in epochs[3]["time"]
    assert [(r["epoch"], r["folded"]) for r in records(tmp_path / "run", "commit")] == [(1, [])]
    run = RunDirectory(tmp_path / "run")
    assert run.latest_version().name == "v000004" and load_version(run.latest_version())[3].epoch == 4


def test_a_new_best_waits_for_the_commit_in_flight_rather_than_fold(small_config, tmp_path, monkeypatch):
    """A version of every new best exists (testing loads it): a best epoch is never folded."""
    mp.train(small_config("training.epochs=3", "evaluation.every=1", "training.commits_behind=true",
                          "training.checkpoint_interval=1e9"), tmp_path / "run", progress=False)
    run = RunDirectory(tmp_path / "run")
    valid = [r for r in run.read_metrics() if r["event"] == "eval" and r["split"] == "valid"]
    best = max(valid, key=lambda r: r["mrr"])["epoch"]
    assert run.best_version().name == f"v{best:06d}"
    assert not any(r.get("commit_folded") for r in records(tmp_path / "run", "epoch"))


@pytest.mark.parametrize("storage", [(), OUT_OF_CORE], ids=["in_memory", "out_of_core"])
def test_a_full_disk_on_the_writer_thread_stops_training_with_the_last_version_intact(small_config, tmp_path,
                                                                                       monkeypatch, storage):
    """Epoch 2's commit fails on its thread (ENOSPC): training stops at its next check with one DiskFullError
    naming the run directory; epoch 1's version stays committed and a resume ends as an uninterrupted run."""
    config = small_config("training.epochs=4", "evaluation.every=0", "training.commits_behind=true", *storage)
    mp.train(config, tmp_path / "full", progress=False)
    original = Checkpointer._write_version

    def full_at_epoch_2(self, model_state, state, *args):
        if state.epoch == 2:
            raise OSError(28, "No space left on device")
        return original(self, model_state, state, *args)
    monkeypatch.setattr(Checkpointer, "_write_version", full_at_epoch_2)
    original_epoch = mp.trainer.Trainer.train_epoch

    def epoch_after_the_last_commit(self, epoch):
        self.checkpointer.wait()  # (so that epoch 2's commit point is not folded into a later one)
        return original_epoch(self, epoch)
    monkeypatch.setattr(mp.trainer.Trainer, "train_epoch", epoch_after_the_last_commit)
    with pytest.raises(DiskFullError, match=rf"committing epoch 2 behind training needs .* {tmp_path / 'run'}"):
        mp.train(config, tmp_path / "run", progress=False)
    run = RunDirectory(tmp_path / "run")
    assert run.latest_version().name == "v000001"
    monkeypatch.setattr(Checkpointer, "_write_version", original)
    monkeypatch.setattr(mp.trainer.Trainer, "train_epoch", original_epoch)
    mp.train(mp.api.load_run_config(tmp_path / "run"), tmp_path / "run", progress=False, resume=True)
    for got, expected in zip(final_state(tmp_path / "run"), final_state(tmp_path / "full")):
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-7)


def test_the_plan_commits_synchronously_where_host_memory_has_no_room_for_a_snapshot():
    from marius_py.config_loading import load_config
    from marius_py.plan import GiB, GraphSize, Machine, plan_run
    config = load_config(None, ["training.device=cpu", "storage.num_partitions=1", "model.dim=100"])
    graph = GraphSize.of(config, 40_000_000, 1_000_000)  # (16 GB of host tables)
    roomy = plan_run(config, graph, Machine(host_available=128 * GiB, disk_free=500 * GiB))
    tight = plan_run(config, graph, Machine(host_available=40 * GiB, disk_free=500 * GiB))
    assert roomy.commits_behind and roomy.host_bytes >= 2 * roomy.table_bytes
    assert not tight.commits_behind and tight.host_bytes < 2 * tight.table_bytes
    assert any("commits are synchronous" in note for note in tight.notes)
    assert "commits synchronous" in tight.describe() and "commits written behind training" in roomy.describe()
    forced = load_config(None, ["training.device=cpu", "storage.num_partitions=1", "model.dim=100",
                                "training.commits_behind=false"])
    assert not plan_run(forced, graph, Machine(host_available=128 * GiB, disk_free=500 * GiB)).commits_behind


def test_any_failure_of_the_writer_thread_is_raised_on_the_training_thread(small_config, tmp_path, monkeypatch):
    """Not only a full disk: whatever the thread raises stops training at its next check, never swallowed."""
    def broken(self, *args):
        raise RuntimeError("the writer broke")
    monkeypatch.setattr(Checkpointer, "_write_version", broken)
    with pytest.raises(RuntimeError, match="the writer broke"):
        mp.train(small_config("training.epochs=3", "evaluation.every=0", "training.commits_behind=true"),
                 tmp_path / "run", progress=False)
    assert not RunDirectory(tmp_path / "run").has_checkpoint()


def test_a_stop_at_an_epochs_end_waits_for_the_commit_behind_it(small_config, tmp_path, monkeypatch):
    """A callback stops training at epoch 2's end, after its commit began behind training (slowed on the
    thread): train() returns only once that version is committed and reported, and tests it."""
    from marius_py.callbacks import Callback, Stop
    original_write, original_epoch = Checkpointer._write_behind, mp.trainer.Trainer.train_epoch

    def slow_at_epoch_2(self, snapshot, *args):
        if snapshot.state.epoch == 2:
            time.sleep(0.5)
        return original_write(self, snapshot, *args)

    def epoch_after_the_last_commit(self, epoch):
        self.checkpointer.wait()  # (so that epoch 2's commit point is not folded)
        return original_epoch(self, epoch)
    monkeypatch.setattr(Checkpointer, "_write_behind", slow_at_epoch_2)
    monkeypatch.setattr(mp.trainer.Trainer, "train_epoch", epoch_after_the_last_commit)

    class StopAtTwo(Callback):
        def on_epoch_end(self, run, record):
            return Stop("enough") if run.epoch == 2 else None
    model = mp.train(small_config("training.epochs=4", "evaluation.every=0", "training.commits_behind=true"),
                     tmp_path / "run", progress=False, callbacks=[StopAtTwo()])
    assert RunDirectory(tmp_path / "run").latest_version().name == "v000002"
    assert [r["epoch"] for r in records(tmp_path / "run", "commit")] == [1, 2]
    assert model.test_metrics is not None and records(tmp_path / "run", "stop")


def test_snapshot_memory_that_cannot_be_allocated_turns_commits_synchronous(small_config, tmp_path, monkeypatch):
    """Pinned host memory can run out below what the plan saw: the run then commits synchronously, says so
    once in its log, and ends with the same tables as a run committing synchronously from the start."""
    def no_memory(self):
        raise RuntimeError("CUDA error: out of memory (pinned host allocation)")
    monkeypatch.setattr(mp.trainer.Trainer, "_snapshot_memory", no_memory)
    for behind in ("true", "false"):
        mp.train(small_config("training.epochs=3", "evaluation.every=0", f"training.commits_behind={behind}"),
                 tmp_path / behind, progress=False)
    for got, expected in zip(final_state(tmp_path / "true"), final_state(tmp_path / "false")):
        np.testing.assert_array_equal(got, expected)
    (turned,) = records(tmp_path / "true", "commits_synchronous")
    assert turned["epoch"] == 1 and "out of memory" in turned["reason"]
    assert records(tmp_path / "true", "commit") == []  # (none was written behind)
    assert RunDirectory(tmp_path / "true").latest_version().name == "v000003"


def test_the_plan_counts_a_store_more_on_disk_for_commits_behind_out_of_core():
    """Out of core a commit behind training links the store's files, which the buffer's write-backs replace
    while it is written: the disk may hold one store more than with synchronous commits."""
    from marius_py.config_loading import load_config
    from marius_py.plan import GiB, GraphSize, Machine, plan_run
    overrides = ["training.device=cpu", "storage.num_partitions=8", "storage.buffer_capacity=4", "model.dim=100"]
    graph = GraphSize.of(load_config(None, overrides), 4_000_000, 1_000_000)
    for behind, versions in (("true", 4), ("false", 3)):
        config = load_config(None, overrides + [f"training.commits_behind={behind}"])
        table = plan_run(config, graph, Machine(host_available=128 * GiB, disk_free=500 * GiB)).table_bytes
        tight = plan_run(config, graph, Machine(host_available=128 * GiB, disk_free=int(versions * table) - 1))
        roomy = plan_run(config, graph, Machine(host_available=128 * GiB, disk_free=int(versions * table) + 1))
        assert any("committed versions may need" in note for note in tight.notes), behind
        assert not any("committed versions may need" in note for note in roomy.notes), behind
