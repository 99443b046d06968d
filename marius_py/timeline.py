"""Where time goes: a command's start-up until its first batch (``Startup``), an epoch's phases
(``EpochPhases``), and an out-of-core epoch buffer state by buffer state (``StateTimeline``); all go
into the metrics log, and ``marius-py plot`` draws them.


StateTimeline, for every state: ``wait`` (seconds from the end of the previous state's training to this state's
edges being ready: swap reads not finished yet, commits between states),
``train`` (seconds of its batches, the devices synchronized), its edges, and the partition bytes read
and written meanwhile (write-backs finish asynchronously and count when they finish).
"""

from __future__ import annotations

import time
from collections.abc import Callable

IMPORTED_AT = time.perf_counter()  # (the package imports this module first: before torch's import)


class StateTimeline:
    """Records one epoch's states; ``rows`` goes into the epoch's metrics record."""

    def __init__(self, counters, synchronize: Callable[[], None]):
        self.counters = counters
        self.synchronize = synchronize
        self.rows: list[dict] = []
        self._mark = time.perf_counter()
        self._io = counters.snapshot()
        self._wait = 0.0

    def ready(self) -> None:
        """A state's edges are ready to train."""
        now = time.perf_counter()
        self._wait, self._mark = now - self._mark, now

    def trained(self, edges: int) -> None:
        """The state's batches are done."""
        self.synchronize()
        now, io = time.perf_counter(), self.counters.snapshot()
        self.rows.append({"wait": self._wait, "train": now - self._mark, "edges": edges,
                          "read": io["bytes_read"] - self._io["bytes_read"],
                          "written": io["bytes_written"] - self._io["bytes_written"]})
        self._mark, self._io = now, io


class Startup:
    """Seconds of a command's start-up phases, from the package's import (``IMPORTED_AT``) to the
    first batch queued on the device: imports and config, the dataset, the trainer's model, the dataset's
    buckets for the run (out of core: re-bucketed on first use), its runner (placement and pipeline), its
    tables (initialised, or restored from a checkpoint) and the rest of its set-up (``trainer_other``),
    then the first epoch until its first batch (edge preparation, kernel compiles, CUDA-graph capture)."""

    def __init__(self):
        self.phases: dict[str, float] = {}
        self._started = self._mark = IMPORTED_AT

    def mark(self, phase: str) -> None:
        now = time.perf_counter()
        self.phases[phase], self._mark = now - self._mark, now

    def record(self) -> dict:
        return {"event": "startup", "seconds_to_first_batch": self._mark - self._started, "phases": self.phases}


# An epoch record's ``time`` keys: EpochPhases' own, then those the trainer adds after the epoch.
EPOCH_PHASES = ("wait", "prepare", "train", "sync", "validate", "commit")


class EpochPhases:
    """Host seconds of an epoch's phases: ``wait`` for a buffer state's edges, ``prepare`` them (mapping,
    moving, shuffling), ``train`` (the runner queueing and running batches), ``sync`` (waiting for the
    devices at the end). The epoch's record adds ``validate`` and ``commit`` after it."""

    def __init__(self):
        self.seconds = dict.fromkeys(EPOCH_PHASES[:4], 0.0)
        self._mark = time.perf_counter()

    def add(self, phase: str) -> None:
        """The time since the last mark was spent in ``phase``."""
        now = time.perf_counter()
        self.seconds[phase] = self.seconds.get(phase, 0.0) + now - self._mark
        self._mark = now
