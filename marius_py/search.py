"""``marius-py tune``: a hyperparameter search with Optuna (the ``tune`` extra) over any config keys.

A search directory holds:

    study.db     the Optuna study (SQLite, through Optuna's RDB storage): every trial, its values and state
    base.yaml    the config every trial starts from; a trial draws the searched keys on top of it
    space.yaml   the search space (``search_space``)
    trials/NNNN  each trial's run directory (config.yaml, metrics.jsonl; its checkpoints go when it ends)
    best.yaml    the best trial's config, ready for ``marius-py train`` (rewritten when a trial beats it)

Each trial is a real training run (``api.train``), scored on the filtered validation MRR of the model
training returns (its best-validation checkpoint); the test split is never read. The trainer's periodic
validations reach Optuna through a callback (``marius_py.callbacks``), and a trial the pruner gives up on
stops there, after its epoch is committed. The first trial trains the base config itself (the searched keys
whose values the space holds), so the best is never worse than it on validation. Trials run one after
another in this process or, given several devices, one per device in worker processes sharing the study. A
killed search resumes (``resume_tune``): finished trials stay as they are; trials it interrupted are marked
failed and run again as new trials with the same values.
"""

from __future__ import annotations

import gc
import multiprocessing
import os
import shutil
import threading
import time
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from marius_py import api
from marius_py.callbacks import Callback, RunView, Stop
from marius_py.checkpoint import CHECKPOINTS, LIVE_STORE
from marius_py.config import Config, device_list, dump_config
from marius_py.config_loading import load_config, with_overrides
from marius_py.devices import resolve_device
from marius_py.errors import PATH_TYPES, MariusInputError, check_type
from marius_py.run_lock import RunLock
from marius_py.search_space import PRUNERS, SearchSpace, read_space
from marius_py.storage import durable

STUDY_FILE, BASE_FILE, SPACE_FILE, BEST_FILE, TRIALS = "study.db", "base.yaml", "space.yaml", "best.yaml", "trials"
STUDY_NAME = "marius-py"


def require_optuna():
    """The optuna module; its absence is one clear error naming the install command."""
    try:
        import optuna
    except ImportError:
        raise MariusInputError("marius-py tune needs Optuna, which is not installed",
                               expected="pip install 'marius-py[tune]' (or pip install optuna)") from None
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # (the search prints its own line per trial)
    return optuna


@dataclass
class TuneResult:
    """A search's outcome: its directory and the Optuna study (``study.best_params``,
    ``study.trials_dataframe()``); ``best_yaml`` is the best trial's config."""

    run_dir: Path
    study: object

    @property
    def best_yaml(self) -> Path:
        return self.run_dir / BEST_FILE

    def outcomes(self) -> dict[str, int]:
        """How many trials are complete, pruned, failed (an error of their own), interrupted (by a killed
        search; run again as new trials), waiting or running."""
        state = require_optuna().trial.TrialState
        outcomes = [_outcome(state, t) for t in self.study.get_trials(deepcopy=False)]
        return {name: outcomes.count(name) for name in dict.fromkeys(outcomes)}

    def summary(self) -> list[str]:
        """What the command prints at the end: the trials, the best one, how to train it."""
        outcomes = self.outcomes()
        shown = ("complete", "pruned", "failed") + tuple(name for name in ("interrupted", "waiting", "running")
                                                         if name in outcomes)  # (those three only when any)
        counts = ", ".join(f"{outcomes.get(name, 0)} {name}" for name in shown)
        best = self.study.best_trial
        return [f"search directory: {self.run_dir}: {sum(outcomes.values())} trials ({counts}) in "
                f"{self.study.user_attrs.get('wall_seconds', 0):.0f} s",
                f"best: trial {best.number}, valid MRR {best.value:.4f}, trained in "
                f"{best.user_attrs.get('seconds', 0):.0f} s: {' '.join(_overrides(best.params))}",
                f"train it: marius-py train {self.best_yaml}"]


def tune(config: Config, space: str | Path | Mapping, trials: int, run_dir: str | Path | None = None,
         pruner: str = "median", devices: list[str] | None = None, progress: bool = True) -> TuneResult:
    """Search ``space`` (a YAML file, a bundled space's name or a mapping) around ``config`` for ``trials``
    trials, pruning with ``pruner`` (one of ``PRUNERS``), into a new search directory ``run_dir`` (default
    runs/tune-<dataset>-<time>). ``devices`` (e.g. ["cuda:0", "cuda:1"]) run one trial on each at once.
    Everything is checked before the directory is made; ``progress`` prints a line per validation and trial.
    Sets Optuna's logging to warnings (process-wide)."""
    optuna = require_optuna()
    check_type(config, Config, "tune: config", "a Config: mp.make_config(...)")
    check_type(space, (*PATH_TYPES, Mapping), "tune: space", "a YAML file's path, a bundled space's name or a mapping "
                                                            "of config keys to ranges or choices")
    if run_dir is not None:
        check_type(run_dir, PATH_TYPES, "tune: run_dir", "a search directory's path, a str or pathlib.Path")
    check_type(pruner, str, "tune: pruner", f"one of {', '.join(PRUNERS)}")
    _check_trials(trials)
    if pruner not in PRUNERS:
        raise MariusInputError(f"pruner {pruner!r}", expected=f"one of {', '.join(PRUNERS)}")
    devices = _check_devices(config, devices)
    space = read_space(space)
    space.check(config)
    _check_valid_split(config, progress)
    run_dir = Path(run_dir) if run_dir is not None else _default_run_dir(config)
    _check_new(run_dir)
    created = not run_dir.exists()
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise MariusInputError(f"cannot create the search directory ({error.strerror})", path=run_dir,
                               expected="a --run-dir where this user can create a directory") from None
    lock = RunLock(run_dir)
    try:  # (a full disk while trials train is the trial's run's error, which says to resume)
        with durable.reporting_full_disk(f"creating the search {run_dir}", run_dir):
            lock.acquire()
            _create(optuna, run_dir, config, space, trials, pruner)
    except BaseException:
        lock.release()
        _discard(run_dir, created)
        raise
    try:
        return _search(run_dir, devices, progress)
    finally:
        lock.release()


def resume_tune(run_dir: str | Path, trials: int | None = None, devices: list[str] | None = None,
                progress: bool = True) -> TuneResult:
    """Continue the search in ``run_dir`` with its own config, space and pruner; ``trials`` sets a new total
    (trials run before count)."""
    optuna = require_optuna()
    check_type(run_dir, PATH_TYPES, "resume_tune: run_dir", "a search directory's path, a str or pathlib.Path")
    run_dir = Path(run_dir)
    if not (run_dir / STUDY_FILE).is_file():
        raise MariusInputError(f"not a search directory (no {STUDY_FILE})", path=run_dir,
                               expected="a directory written by `marius-py tune`")
    devices = _check_devices(load_config(run_dir / BASE_FILE), devices)
    with RunLock(run_dir):
        with durable.reporting_full_disk(f"resuming the search {run_dir}", run_dir):
            study = optuna.load_study(study_name=STUDY_NAME, storage=_storage(optuna, run_dir))
            if trials is not None:
                _check_trials(trials)
                study.set_user_attr("trials", trials)
            _recover_interrupted(optuna, study, run_dir)
        return _search(run_dir, devices, progress)


def _check_trials(trials) -> None:
    if isinstance(trials, bool) or not isinstance(trials, int) or trials < 1:
        raise MariusInputError(f"trials {trials!r}", expected="a whole number of trials >= 1 (--trials N)")


def _check_devices(config: Config, devices) -> list[str]:
    """The search's devices (one trial on each at once; a list, or a comma-separated string), each present on
    this machine; [] for none."""
    if isinstance(devices, str):
        devices = device_list(devices)
    if not devices:
        return []
    for name in devices:
        resolve_device(name, "devices")
    if device_list(config.training.devices):
        raise MariusInputError(f"the search runs one trial on each of {', '.join(devices)}, and the config trains "
                               f"each run on several devices (training.devices={config.training.devices})",
                               expected="devices for the search (--gpus, --devices) or training.devices, not both")
    return list(devices)


def _check_valid_split(config: Config, progress: bool) -> None:
    """Trials are scored on the validation split: the dataset must have one (prepared once, here)."""
    dataset = api.open_dataset(config, progress)
    dataset.close()
    if dataset.metadata.num_valid == 0:
        raise MariusInputError("the dataset has no validation edges, on which tune scores its trials",
                               path=dataset.directory, expected="a dataset with a valid split (marius-py "
                                                                "preprocess --valid FILE, or --split)")


def _default_run_dir(config: Config) -> Path:
    run_dir = api.default_run_dir(config)
    return run_dir.with_name(f"tune-{run_dir.name}")


def _check_new(run_dir: Path) -> None:
    if run_dir.exists() and not run_dir.is_dir():
        raise MariusInputError("exists and is not a directory", path=run_dir, expected="--run-dir naming a new "
                                                                                       "or empty directory")
    if (run_dir / STUDY_FILE).exists():
        raise MariusInputError("holds a search already", path=run_dir,
                               expected="--resume to continue it, or a new --run-dir")
    if run_dir.is_dir() and any(run_dir.iterdir()):
        raise MariusInputError("is not empty", path=run_dir, expected="--run-dir naming a new or empty directory")


def _create(optuna, run_dir: Path, config: Config, space: SearchSpace, trials: int, pruner: str) -> None:
    """The search directory's files and study (its settings as user attributes), with the base config's
    values queued as the first trial."""
    durable.write_text_atomic(run_dir / BASE_FILE, dump_config(config))
    durable.write_text_atomic(run_dir / SPACE_FILE, space.text)
    study = optuna.create_study(storage=_storage(optuna, run_dir), study_name=STUDY_NAME, direction="maximize")
    study.set_user_attr("trials", trials)
    study.set_user_attr("pruner", pruner)
    baseline = space.base_params(config)
    if baseline:
        study.enqueue_trial(baseline, user_attrs={"baseline": True})


def _discard(run_dir: Path, created: bool) -> None:
    """Remove what a search that failed while being created wrote (the directory, when it made it)."""
    if created:
        shutil.rmtree(run_dir, ignore_errors=True)
        return
    for name in (STUDY_FILE, BASE_FILE, SPACE_FILE):
        (run_dir / name).unlink(missing_ok=True)


def _storage(optuna, run_dir: Path):
    """The study's SQLite storage; a writer waits up to a minute for another (trials on several devices)."""
    return optuna.storages.RDBStorage(f"sqlite:///{(run_dir / STUDY_FILE).resolve()}",
                                      engine_kwargs={"connect_args": {"timeout": 60}})


def _recover_interrupted(optuna, study, run_dir: Path) -> None:
    """Trials a killed search left running: refused while a process still trains one (its run directory is
    locked), else marked failed and their values queued to run again as new trials."""
    for trial in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        trial_dir = trial_run_dir(run_dir, trial.number)
        if trial_dir.is_dir():
            with RunLock(trial_dir):  # (refused, naming the process, while one trains there)
                _drop_tables(trial_dir)
        study.tell(trial.number, state=optuna.trial.TrialState.FAIL)
        study.enqueue_trial(trial.params, user_attrs={"retry_of": trial.number})


def trial_run_dir(run_dir: Path, number: int) -> Path:
    return run_dir / TRIALS / f"{number:04d}"


def _drop_tables(trial_dir: Path) -> None:
    """A finished trial's checkpoints and live store (a search's trials would fill the disk): best.yaml
    trains the best one again."""
    for name in (CHECKPOINTS, LIVE_STORE):
        shutil.rmtree(trial_dir / name, ignore_errors=True)


def _search(run_dir: Path, devices: list[str], progress: bool) -> TuneResult:
    """Run trials until the study holds its total, then the result (an error when no trial completed)."""
    optuna = require_optuna()
    _start_session(optuna.load_study(study_name=STUDY_NAME, storage=_storage(optuna, run_dir)))
    if len(devices) > 1 or any(device.startswith("cuda") for device in devices):  # (a GPU: its own process,
        _run_workers(run_dir, devices, progress)                                  # which sees that GPU alone)
    else:
        _work(run_dir, devices[0] if devices else None, 0, threading.Lock(), progress)
    study = optuna.load_study(study_name=STUDY_NAME, storage=_storage(optuna, run_dir))
    _count_time(study)
    if not study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)):
        errors = [t.user_attrs["error"] for t in study.trials if "error" in t.user_attrs]
        raise MariusInputError("no trial of the search completed" + (f"; the first error: {errors[0]}" if errors
                                                                      else " (all were pruned)"), path=run_dir,
                               expected="a search space whose trials train")
    return TuneResult(run_dir, study)


def _start_session(study) -> None:
    """Count the search's time from now on, on top of its earlier sessions'."""
    study.set_user_attr("session", {"started": time.time(), "before": study.user_attrs.get("wall_seconds", 0.0)})


def _count_time(study) -> None:
    """The search's wall time so far, kept in the study as trials finish: a session a kill cuts short counts
    up to its last finished trial."""
    session = study.user_attrs.get("session")
    if session is not None:
        study.set_user_attr("wall_seconds", session["before"] + time.time() - session["started"])


def _run_workers(run_dir: Path, devices: list[str], progress: bool) -> None:
    """A worker process per device, each running trials on its own until the study holds its total."""
    context = multiprocessing.get_context("spawn")  # (CUDA in a forked child fails)
    lock = context.Lock()  # (counting the trials and asking for one happen together)
    workers = [context.Process(target=_work, args=(run_dir, device, index, lock, progress, os.getpid()),
                               name=f"marius-py tune {device}") for index, device in enumerate(devices)]
    for worker in workers:
        worker.start()
    try:
        for worker in workers:
            worker.join()
    finally:
        for worker in workers:  # (interrupted: their trials stay running; a resume runs them again)
            if worker.is_alive():
                worker.terminate()
                worker.join()
    failed = [worker.name for worker in workers if worker.exitcode]
    if failed:
        raise RuntimeError(f"{', '.join(failed)} stopped with an error (above); `marius-py tune --resume "
                           f"{run_dir}` runs its trial again")


def _work(run_dir: Path, device: str | None, worker: int, lock, progress: bool, parent: int | None = None) -> None:
    """Trials one after another on ``device`` (None: the config's) until the study holds its total (or the
    process that started this worker is gone)."""
    if parent is not None:
        device = own_gpu(device)
    search = _Search(run_dir, worker, lock, progress)
    while parent is None or os.getppid() == parent:
        with lock:
            if search.done():
                return
            trial = search.study.ask()
        search.run(trial, device)


def own_gpu(device: str | None) -> str | None:
    """In a worker process, before CUDA starts: its GPU made the only one it sees (CUDA_VISIBLE_DEVICES), so
    nothing a trial runs touches another worker's; the device to train on then (``cuda``: that GPU, as
    ``training.device`` names it)."""
    if device is None or not device.startswith("cuda"):
        return device
    index = torch.device(device).index or 0
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").strip()
    os.environ["CUDA_VISIBLE_DEVICES"] = visible.split(",")[index].strip() if visible else str(index)
    return "cuda"


class _Search:
    """A worker's view of a search directory: its base config, space and study."""

    def __init__(self, run_dir: Path, worker: int, lock, progress: bool):
        self.optuna = optuna = require_optuna()
        self.run_dir, self.lock, self.progress, self.worker = run_dir, lock, progress, worker
        self.base = load_config(run_dir / BASE_FILE)
        self.space = read_space(run_dir / SPACE_FILE)
        storage = _storage(optuna, run_dir)
        summary = next(s for s in optuna.get_all_study_summaries(storage, include_best_trial=False)
                       if s.study_name == STUDY_NAME)
        # Seeded by the trials so far and the worker: a resumed search or a second worker draws anew.
        seed = int(np.random.SeedSequence([self.base.training.seed, summary.n_trials, worker]).generate_state(1)[0])
        with warnings.catch_warnings():  # (constant_liar, which keeps workers from drawing alike, was
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)  # experimental before 5.0)
            sampler = optuna.samplers.TPESampler(seed=seed, constant_liar=True)
        self.study = optuna.load_study(study_name=STUDY_NAME, storage=storage, sampler=sampler,
                                       pruner=_pruner(optuna, summary.user_attrs["pruner"]))
        self.total = summary.user_attrs["trials"]

    def done(self) -> bool:
        """Whether the study holds its total: trials finished, failed by an error of their own, or running
        (trials a killed search interrupted count once, when run again)."""
        state = self.optuna.trial.TrialState
        outcomes = [_outcome(state, t) for t in self.study.get_trials(deepcopy=False)]
        return sum(name in ("complete", "pruned", "failed", "running") for name in outcomes) >= self.total

    def run(self, trial, device: str | None) -> None:
        """Train one trial, report it to the study and, when it is the best, write best.yaml."""
        state = self.optuna.trial.TrialState
        trial_dir = trial_run_dir(self.run_dir, trial.number)
        started = time.perf_counter()
        outcome, value = state.COMPLETE, None
        try:
            value = self._score(trial, trial_dir, device)
        except self.optuna.TrialPruned:
            outcome = state.PRUNED
        except (MariusInputError, torch.cuda.OutOfMemoryError) as error:  # (a diverged or oversized trial)
            outcome = state.FAIL
            trial.set_user_attr("error", str(error))
        finally:
            _drop_tables(trial_dir)
            gc.collect()  # (the trial's tables, on the GPU too, go before the next trial's come)
        trial.set_user_attr("seconds", time.perf_counter() - started)
        trial.set_user_attr("worker", self.worker)  # (which device of the search's list trained it)
        with self.lock:
            finished = self.study.tell(trial, value, state=outcome)
            _count_time(self.study)
            if outcome == state.COMPLETE and self.study.best_trial.number == trial.number:
                self._write_best(finished)
        self._say(_trial_line(state, finished))

    def _score(self, trial, trial_dir: Path, device: str | None) -> float:
        """Train the trial on the values it draws: the validation MRR of the model training returns."""
        overrides = _overrides(self.space.suggest(trial)) + _device_overrides(device)
        config = with_overrides(self.base, overrides, f"trial {trial.number}")
        reporter = _Reporter(trial, self._say, config.training.epochs)
        model = api.train(config, trial_dir, progress=False, test=False, callbacks=[reporter])
        if reporter.pruned:
            raise self.optuna.TrialPruned(reporter.pruned)
        return model.evaluate("valid")["mrr"]

    def _write_best(self, trial) -> None:
        overrides = _overrides(trial.params)
        path = self.run_dir / BEST_FILE
        header = (f"# marius-py tune: trial {trial.number} of {self.run_dir}, validation MRR {trial.value:.4f}, "
                  "the base config with\n" + "".join(f"#   {item}\n" for item in overrides)
                  + f"# Train it: marius-py train {path}\n")
        durable.write_text_atomic(path, header + dump_config(with_overrides(self.base, overrides, path)))

    def _say(self, text: str) -> None:
        if self.progress:
            print(text, flush=True)


class _Reporter(Callback):
    """A trial's callback: reports every validation MRR to Optuna at its epoch and stops the run where the
    pruner gives the trial up (``pruned`` then says where), from half its epochs on: a lower learning rate
    starts slower and may end higher (on FB15k-237 the median pruner stopped at epoch 10 a trial like the
    best)."""

    def __init__(self, trial, say, epochs: int):
        self.trial, self.say, self.first_prunable_epoch = trial, say, epochs // 2
        self.pruned: str | None = None

    def on_validation(self, run: RunView, metrics: dict) -> Stop | None:
        epoch = run.epoch
        self.trial.report(metrics["mrr"], epoch)
        self.say(f"trial {self.trial.number}, epoch {epoch}: valid MRR {metrics['mrr']:.4f}")
        if epoch >= self.first_prunable_epoch and self.trial.should_prune():
            self.pruned = f"pruned at epoch {epoch}"
            return Stop(f"{self.pruned} by Optuna's pruner")
        return None


def _pruner(optuna, name: str):
    """median: below the median of earlier trials at the same epoch (after 5 trials); halving: successive
    halving (asynchronous, keeping the best quarter at each rung); none."""
    return {"median": optuna.pruners.MedianPruner, "halving": optuna.pruners.SuccessiveHalvingPruner,
            "none": optuna.pruners.NopPruner}[name]()


def _overrides(params: Mapping) -> list[str]:
    return [f"{key}={value}" for key, value in params.items()]


def _device_overrides(device: str | None) -> list[str]:
    return [f"training.device={device}", "training.devices="] if device else []


def _outcome(state, trial) -> str:
    """complete, pruned, failed (an error of its own), interrupted (by a killed search), running or waiting."""
    if trial.state == state.FAIL:
        return "failed" if "error" in trial.user_attrs else "interrupted"
    return {state.COMPLETE: "complete", state.PRUNED: "pruned", state.RUNNING: "running"}.get(trial.state, "waiting")


def _trial_line(state, trial) -> str:
    """The line a finished trial prints."""
    seconds = f"{trial.user_attrs.get('seconds', 0):.0f} s"
    outcome = {"complete": f"valid MRR {trial.value or 0:.4f} in {seconds}",
               "pruned": f"pruned at epoch {trial.last_step} in {seconds}",
               "failed": f"failed in {seconds}: {trial.user_attrs.get('error')}"}[_outcome(state, trial)]
    return f"trial {trial.number}: {outcome} ({' '.join(_overrides(trial.params))})"
