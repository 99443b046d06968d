"""``marius-py tune``: an Optuna search on UMLS (tiny trials on the CPU): it finds a planted better setting
whose best.yaml trains again to the same validation MRR, prunes bad trials early, resumes a killed search
without running a finished trial again, runs trials on several devices at once, and refuses bad input (a
bad space file, a missing Optuna) with one clear error, writing nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest

import marius_py as mp
from marius_py.checkpoint import CHECKPOINTS, LIVE_STORE, RunDirectory
from marius_py.cli import main
from marius_py.search import STUDY_NAME, own_gpu, trial_run_dir

STATE = optuna.trial.TrialState
FAST = ["training.device=cpu", "model.dim=16", "training.batch_size=2048", "training.num_negatives=64",
        "evaluation.every=1"]
LR_SPACE = "training.lr: {low: 1.0e-6, high: 0.5, log: true}\n"


def study_of(run_dir: Path):
    return optuna.load_study(study_name=STUDY_NAME, storage=f"sqlite:///{run_dir / 'study.db'}")


def write_space(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "space.yaml"
    path.write_text(text)
    return path


def tune_command(dataset: Path, space: Path, run_dir: Path, *options: str) -> list[str]:
    return ["tune", f"dataset.path={dataset}", *FAST, "--space", str(space), "--run-dir", str(run_dir), "--quiet",
            *options]


def epochs_trained(run_dir: Path) -> int:
    return sum(record.get("event") == "epoch" for record in RunDirectory(run_dir).read_metrics())


def validations(run_dir: Path) -> list[int]:
    """The epochs a run validated at."""
    return [r["epoch"] for r in RunDirectory(run_dir).read_metrics() if r.get("split") == "valid"]


def test_search_finds_a_planted_setting_whose_best_yaml_trains_again(umls_dataset, tmp_path, capsys):
    """The base config's learning rate (1e-6) barely trains; the space holds far better ones."""
    run = tmp_path / "search"
    space = write_space(tmp_path, LR_SPACE + "model.dim: [8, 16]\n")
    assert main(tune_command(umls_dataset, space, run, "--trials", "4", "--pruner", "none",
                             "training.lr=0.000001", "training.epochs=3")) == 0
    summary = capsys.readouterr().out
    study = study_of(run)
    trials = study.trials
    assert [t.state for t in trials] == [STATE.COMPLETE] * 4
    baseline = trials[0]
    assert baseline.params == {"training.lr": 1e-6, "model.dim": 16} and baseline.user_attrs["baseline"]
    best = study.best_trial
    assert best.params["training.lr"] > 1e-3 and best.value > baseline.value + 0.2
    assert f"best: trial {best.number}, valid MRR {best.value:.4f}" in summary
    for trial in trials:  # every trial trained the epochs of the base config, on its own values
        trial_dir = trial_run_dir(run, trial.number)
        assert epochs_trained(trial_dir) == 3 and not (trial_dir / CHECKPOINTS).exists()
        assert mp.make_config(trial_dir / "config.yaml").training.lr == trial.params["training.lr"]
        assert not any(r.get("split") == "test" for r in RunDirectory(trial_dir).read_metrics())  # valid only

    best_yaml = run / "best.yaml"
    config = mp.make_config(best_yaml)
    assert (config.training.lr, config.model.dim) == (best.params["training.lr"], best.params["model.dim"])
    assert config.training.epochs == 3 and config.dataset.path == str(umls_dataset)
    again = tmp_path / "again"
    assert main(["train", str(best_yaml), "--run-dir", str(again), "--quiet"]) == 0
    assert "test: MRR" in capsys.readouterr().out
    assert main(["eval", str(again), "--split", "valid", "--json"]) == 0
    metrics = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert metrics["mrr"] == pytest.approx(best.value, abs=1e-6)  # (CPU training replays exactly)


def test_pruning_stops_bad_trials_at_an_early_validation(umls_dataset, tmp_path):
    """The base learning rate (0.1) learns fast; the space's others are lower, down to nothing."""
    run = tmp_path / "search"
    space = write_space(tmp_path, "training.lr: {low: 1.0e-7, high: 0.1, log: true}\n")
    assert main(tune_command(umls_dataset, space, run, "--trials", "6", "--pruner", "halving",
                             "training.lr=0.1", "training.epochs=4")) == 0
    trials = study_of(run).trials
    pruned = [t for t in trials if t.state == STATE.PRUNED]
    assert pruned and trials[0].state == STATE.COMPLETE
    for trial in pruned:
        step = trial.last_step
        assert 2 <= step < 4 and validations(trial_run_dir(run, trial.number))[-1] == step  # (from half on)
        rivals = [t.intermediate_values[step] for t in trials if t is not trial and step in t.intermediate_values]
        assert trial.intermediate_values[step] < max(rivals)
    assert all(epochs_trained(trial_run_dir(run, t.number)) == 4 for t in trials if t.state == STATE.COMPLETE)


def test_a_killed_search_resumes_without_repeating_finished_trials(umls_dataset, tmp_path):
    run = tmp_path / "search"
    space = write_space(tmp_path, LR_SPACE)
    command = tune_command(umls_dataset, space, run, "--trials", "4", "--pruner", "none", "training.epochs=6")
    process = subprocess.Popen([sys.executable, "-m", "marius_py", *command], env=dict(os.environ),
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        finished, running = wait_for_a_trial_in_training(run, process)
    finally:
        process.kill()
        process.wait()
    killed_seconds = study_of(run).user_attrs["wall_seconds"]  # (kept as trials finished, before the kill)
    assert killed_seconds > 0
    assert main(["tune", "--resume", str(run), "--quiet"]) == 0
    resumed = study_of(run).user_attrs
    assert resumed["session"]["before"] == killed_seconds < resumed["wall_seconds"]  # (both sessions counted)

    trials = study_of(run).trials
    for before in finished:  # as they were: not run again
        after = trials[before.number]
        assert (after.state, after.value, after.params, after.datetime_complete) == (
            before.state, before.value, before.params, before.datetime_complete)
    for number, params in running:  # failed, and run again as a new trial with the same values
        assert trials[number].state == STATE.FAIL
        retry = [t for t in trials if t.user_attrs.get("retry_of") == number]
        assert len(retry) == 1 and retry[0].params == params and retry[0].state == STATE.COMPLETE
        assert not (trial_run_dir(run, number) / LIVE_STORE).exists()
    assert sum(t.state == STATE.COMPLETE for t in trials) == 4 and len(trials) == 4 + len(running)
    assert len({t.params["training.lr"] for t in trials if t.state == STATE.COMPLETE}) == 4


def wait_for_a_trial_in_training(run: Path, process: subprocess.Popen, timeout: float = 300):
    """(finished trials, [(number, params)] of running ones) once a trial runs whose first epoch is logged,
    after at least one finished."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert process.poll() is None, process.stderr.read().decode()
        if (run / "trials").is_dir():  # (the study is created: reading it while it is would race its creation)
            trials = study_of(run).trials
            finished = [t for t in trials if t.state.is_finished()]
            running = [(t.number, t.params) for t in trials if t.state == STATE.RUNNING]
            if finished and running and epochs_trained(trial_run_dir(run, running[0][0])) >= 1:
                return finished, running
        time.sleep(0.05)
    raise AssertionError("no trial was caught training")


def test_trials_run_at_once_one_per_device(umls_dataset, tmp_path):
    """Two worker processes (cpu,cpu stands in for two GPUs) share the study: exactly the trials asked for,
    each trained by one of them. (Whether two train at the same time depends on how fast the second starts;
    on a loaded machine the first may finish them all.)"""
    run = tmp_path / "search"
    space = write_space(tmp_path, LR_SPACE)
    assert main(tune_command(umls_dataset, space, run, "--trials", "4", "--pruner", "none", "--devices",
                             "cpu,cpu", "training.epochs=4")) == 0
    trials = study_of(run).trials
    assert [t.state for t in trials] == [STATE.COMPLETE] * 4
    assert {t.user_attrs["worker"] for t in trials} <= {0, 1}


@pytest.mark.parametrize("visible, device, sees", [(None, "cuda:1", "1"), ("4,6", "cuda:1", "6"),
                                                   ("4, 6", "cuda", "4")])
def test_a_worker_sees_its_gpu_alone(monkeypatch, visible, device, sees):
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    trains_on = own_gpu(device)
    assert trains_on == "cuda" and os.environ["CUDA_VISIBLE_DEVICES"] == sees
    assert mp.make_config(None, [f"training.device={trains_on}"]).training.device == "cuda"  # (a valid value)
    assert own_gpu("cpu") == "cpu" and own_gpu(None) is None


def test_without_optuna_tune_names_the_install_command(umls_dataset, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "optuna", None)  # (import optuna raises ImportError)
    run = tmp_path / "search"
    space = write_space(tmp_path, LR_SPACE)
    assert main(tune_command(umls_dataset, space, run, "--trials", "2")) == 2
    error = capsys.readouterr().err
    assert "needs Optuna" in error and "pip install 'marius-py[tune]'" in error and "Traceback" not in error
    assert not run.exists()
    with pytest.raises(mp.MariusInputError, match=r"marius-py\[tune\]"):
        mp.tune(mp.make_config(None, [f"dataset.path={umls_dataset}"]), {"training.lr": [0.1]}, 2, run)


@pytest.mark.parametrize("text, line, problem", [
    ("training.lr: {low: 0.1, high: 0.01}\n", 1, "low 0.1 is not below high 0.01"),
    ("# a comment\ntraining.lr: [0.1]\nmodel.dmi: [8]\n", 3, "unknown config key 'model.dmi'"),
    ("model.dim: 16\n", 1, "neither a range nor choices"),
    ("model.dim: {low: 8, high: 32.5}\n", 1, "model.dim: expected int, got 32.5"),
    ("model.dim: {low: 7, high: 32}\n", 1, "model.dim: expected even for complex (complex-valued rows: marius_py.models.ComplEx), got 7"),
    ("model.decoder: {low: 1, high: 2}\n", 1, "a range, but the key takes a str"),
    ("model.decoder: [complex, nope]\n", 1, "model.decoder: expected one of"),
    ("training.lr: {low: -1, high: 1}\n", 1, "training.lr: expected > 0, got -1.0"),
    ("training.lr: {low: 0, high: 1, log: true}\n", 1, "a log range needs low > 0"),
    ("training.lr: {low: 0.1, high: 1, lo: 2}\n", 1, "unknown field 'lo'"),
    ("training.lr: [0.1, 0.1]\n", 1, "a choice given twice"),
    ("training.lr: []\n", 1, "choices []"),
    ("training.num_chunks: {low: 1, high: 4096}\n", 1, "training.num_chunks: expected <= training.batch_size"),
    ("- training.lr\n", 1, "a list, not a mapping"),
    ("training.lr: {low: 0.1\n", 2, "not valid YAML"),
    ("\n", None, "search space file is empty"),
])
def test_a_bad_space_file_is_one_error_naming_its_line(umls_dataset, tmp_path, capsys, text, line, problem):
    space = write_space(tmp_path, text)
    run = tmp_path / "search"
    assert main(tune_command(umls_dataset, space, run, "--trials", "2")) == 2
    error = capsys.readouterr().err
    assert error.startswith(f"marius-py: error: {space}" + (f":{line}:" if line else ":")), error
    assert problem in error and "expected" in error and "Traceback" not in error
    assert not run.exists()


@pytest.mark.parametrize("arguments, problem", [
    (["--resume", "{tmp}/nowhere"], "not a search directory"),
    (["--trials", "2"], "tune needs --space"),
    (["--space", "{space}", "--trials", "0"], "trials 0"),
    (["--space", "{space}", "--trials", "2", "--gpus", "1", "--devices", "cpu"], "both --gpus and --devices"),
    (["--space", "{space}", "--trials", "2", "--devices", "cuda:7"], "devices cuda:7: this machine has"),
    (["--resume", "{tmp}", "--space", "{space}"], "no --space"),
])
def test_tune_command_mistakes(umls_dataset, tmp_path, capsys, arguments, problem):
    space = write_space(tmp_path, LR_SPACE)
    arguments = [item.format(tmp=tmp_path, space=space) for item in arguments]
    assert main(["tune", f"dataset.path={umls_dataset}", *arguments] if "--resume" not in arguments
                else ["tune", *arguments]) == 2
    error = capsys.readouterr().err
    assert problem in error and "Traceback" not in error
    assert sorted(p.name for p in tmp_path.iterdir()) == ["space.yaml"]


def test_a_new_search_refuses_a_directory_holding_one(umls_dataset, tmp_path, capsys):
    run = tmp_path / "search"
    space = write_space(tmp_path, "training.lr: [0.1]\n")
    assert main(tune_command(umls_dataset, space, run, "--trials", "1", "training.epochs=1")) == 0
    before = sorted(p.name for p in run.iterdir())
    assert main(tune_command(umls_dataset, space, run, "--trials", "1")) == 2
    assert "holds a search already" in capsys.readouterr().err and sorted(p.name for p in run.iterdir()) == before


def test_a_dataset_without_a_valid_split_is_refused(tmp_path, capsys):
    data, run = tmp_path / "no-valid", tmp_path / "search"
    umls = Path(__file__).parent / "data" / "umls" / "train.txt"
    assert main(["preprocess", "--train", str(umls), "--split", "0,0.1", "-o", str(data), "--quiet"]) == 0
    capsys.readouterr()
    assert main(tune_command(data, write_space(tmp_path, LR_SPACE), run, "--trials", "2")) == 2
    assert "no validation edges" in capsys.readouterr().err and not run.exists()
