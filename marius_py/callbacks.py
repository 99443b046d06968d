"""Callbacks: research code watching, and stopping, a run while it trains (as Keras' and Lightning's do).

A callback has hooks the trainer calls with small values: a read-only ``RunView`` of the run (its directory,
epochs done, best validation so far) and the record, metrics or version that the hook is about; never the
trainer. Subclass ``Callback`` and override the hooks you need (the others do nothing)::

    import marius_py as mp
    from marius_py.callbacks import Callback, Stop

    class StopAtMrr(Callback):
        def on_validation(self, run, metrics):
            if metrics["mrr"] >= 0.5:
                return Stop(f"valid MRR {metrics['mrr']:.3f} reached 0.5")

    model = mp.train(config, "runs/demo", callbacks=[StopAtMrr()])

A hook that returns ``Stop(reason)`` ends training cleanly at the end of the running epoch: the epoch is
committed, a ``{"event": "stop", ...}`` record names the reason in metrics.jsonl, and ``train()`` returns the
best model with its test metrics, as early stopping does. The stop is not kept in the checkpoint: ``--resume``
trains on. A hook that raises ends training with one ``MariusInputError`` naming the callback, the hook and
where it raised; what was committed stays committed.

The metrics log (metrics.jsonl) and TensorBoard (``training.tensorboard``) are callbacks too. Callbacks are
registered by name in ``CALLBACKS`` for a config to name them (``training.callbacks=name,other``)::

    CALLBACKS.register("stop_at_mrr", StopAtMrr)   # a class, or any function of no arguments making one

Objects with ``log(record)`` and ``close()`` (trackers, as PyKEEN's) are taken as callbacks too: ``log``
receives every metrics record and ``close`` is called at the end.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from marius_py.errors import MariusInputError
from marius_py.registry import Registry
from marius_py.trackers import TensorBoard


@dataclass(frozen=True)
class RunView:
    """What a hook may know of the run, as it stands when the hook is called."""

    run_dir: Path
    epoch: int                  # epochs completed
    epochs: int                 # training.epochs
    best_epoch: int | None      # the epoch of the best validation MRR so far (None: none counted yet)
    best_mrr: float | None
    stop_reason: str | None     # why training is stopping (a hook's Stop), None otherwise


@dataclass(frozen=True)
class Stop:
    """What a hook returns to end training cleanly after the running epoch; ``reason`` goes to metrics.jsonl."""

    reason: str


class Callback(Protocol):
    """The hooks of a callback, in the order a run calls them. Each receives the ``RunView`` and may return
    ``Stop(reason)``; anything else it returns but None is refused. Subclass it: its hooks do nothing."""

    def on_train_start(self, run: RunView) -> Stop | None:
        """Before the first epoch this process trains (a resumed run: ``run.epoch`` epochs already done)."""

    def on_record(self, run: RunView, record: dict) -> Stop | None:
        """Every metrics record, as it is written to metrics.jsonl: the plan, the start-up times, each epoch,
        each evaluation (validation and test), a stop."""

    def on_validation(self, run: RunView, metrics: dict) -> Stop | None:
        """After each validation, with its metrics (``metrics["mrr"]``, ``"hits@10"``, ...; also a record)."""

    def on_checkpoint(self, run: RunView, version: Path, epoch: int) -> Stop | None:
        """After each committed version: its directory and the epochs it holds whole. Out of core, versions
        committed between buffer states (``training.checkpoint_interval``) hold part of the next epoch
        too: their name says how much (``v000003.s000002``: 2 buffer states of epoch 4). A version written
        behind training (``training.commits_behind``) is reported once committed, during a later epoch:
        after its own epoch's ``on_epoch_end``, with the run as it stands then."""

    def on_epoch_end(self, run: RunView, record: dict) -> Stop | None:
        """After each epoch is validated (on schedule), committed when due (or, behind training, its commit
        begun) and logged, with its record."""

    def on_train_end(self, run: RunView) -> None:
        """Once training ends, whatever ended it: the last epoch, a stop, or an error (which then follows).
        The test metrics of a finished run come before it, through ``on_record``."""


HOOKS = ("on_train_start", "on_record", "on_validation", "on_checkpoint", "on_epoch_end", "on_train_end")


class TrackerCallback(Callback):
    """A tracker (``log(record)`` and ``close()``) as a callback."""

    def __init__(self, tracker):
        self.tracker = tracker

    def on_record(self, run: RunView, record: dict) -> None:
        self.tracker.log(record)

    def on_train_end(self, run: RunView) -> None:
        self.tracker.close()


def _check_factory(name: str, factory) -> None:
    if not callable(factory):
        raise MariusInputError(f"callback {name!r} is a {type(factory).__name__}",
                               expected="a Callback class, or a function of no arguments that returns a callback")


CALLBACKS: Registry = Registry("callback", "marius_py.callbacks.CALLBACKS", check=_check_factory)
CALLBACKS.register("tensorboard", TensorBoard)


def callback_names(setting: str) -> list[str]:
    """The names of ``training.callbacks`` (comma-separated)."""
    return [name.strip() for name in setting.split(",") if name.strip()]


def configured_callbacks(names: str, tensorboard: bool) -> list:
    """The callbacks a config names (``training.callbacks``; ``training.tensorboard`` adds ``tensorboard``),
    each made by its registered factory."""
    chosen = callback_names(names)
    if tensorboard and "tensorboard" not in chosen:
        chosen.append("tensorboard")
    factories = [CALLBACKS.get(name, "training.callbacks") for name in chosen]  # (every name known first)
    return [_made(name, factory) for name, factory in zip(chosen, factories)]


def _made(name: str, factory):
    try:
        made = factory()
    except MariusInputError:
        raise  # (already says what is wrong: tensorboard's missing package)
    except Exception as error:
        raise _failure(f"callback {name!r} (training.callbacks)", "its creation", error) from error
    return as_callback(made, f"training.callbacks: what {name!r} made")


EXPECTED = ("callbacks (subclasses of marius_py.callbacks.Callback) or trackers (objects with log(record) and "
            "close() methods)")


def as_callbacks(items, argument: str) -> list:
    """``items`` (a list, given as ``argument``) as callbacks (``as_callback``)."""
    if isinstance(items, (str, bytes, dict)) or not isinstance(items, Iterable):
        raise MariusInputError(f"{argument} is a {type(items).__name__}", expected=f"a list of {EXPECTED}")
    return [as_callback(item, f"{argument}[{index}]") for index, item in enumerate(items)]


def as_callback(item, where: str):
    """``item`` as a callback: an object with hooks as it is, a tracker wrapped (``where``: what errors name)."""
    if any(callable(getattr(item, hook, None)) for hook in HOOKS):
        return item
    if callable(getattr(item, "log", None)) and callable(getattr(item, "close", None)):
        return TrackerCallback(item)
    raise MariusInputError(f"{where}, a {type(item).__name__}, lacks log() or close() and has no hook "
                           f"({', '.join(HOOKS)})", expected=f"one of the {EXPECTED}")


class CallbackList:
    """The run's callbacks, called in order, each hook of each guarded; ``view`` makes the ``RunView`` a hook
    sees. ``stop``: the first stop a hook asked for (its reason and who asked), None while none did."""

    def __init__(self, callbacks: list, view: Callable[[str | None], RunView]):
        self.callbacks = callbacks
        self._view = view
        self.stop: dict | None = None
        self._started = False

    def start(self) -> None:
        self._started = True
        self._call("on_train_start")

    def record(self, record: dict) -> None:
        self._call("on_record", record)

    def validation(self, metrics: dict) -> None:
        self._call("on_validation", metrics)

    def checkpoint(self, version: Path, epoch: int) -> None:
        self._call("on_checkpoint", version, epoch)

    def epoch_end(self, record: dict) -> None:
        self._call("on_epoch_end", record)

    def end(self) -> None:
        """``on_train_end`` of every callback, once, if training started; the first failure is raised after all
        have run (each releases what it holds)."""
        if not self._started:
            return
        self._started = False
        failures = []
        for callback in self.callbacks:
            try:
                self._call_one(callback, "on_train_end")
            except MariusInputError as failure:
                failures.append(failure)
        if failures:
            raise failures[0]

    def stop_record(self, epoch: int) -> dict:
        return {"event": "stop", "epoch": epoch, **self.stop}

    def _call(self, hook: str, *values) -> None:
        for callback in self.callbacks:
            self._call_one(callback, hook, *values)

    def _call_one(self, callback, hook: str, *values) -> None:
        method = getattr(callback, hook, None)
        if method is None:
            return
        reason = self.stop["reason"] if self.stop else None
        try:
            answer = method(self._view(reason), *values)
        except Exception as error:
            raise _failure(f"callback {_name(callback)}", hook, error) from error
        if isinstance(answer, Stop):
            if self.stop is None:
                self.stop = {"reason": str(answer.reason), "callback": _name(callback), "hook": hook}
        elif answer is not None:
            raise MariusInputError(f"callback {_name(callback)}: {hook} returned {answer!r}",
                                   expected="None, or marius_py.callbacks.Stop(reason) to stop training")


def _name(callback) -> str:
    return type(callback.tracker if isinstance(callback, TrackerCallback) else callback).__name__


def _failure(who: str, hook: str, error: Exception) -> MariusInputError:
    """One error naming the callback, the hook and where it raised (the traceback's last frame)."""
    frames = traceback.extract_tb(error.__traceback__)
    where = f" ({frames[-1].filename}:{frames[-1].lineno}, in {frames[-1].name})" if frames else ""
    return MariusInputError(f"{who} raised in {hook}: {type(error).__name__}: {error}{where}")
