"""Trainer behaviour: learning, determinism, resume equivalence, checkpoints, early stopping."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import marius_py as mp
from marius_py.cli import main as cli_main
from marius_py.checkpoint import RunDirectory, load_version
from marius_py.storage import durable


def latest_nodes(run_dir) -> np.ndarray:
    return load_version(RunDirectory(run_dir).latest_version())[0]


def test_training_learns_umls(small_config, tmp_path):
    config = small_config("training.epochs=8", "model.dim=32", "evaluation.every=4")
    model = mp.train(config, tmp_path / "run", progress=False)
    # Random embeddings rank the answer near the middle of 135 nodes (MRR ~0.04).
    assert model.test_metrics["mrr"] > 0.3
    assert model.test_metrics["num_queries"] == 2 * model.dataset.metadata.num_test


def test_training_with_relation_prediction_learns(small_config, tmp_path):
    """The relation-prediction objective trains alongside the link objective (ComplEx, UMLS)."""
    config = small_config("training.relation_prediction=0.25", "training.epochs=4", "model.dim=32")
    model = mp.train(config, tmp_path / "run", progress=False)
    assert model.test_metrics["mrr"] > 0.3
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in records if r["event"] == "epoch"]
    assert losses[-1] < losses[0]


def test_same_seed_same_embeddings_on_cpu(small_config, tmp_path):
    config = small_config()
    mp.train(config, tmp_path / "a", progress=False)
    mp.train(config, tmp_path / "b", progress=False)
    np.testing.assert_array_equal(latest_nodes(tmp_path / "a"), latest_nodes(tmp_path / "b"))
    other = small_config("training.seed=1")
    mp.train(other, tmp_path / "c", progress=False)
    assert not np.allclose(latest_nodes(tmp_path / "a"), latest_nodes(tmp_path / "c"))


def test_same_seed_same_embeddings_with_parallel_kernels(small_config, tmp_path):
    """Batches large enough for torch's multi-threaded CPU kernels are still reproducible."""
    config = small_config("model.dim=256", "training.batch_size=1000", "training.num_negatives=200",
                          "training.num_chunks=1", "training.epochs=1", "evaluation.every=0")
    mp.train(config, tmp_path / "a", progress=False)
    mp.train(config, tmp_path / "b", progress=False)
    np.testing.assert_array_equal(latest_nodes(tmp_path / "a"), latest_nodes(tmp_path / "b"))


@pytest.mark.parametrize("overrides", [
    (),
    ("model.dropout=0.2", "model.reg_weight=0.01", "training.degree_fraction=0.5"),
    ("training.adagrad_variant=rowwise", "training.relation_optimizer=adam", "model.decoder=transe"),
])
def test_resume_equals_uninterrupted(small_config, tmp_path, overrides):
    full = small_config("training.epochs=4", *overrides)
    mp.train(full, tmp_path / "full", progress=False)

    mp.train(small_config("training.epochs=2", *overrides), tmp_path / "split", progress=False)
    resumed = mp.api.load_run_config(tmp_path / "split", ["training.epochs=4"])
    mp.train(resumed, tmp_path / "split", progress=False, resume=True)

    np.testing.assert_allclose(latest_nodes(tmp_path / "split"), latest_nodes(tmp_path / "full"),
                               rtol=1e-5, atol=1e-7)
    full_model = load_version(RunDirectory(tmp_path / "full").latest_version())[2]
    split_model = load_version(RunDirectory(tmp_path / "split").latest_version())[2]
    torch.testing.assert_close(split_model["decoder"]["relations"], full_model["decoder"]["relations"])
    epochs = [r["epoch"] for r in RunDirectory(tmp_path / "split").read_metrics() if r["event"] == "epoch"]
    assert epochs == [1, 2, 3, 4]


def test_starting_over_an_existing_run_is_refused(small_config, tmp_path):
    mp.train(small_config("training.epochs=1"), tmp_path / "run", progress=False)
    with pytest.raises(mp.MariusInputError, match="already holds a run"):
        mp.train(small_config("training.epochs=1"), tmp_path / "run", progress=False)


def test_resume_refuses_a_different_model(small_config, tmp_path):
    mp.train(small_config("training.epochs=1"), tmp_path / "run", progress=False)
    changed = mp.api.load_run_config(tmp_path / "run", ["model.dim=8", "training.epochs=2"])
    with pytest.raises(mp.MariusInputError, match="different model"):
        mp.train(changed, tmp_path / "run", progress=False, resume=True)


def test_checkpoint_versions_and_best_pointer(small_config, tmp_path):
    mp.train(small_config("training.epochs=3"), tmp_path / "run", progress=False)
    run = RunDirectory(tmp_path / "run")
    assert run.latest_version().name == "v000003"
    evals = [r for r in run.read_metrics() if r["event"] == "eval" and r["split"] == "valid"]
    best = max(evals, key=lambda r: r["mrr"])
    assert run.best_version().name == f"v{best['epoch']:06d}"
    kept = sorted(p.name for p in run.checkpoints.iterdir() if p.is_dir())
    assert kept == sorted({run.latest_version().name, run.best_version().name})
    state = json.loads((run.latest_version() / "state.json").read_text())
    assert state["epoch"] == 3 and state["best_epoch"] == best["epoch"]


def test_checkpoint_interval_commits_new_bests_and_the_last_epoch(small_config, tmp_path, monkeypatch):
    """With a long interval only epochs with a new best validation and the last epoch commit; a run killed
    between commits resumes from the last one and ends with the uninterrupted model."""
    commits = []
    original_write = mp.checkpointer.Checkpointer._write_version  # (every commit, behind training or not)
    monkeypatch.setattr(mp.checkpointer.Checkpointer, "_write_version",
                        lambda self, model_state, state, *args: (commits.append(state.epoch),
                                                                 original_write(self, model_state, state, *args))[1])
    interval = ("training.checkpoint_interval=1e9", "evaluation.every=2")
    mp.train(small_config("training.epochs=5", *interval), tmp_path / "full", progress=False)
    validations = [r for r in RunDirectory(tmp_path / "full").read_metrics()
                   if r["event"] == "eval" and r["split"] == "valid" and r["epoch"] in (2, 4)]
    new_bests = [r["epoch"] for i, r in enumerate(validations)
                 if all(r["mrr"] > earlier["mrr"] for earlier in validations[:i])]
    assert commits == [*new_bests, 5]

    original_epoch = mp.trainer.Trainer.train_epoch

    def killed_at_epoch_4(self, epoch):
        if epoch == 4:
            raise KeyboardInterrupt
        return original_epoch(self, epoch)

    monkeypatch.setattr(mp.trainer.Trainer, "train_epoch", killed_at_epoch_4)
    with pytest.raises(KeyboardInterrupt):
        mp.train(small_config("training.epochs=5", *interval), tmp_path / "split", progress=False)
    assert RunDirectory(tmp_path / "split").latest_version().name == "v000002"  # epoch 3 did not commit
    monkeypatch.setattr(mp.trainer.Trainer, "train_epoch", original_epoch)
    mp.train(mp.api.load_run_config(tmp_path / "split", []), tmp_path / "split", progress=False, resume=True)
    np.testing.assert_allclose(latest_nodes(tmp_path / "split"), latest_nodes(tmp_path / "full"),
                               rtol=1e-5, atol=1e-7)
    epochs = [r["epoch"] for r in RunDirectory(tmp_path / "split").read_metrics() if r["event"] == "epoch"]
    assert epochs == [1, 2, 3, 4, 5]


def test_a_new_run_commits_nothing_before_its_first_epoch(small_config, tmp_path, monkeypatch, capsys):
    """The seeded initial state is not written as a version (a second copy of the store on disk while the
    first epoch rewrites it); a run killed in its first epoch starts over from the same state."""
    original_epoch = mp.trainer.Trainer.train_epoch

    def killed_in_epoch_1(self, epoch):
        assert not self.run.has_checkpoint() and not any(self.run.checkpoints.iterdir())
        raise KeyboardInterrupt
    monkeypatch.setattr(mp.trainer.Trainer, "train_epoch", killed_in_epoch_1)
    with pytest.raises(KeyboardInterrupt):
        mp.train(small_config("training.epochs=2"), tmp_path / "split", progress=False)
    monkeypatch.setattr(mp.trainer.Trainer, "train_epoch", original_epoch)
    # nothing committed yet: info says so; a fresh train is refused while the run still runs (it holds the
    # directory's lock), and would reuse the directory once it does not (nothing committed to lose)
    assert cli_main(["info", str(tmp_path / "split")]) == 0
    assert json.loads(capsys.readouterr().out)["latest"] is None
    with mp.run_lock.RunLock(tmp_path / "split"), pytest.raises(mp.MariusInputError, match="is in use by pid"):
        mp.train(small_config("training.epochs=2"), tmp_path / "split", progress=False)
    mp.train(mp.api.load_run_config(tmp_path / "split", []), tmp_path / "split", progress=False, resume=True)
    mp.train(small_config("training.epochs=2"), tmp_path / "full", progress=False)
    np.testing.assert_allclose(latest_nodes(tmp_path / "split"), latest_nodes(tmp_path / "full"),
                               rtol=1e-5, atol=1e-7)


def test_run_killed_before_its_first_checkpoint_resumes(small_config, tmp_path, monkeypatch):
    """A kill while the dataset is prepared leaves a run directory that --resume accepts; the resumed run
    equals an uninterrupted one."""
    def killed(*args, **kwargs):
        raise KeyboardInterrupt
    original = mp.api.open_dataset
    monkeypatch.setattr(mp.api, "open_dataset", killed)
    with pytest.raises(KeyboardInterrupt):
        mp.train(small_config(), tmp_path / "killed", progress=False)
    monkeypatch.setattr(mp.api, "open_dataset", original)
    mp.train(mp.api.load_run_config(tmp_path / "killed", []), tmp_path / "killed", progress=False, resume=True)
    mp.train(small_config(), tmp_path / "full", progress=False)
    np.testing.assert_array_equal(latest_nodes(tmp_path / "killed"), latest_nodes(tmp_path / "full"))


def test_user_error_before_the_first_checkpoint_leaves_no_run_directory(small_config, tmp_path):
    with pytest.raises(mp.MariusInputError):
        mp.train(small_config(f"dataset.path={tmp_path / 'missing'}"), tmp_path / "run", progress=False)
    assert not (tmp_path / "run").exists()


def test_interrupted_commit_leaves_previous_checkpoint(small_config, tmp_path, monkeypatch):
    """A crash after the new version is written but before LATEST moves keeps the old one."""
    mp.train(small_config("training.epochs=1"), tmp_path / "run", progress=False)
    run = RunDirectory(tmp_path / "run")
    before = latest_nodes(tmp_path / "run")

    write_text_atomic = durable.write_text_atomic

    def crash_at_the_pointer_file(path, text):  # (the metrics log is rewritten atomically too, at start-up)
        if Path(path).name == "POINTERS.json":
            raise KeyboardInterrupt
        write_text_atomic(path, text)

    monkeypatch.setattr("marius_py.storage.durable.write_text_atomic", crash_at_the_pointer_file)
    resumed = mp.api.load_run_config(tmp_path / "run", ["training.epochs=2"])
    with pytest.raises(KeyboardInterrupt):
        mp.train(resumed, tmp_path / "run", progress=False, resume=True)
    monkeypatch.undo()
    assert (tmp_path / "run" / "checkpoints" / "v000002").is_dir()  # written and renamed, never pointed to
    assert run.latest_version().name == "v000001"
    np.testing.assert_array_equal(latest_nodes(tmp_path / "run"), before)
    # ... and resuming from it trains epoch 2 again; its record logged before the cut commit is dropped.
    mp.train(resumed, tmp_path / "run", progress=False, resume=True)
    assert run.latest_version().name == "v000002"
    assert [r["epoch"] for r in run.read_metrics() if r["event"] == "epoch"] == [1, 2]


def test_early_stopping(small_config, tmp_path):
    # A learning rate this small cannot improve validation MRR measurably.
    config = small_config("training.epochs=20", "training.lr=1e-9", "training.relation_lr=1e-9",
                          "evaluation.early_stopping_patience=2")
    mp.train(config, tmp_path / "run", progress=False)
    epochs = [r["epoch"] for r in RunDirectory(tmp_path / "run").read_metrics() if r["event"] == "epoch"]
    assert len(epochs) < 20


def test_metrics_log_has_epochs_and_evaluations(small_config, tmp_path):
    mp.train(small_config(), tmp_path / "run", progress=False)
    records = RunDirectory(tmp_path / "run").read_metrics()
    epochs = [r for r in records if r["event"] == "epoch"]
    assert [r["epoch"] for r in epochs] == [1, 2]
    assert all(r["edges_per_s"] > 0 and r["loss"] > 0 for r in epochs)
    assert {r["split"] for r in records if r["event"] == "eval"} == {"valid", "test"}
    assert (tmp_path / "run" / "config.yaml").exists()


@pytest.mark.parametrize("decoder", ["dot", "distmult", "complex", "transe", "rotate"])
@pytest.mark.parametrize("loss", ["softmax_ce", "logistic", "margin"])
def test_every_decoder_and_loss_trains(small_config, tmp_path, decoder, loss):
    config = small_config(f"model.decoder={decoder}", f"model.loss={loss}", "training.epochs=1",
                          "evaluation.every=0", "model.regularizer=n3", "model.reg_weight=0.001")
    model = mp.train(config, tmp_path / "run", progress=False)
    assert np.isfinite(model.embeddings()).all()
    assert 0 < model.test_metrics["mrr"] <= 1


def test_sampled_evaluation_protocol(small_config, tmp_path):
    config = small_config("evaluation.protocol=sampled", "evaluation.num_negatives=20",
                          "evaluation.negative_sampling=degree")
    model = mp.train(config, tmp_path / "run", progress=False)
    assert "20 sampled degree-based" in model.test_metrics["protocol"]
    assert 1 <= model.test_metrics["mean_rank"] <= 21


def test_resume_selects_the_same_best_checkpoint(small_config, tmp_path):
    """Off-schedule end-of-run validations are logged but never become 'best'."""
    mp.train(small_config("training.epochs=4", "evaluation.every=3"), tmp_path / "full", progress=False)
    mp.train(small_config("training.epochs=2", "evaluation.every=3"), tmp_path / "split", progress=False)
    assert RunDirectory(tmp_path / "split").best_version() is None
    resumed = mp.api.load_run_config(tmp_path / "split", ["training.epochs=4"])
    mp.train(resumed, tmp_path / "split", progress=False, resume=True)
    assert RunDirectory(tmp_path / "split").best_version().name == "v000003"
    assert RunDirectory(tmp_path / "full").best_version().name == "v000003"


def test_early_stopped_run_stays_stopped_on_resume(small_config, tmp_path):
    config = small_config("training.epochs=20", "training.lr=1e-9", "training.relation_lr=1e-9",
                          "evaluation.early_stopping_patience=1")
    mp.train(config, tmp_path / "run", progress=False)
    run = RunDirectory(tmp_path / "run")
    stopped_at = run.latest_version().name
    mp.train(mp.api.load_run_config(tmp_path / "run"), tmp_path / "run", progress=False, resume=True)
    assert run.latest_version().name == stopped_at


def test_divergence_is_reported(small_config, tmp_path):
    config = small_config("model.init_scale=1e30", "training.epochs=1")
    with pytest.raises(mp.MariusInputError, match="diverged"):
        mp.train(config, tmp_path / "run", progress=False)


def test_checkpoint_of_another_dataset_is_refused(small_config, tmp_path, umls_dataset):
    from marius_py.preprocess import PreprocessOptions, preprocess
    from conftest import UMLS_RAW
    mp.train(small_config("training.epochs=1"), tmp_path / "run", progress=False)
    reshuffled = tmp_path / "umls-seed1"
    preprocess(reshuffled, UMLS_RAW / "train.txt", UMLS_RAW / "valid.txt", UMLS_RAW / "test.txt",
               PreprocessOptions(seed=1), progress=False)
    with pytest.raises(mp.MariusInputError, match="different model or dataset"):
        mp.load_checkpoint(tmp_path / "run", overrides=[f"dataset.path={reshuffled}"])


def test_a_run_imports_no_torch_compile_machinery(umls_dataset, tmp_path):
    """torch._dynamo and torch._inductor cost seconds of start-up and the engine never compiles: a whole run
    (training on the CPU with deterministic algorithms, evaluation, restored settings) imports neither."""
    code = ("import sys, marius_py as mp; from marius_py.config_loading import load_config; "
            f"mp.train(load_config(None, ['dataset.path={umls_dataset}', 'training.device=cpu', 'model.dim=8', "
            f"'training.epochs=1', 'evaluation.every=1']), {str(tmp_path / 'run')!r}, progress=False); "
            "print(sorted(m for m in ('torch._dynamo', 'torch._inductor') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip().splitlines()[-1] == "[]"
