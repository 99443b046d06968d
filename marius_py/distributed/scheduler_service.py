"""The bucket scheduler (``orderings.scheduler``) served by rank 0 over torch.distributed's store.

A request is a ticket: the trainer takes the next number from the store's
counter (``add``, atomic), writes its message under that number, and waits for
the reply under the key it names (its rank, channel and request number: a
trainer's training thread, its write-back thread and its thread asking for the
next grant while a span trains ask on channels of their own). Rank 0's server
thread handles the tickets in number order, so the scheduler sees one request
at a time. Send orders (``BucketScheduler.next_send``) need no request: the
server publishes each trainer's in sequence under keys of their own
(``send/EPOCH/TRAINER/N``), and a finishing order once the epoch has no bucket
left to grant; the trainer's sender thread reads them in turn. Every grant and
write-back report is appended to ``scheduler.jsonl`` in the leader's run
directory: the log the tests check (every bucket once per epoch, and the
partitions handed over).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path

import torch.distributed as dist

from marius_py.orderings.scheduler import BucketScheduler, Grant, Send

POLL_SECONDS = (0.001, 0.02)  # the server looks for the next ticket this often, backing off while idle
                              # (a store wait that times out leaves a TCPStore client's socket out of
                              # step, so it polls with check())
RETRY_SECONDS = 0.005          # a trainer given no bucket asks again after this pause


class SchedulerServer:
    """Rank 0's thread answering the trainers' requests, one epoch's ``BucketScheduler`` at a time (``begin_epoch``
    starts it: every trainer waits for that before it asks)."""

    def __init__(self, store: dist.Store, num_partitions: int, seed: int, log_path: Path, capacity: int = 2,
                 world_size: int = 1):
        self.store, self.num_partitions, self.seed, self.capacity = store, num_partitions, seed, capacity
        self.world_size = world_size
        self.log_path = log_path
        self.scheduler: BucketScheduler | None = None
        self.epoch = 0
        self.error: BaseException | None = None
        self._published: dict[int, int] = {}  # trainer -> send orders published this epoch
        self._finish_published = False
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="bucket-scheduler", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        ticket, pause = 1, POLL_SECONDS[0]
        try:
            while not self._stop.is_set():
                key = f"ticket/{ticket}"
                if not self.store.check([key]):
                    time.sleep(pause)
                    pause = min(pause * 2, POLL_SECONDS[1])
                    continue
                pause = POLL_SECONDS[0]
                message = json.loads(self.store.get(key))
                reply = self._handle(message)
                self.store.set(message["reply"], json.dumps(reply))
                self.store.delete_key(key)
                ticket += 1
        except BaseException as error:  # noqa: BLE001 - reported to rank 0's trainer by check()
            self.error = error

    def begin_epoch(self, epoch: int, locations: dict[int, int] | None = None) -> None:
        """The epoch's scheduler: every partition at ``locations`` (the trainer whose store has it), its random
        choices seeded by the run's seed and the epoch. Called between epochs, when no trainer asks."""
        with self._lock:
            self.epoch = epoch
            buckets = [(i, j) for i in range(self.num_partitions) for j in range(self.num_partitions)]
            self.scheduler = BucketScheduler(self.num_partitions, buckets, seed=self.seed * 1_000_003 + epoch,
                                             capacity=self.capacity, locations=dict(locations or {}))
            self._published, self._finish_published = {}, False

    def _handle(self, message: dict) -> dict:
        with self._lock:
            return self._answer(message)

    def _answer(self, message: dict) -> dict:
        trainer, epoch = message["trainer"], message["epoch"]
        if epoch != self.epoch:
            raise RuntimeError(f"trainer {trainer} asked for epoch {epoch} while the scheduler serves {self.epoch}")
        if message["op"] == "written":
            self.scheduler.written(trainer, message["partitions"])
            self._log({"epoch": epoch, "trainer": trainer, "written": message["partitions"]})
            return {}
        grant = self.scheduler.acquire(trainer, ahead=message["op"] == "acquire_ahead")
        if grant.bucket is not None or grant.write_back:
            self._log({"epoch": epoch, "trainer": trainer, "bucket": grant.bucket, "together": grant.together,
                       "read": grant.read, "sources": grant.sources, "write_back": grant.write_back,
                       "finished": grant.finished})
        self._publish_sends()
        return {"bucket": grant.bucket, "together": grant.together, "read": grant.read,
                "sources": grant.sources, "write_back": grant.write_back, "finished": grant.finished}

    def _publish_sends(self) -> None:
        """Every send order the last grant made, under its trainer's next key; once no bucket is left, a
        finishing order for every trainer (after its last send)."""
        for trainer in sorted(self.scheduler.sends):
            while (order := self.scheduler.next_send(trainer)) is not None:
                self._publish(trainer, {"partition": order.partition, "destination": order.destination})
        if self.scheduler.done and not self._finish_published:
            for trainer in range(self.world_size):
                self._publish(trainer, {"finished": True})
            self._finish_published = True

    def _publish(self, trainer: int, order: dict) -> None:
        number = self._published.get(trainer, 0)
        self.store.set(send_key(self.epoch, trainer, number), json.dumps(order))
        self._published[trainer] = number + 1



    def _log(self, record: dict) -> None:
        with open(self.log_path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps({**record, "time": time.time()}) + "\n")

    def check(self) -> None:
        if self.error is not None:
            raise RuntimeError(f"the bucket scheduler (rank 0) failed: {self.error!r}") from self.error

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


class SchedulerClient:
    """A trainer's side: ``acquire`` its next bucket, report partitions ``written`` back. One per thread
    (each on its own store connection and ``channel``)."""

    def __init__(self, store: dist.Store, trainer: int, alive: Callable[[], None] | None = None,
                 channel: str = "train"):
        """``alive``: raises if the scheduler failed; given, the reply is polled for and ``alive`` checked
        meanwhile (rank 0, whose own scheduler thread may have died), else waited for."""
        self.store, self.trainer, self._requests, self.alive = store, trainer, 0, alive
        self.channel = channel

    def _ask(self, message: dict) -> dict:
        self._requests += 1
        reply_key = f"reply/{self.trainer}/{self.channel}/{self._requests}"
        message = {**message, "trainer": self.trainer, "reply": reply_key}
        ticket = self.store.add("tickets", 1)
        self.store.set(f"ticket/{ticket}", json.dumps(message))
        if self.alive is not None:
            while not self.store.check([reply_key]):
                self.alive()
                time.sleep(POLL_SECONDS[0])
        try:
            reply = json.loads(self.store.get(reply_key))
        except RuntimeError as error:
            raise RuntimeError(f"trainer {self.trainer}: no answer from the bucket scheduler on rank 0 "
                               f"({error}); rank 0 stopped or is unreachable") from error
        self.store.delete_key(reply_key)
        return reply

    def acquire(self, epoch: int, between_tries: Callable[[], None] | None = None, ahead: bool = False
                ) -> Grant:
        """The next bucket of ``epoch`` (asking again while none is free, calling ``between_tries`` before
        each new try); ``Grant.bucket`` is None when the epoch has none left for this trainer, or with
        partitions to write back before asking again.
        ``ahead``: asked while the last grant still trains (``BucketScheduler.acquire``), once: an empty
        grant means none is free now."""
        while True:
            reply = self._ask({"op": "acquire_ahead" if ahead else "acquire", "epoch": epoch})
            grant = Grant(None if reply["bucket"] is None else tuple(reply["bucket"]), tuple(reply["read"]),
                          tuple(reply["write_back"]), reply["finished"],
                          tuple(tuple(b) for b in reply["together"]), tuple(reply["sources"]))
            if grant.bucket is not None or grant.finished or grant.write_back or ahead:
                return grant
            time.sleep(RETRY_SECONDS)
            if between_tries is not None:
                between_tries()

    def written(self, epoch: int, partitions) -> None:
        self._ask({"op": "written", "epoch": epoch, "partitions": sorted(int(p) for p in partitions)})

    def next_send(self, epoch: int, number: int, between_tries: Callable[[], None] | None = None) -> Send | None:
        """This trainer's ``number``-th send order of ``epoch``, once published (None: the epoch's last)."""
        key, pause = send_key(epoch, self.trainer, number), POLL_SECONDS[0]
        while not self.store.check([key]):
            if between_tries is not None:
                between_tries()
            time.sleep(pause)
            pause = min(pause * 2, POLL_SECONDS[1])
        order = json.loads(self.store.get(key))
        self.store.delete_key(key)
        return None if order.get("finished") else Send(order["partition"], order["destination"])


def send_key(epoch: int, trainer: int, number: int) -> str:
    return f"send/{epoch}/{trainer}/{number}"
