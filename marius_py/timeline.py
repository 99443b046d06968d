"""Where an out-of-core epoch's time goes, buffer state by buffer state (``marius-py plot`` draws it).

For every state: ``wait`` (seconds from the end of the previous state's training to this state's
edges being ready: swap reads not finished yet, the negative cache's read, commits between states),
``train`` (seconds of its batches, the devices synchronized), its edges, and the partition bytes read
and written meanwhile (write-backs finish asynchronously and count when they finish).
"""

from __future__ import annotations

import time
from collections.abc import Callable


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
                          "read": io["bytes_read"] + io["cache_bytes_read"] - self._io["bytes_read"]
                          - self._io["cache_bytes_read"],
                          "written": io["bytes_written"] - self._io["bytes_written"]})
        self._mark, self._io = now, io
