"""A trainer's partition write-backs, reported to the scheduler behind its training.

The buffer writes a released partition to this trainer's store on its writer
thread; this thread waits for each write, logs how long the trainer held the
partition, counts it among the partitions the store holds, and only then tells
rank 0's scheduler (on a store connection and channel of its own), so the
partition is sent on no earlier than it is written, while this trainer already
reads and trains its next grant.
"""

from __future__ import annotations

import json
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from marius_py.distributed.hand_over import Holdings
from marius_py.distributed.scheduler_service import SchedulerClient


class WriteBacks:
    def __init__(self, client: SchedulerClient, holds_log: Path, holdings: Holdings):
        self.client, self.holds_log, self.holdings = client, holds_log, holdings
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="write-back-report")
        self._pending: list[Future] = []

    def submit(self, epoch: int, held_since: dict[int, float], writes: list[Future]) -> None:
        """Report the partitions of ``held_since`` (partition -> when it was read) once ``writes`` are done."""
        self.check()
        self._pending.append(self._pool.submit(self._report, epoch, held_since, writes))

    def _report(self, epoch: int, held_since: dict[int, float], writes: list[Future]) -> None:
        for write in writes:
            write.result()
        written = time.time()
        with open(self.holds_log, "a", encoding="utf-8") as handle:
            for partition, since in sorted(held_since.items()):
                handle.write(json.dumps({"epoch": epoch, "partition": int(partition), "from": since,
                                         "to": written}) + "\n")
        self.holdings.written(held_since)
        self.client.written(epoch, sorted(held_since))

    def check(self) -> None:
        """Raise the error of a finished report (a failed write, or the scheduler gone)."""
        for future in [f for f in self._pending if f.done()]:
            self._pending.remove(future)
            future.result()

    def wait(self) -> None:
        """Until every write-back is in the store and reported (the end of an epoch)."""
        while self._pending:
            self._pending.pop(0).result()

    def close(self) -> None:
        self._pool.shutdown(wait=True)
