"""Relation parameters kept in step across trainers by all-reduce, while they train.

Every trainer updates its own copy of the relation parameters (small: R x d).
A thread per trainer exchanges the changes every
``distributed.relation_sync_seconds``: it all-reduces (sums) each trainer's
change since the last exchange, so every trainer's updates reach every copy, as
a parameter server would apply them (averaging copies instead would divide the
relations' progress by the number of trainers). The training thread adds the
resulting correction at its next bucket boundary (never during an optimizer
step), so updates made since the snapshot are kept. The threads of all trainers
run the same number of rounds: each round also sums a "finished the epoch"
flag, and they stop together once every trainer has finished. The epoch then
ends with one exact exchange, so every trainer (and the checkpoint) holds the
same relations. Optimizer state (Adagrad's sums) stays per trainer.

The changes travel as host tensors over gloo, also between GPUs: an NCCL
all-reduce left waiting on the GPU for a peer (whose training thread has not
reached a bucket boundary) would block every device-wide synchronize and copy
of this trainer, and two trainers could wait on each other that way.
"""

from __future__ import annotations

import threading

import torch
import torch.distributed as dist


class RelationExchange:
    def __init__(self, parameters: list[torch.nn.Parameter], group: dist.ProcessGroup, world_size: int,
                 interval_seconds: float):
        self.parameters, self.group, self.world_size = parameters, group, world_size
        self.interval = interval_seconds
        self.rounds = 0
        self._finished = threading.Event()
        self._applied = threading.Event()
        self._correction: torch.Tensor | None = None
        self._reference: torch.Tensor | None = None  # the value every trainer agreed on at the last exchange
        self._thread: threading.Thread | None = None
        self.error: BaseException | None = None

    def _flat(self) -> torch.Tensor:
        return torch.cat([p.detach().reshape(-1).float().cpu() for p in self.parameters])

    def _add(self, delta: torch.Tensor) -> None:
        offset = 0
        with torch.no_grad():
            for p in self.parameters:
                p.add_(delta[offset:offset + p.numel()].view_as(p).to(p.device, p.dtype))
                offset += p.numel()

    def start_epoch(self) -> None:
        if not self.parameters:  # (a decoder without relation parameters: nothing to exchange)
            return
        self._reference = self._flat()  # equal on every trainer: the last epoch ended with an exchange
        self._finished.clear()
        self._applied.set()
        self._thread = threading.Thread(target=self._run, name="relation-exchange", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while True:
                finished = self._finished.wait(self.interval)
                self._applied.wait()  # the last correction is in the parameters before the next snapshot
                snapshot = self._flat()
                message = torch.cat([snapshot - self._reference, torch.tensor([1.0 if finished else 0.0])])
                dist.all_reduce(message, group=self.group)
                self.rounds += 1
                if int(message[-1].item()) == self.world_size:  # every trainer finished: stop together
                    return
                self._reference = self._reference + message[:-1]
                # (also once this trainer has finished: finish_epoch applies it)
                self._applied.clear()
                self._correction = self._reference - snapshot
        except BaseException as error:  # noqa: BLE001 - surfaced by apply_pending / finish_epoch
            self.error = error
            self._applied.set()

    def apply_pending(self) -> None:
        """At a bucket boundary: add the last round's correction, if one is waiting."""
        if self.error is not None:
            raise RuntimeError(f"exchanging relations across trainers failed: {self.error!r}") from self.error
        if self._correction is not None and not self._applied.is_set():
            self._add(self._correction)
            self._correction = None
            self._applied.set()

    def finish_epoch(self) -> None:
        """Wait until every trainer has finished the epoch, then exchange exactly once more."""
        if not self.parameters:
            return
        self._finished.set()
        while self._thread.is_alive():
            self.apply_pending()
            self._thread.join(0.01)
        if self.error is not None:
            raise RuntimeError(f"exchanging relations across trainers failed: {self.error!r}") from self.error
        self._correction = None
        current = self._flat()
        change = current - self._reference
        dist.all_reduce(change, group=self.group)
        self._add(self._reference + change - current)
