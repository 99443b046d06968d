"""Stages as threads joined by bounded queues, with at most ``staleness_bound`` items in flight.

An item is admitted by ``submit`` only while fewer than ``staleness_bound``
items are in flight, and it leaves the count only after the last stage has
finished with it (for training: after its update is applied). So a batch's
compute reads embeddings that miss at most ``staleness_bound - 1`` earlier
batches' updates; bound 1 is synchronous.

Any exception in a stage stops the pipeline: every thread exits, the items in
flight are dropped, and the next ``submit``/``drain``/``close`` raises the
original exception with the stage named in a note. ``close`` (or leaving the
``with`` block) first waits for the items in flight. ``inline=True`` runs every
stage in the caller's thread at ``submit`` (no threads; for debugging and for
devices whose own queue already overlaps the work).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

_POLL_SECONDS = 0.05
_STOP = object()


@dataclass
class Stage:
    name: str
    run: Callable[[Any], Any]   # item -> item for the next stage (the last stage's result is dropped)
    threads: int = 1


class Pipeline:
    """Runs items through ``stages`` in order; ``submit`` items, ``drain`` to wait for them all."""

    def __init__(self, stages: list[Stage], staleness_bound: int, queue_size: int = 0, inline: bool = False):
        if staleness_bound < 1:
            raise ValueError(f"staleness_bound must be >= 1, got {staleness_bound}")
        if not stages or any(stage.threads < 1 for stage in stages):
            raise ValueError("a pipeline needs at least one stage, each with at least one thread")
        self.stages = stages
        self.staleness_bound = staleness_bound
        self.inline = inline
        self.max_in_flight = 0      # the most items ever in flight at once (instrumentation)
        self.completed = 0
        self._in_flight = 0
        self._lock = threading.Condition()
        self._error: BaseException | None = None
        self._stopping = threading.Event()
        # Default queue size: the bound itself, so a queue never blocks an admitted item for long.
        size = queue_size or staleness_bound
        self._queues = [queue.Queue(maxsize=size) for _ in stages]
        self._threads: list[threading.Thread] = []
        if not inline:
            for index, stage in enumerate(stages):
                for number in range(stage.threads):
                    thread = threading.Thread(target=self._work, args=(index,), daemon=True,
                                              name=f"pipeline-{stage.name}-{number}")
                    thread.start()
                    self._threads.append(thread)

    # ---- the caller's side ----
    def submit(self, item: Any) -> None:
        """Admit ``item`` once fewer than ``staleness_bound`` are in flight (blocks until then).

        Raises a stage's error, or RuntimeError once the pipeline is closed:
        an item is either admitted and run, or refused loudly.
        """
        with self._lock:
            while self._in_flight >= self.staleness_bound and self._error is None:
                self._lock.wait(_POLL_SECONDS)
            self._raise_if_failed()
            if self._stopping.is_set():
                raise RuntimeError("submit to a closed pipeline")
            self._in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self._in_flight)
        if self.inline:
            self._run_inline(item)
        elif not self._put(0, item):  # a stage failed while this item waited for room
            with self._lock:
                self._in_flight -= 1
                self._raise_if_failed()
                raise RuntimeError("submit to a closed pipeline")

    def drain(self) -> None:
        """Wait until every admitted item has left the last stage; raise a stage's error."""
        with self._lock:
            while self._in_flight > 0 and self._error is None:
                self._lock.wait(_POLL_SECONDS)
            self._raise_if_failed()

    def close(self) -> None:
        """Finish the items in flight, stop the threads, and re-raise a stage's error."""
        try:
            self.drain()
        finally:
            self._stop_threads()

    def _stop_threads(self) -> None:
        self._stopping.set()
        for thread in self._threads:
            thread.join()
        self._threads = []

    def __enter__(self) -> Pipeline:
        return self

    def __exit__(self, kind, value, traceback) -> None:
        if kind is not None:  # already failing: stop without masking that error
            self._stop_threads()
            return
        self.close()

    # ---- the stages' side ----
    def _run_inline(self, item: Any) -> None:
        for stage in self.stages:
            try:
                item = stage.run(item)
            except BaseException as error:
                self._fail(error, stage.name)
                with self._lock:
                    self._raise_if_failed()
        self._finish()

    def _work(self, index: int) -> None:
        stage, inbox = self.stages[index], self._queues[index]
        last = index == len(self.stages) - 1
        while not self._stopping.is_set():
            try:
                item = inbox.get(timeout=_POLL_SECONDS)
            except queue.Empty:
                continue
            try:
                result = stage.run(item)
            except BaseException as error:
                self._fail(error, stage.name)
                return
            if last:
                self._finish()
            elif not self._put(index + 1, result):
                return

    def _put(self, index: int, item: Any) -> bool:
        """Queue ``item`` for stage ``index``; False once the pipeline is stopping."""
        while not self._stopping.is_set():
            try:
                self._queues[index].put(item, timeout=_POLL_SECONDS)
                return True
            except queue.Full:
                continue
        return False

    def _finish(self) -> None:
        with self._lock:
            self._in_flight -= 1
            self.completed += 1
            self._lock.notify_all()

    def _fail(self, error: BaseException, stage: str) -> None:
        with self._lock:
            if self._error is None:
                if hasattr(error, "add_note"):
                    error.add_note(f"(raised in pipeline stage {stage!r})")
                self._error = error
            self._stopping.set()
            self._lock.notify_all()

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise self._error
